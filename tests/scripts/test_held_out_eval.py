"""The sampled held-out evaluation (scripts/demo/held_out_eval.py): on TRL's schedule, TRL's own evaluation off, its
metrics in entries of their own, and no effect on training (its sampling runs under a forked RNG)."""

import pytest
import torch


def spread_run(tmp_path, *flags):
    from demo.train_cli import run
    from trl_zerostd import ZeroStdGRPOConfig, ZeroStdGRPOTrainer

    argv = [
        "--output_dir", str(tmp_path), "--task", "spread", "--max_steps", "4", "--warm_start_steps", "5",
        "--num_prompts", "64", "--num_eval_prompts", "12", "--per_device_train_batch_size", "16",
        "--max_completion_length", "6", "--plot", "false", *flags,
    ]  # fmt: skip
    return run(ZeroStdGRPOTrainer, ZeroStdGRPOConfig, argv)


EVAL = ["--eval_strategy", "steps", "--eval_steps", "2", "--eval_on_start", "true", "--num_generations_eval", "2",
        "--per_device_eval_batch_size", "24"]  # fmt: skip


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    plain = spread_run(tmp_path_factory.mktemp("plain"))
    sampled = spread_run(tmp_path_factory.mktemp("sampled"), *EVAL, "--eval_by_sampling", "true")
    return plain, sampled


def test_evaluates_on_trls_schedule_with_trls_own_evaluation_off(runs):
    _, sampled = runs
    evaluations = [entry for entry in sampled.state.log_history if "eval_reward" in entry]
    assert [entry["step"] for entry in evaluations] == [0, 2, 4]
    assert sampled.args.eval_strategy == "no" and sampled.eval_dataset is None
    for entry in evaluations:
        assert 0.0 <= entry["eval_reward"] <= 1.0
        assert {"eval_spread/easy/accuracy", "eval_spread/hard/accuracy"} <= set(entry)
        assert "reward" not in entry and "loss" not in entry  # training metrics stay in the step's own entry
    trained = [entry for entry in sampled.state.log_history if "reward" in entry]
    assert len(trained) == 4 and all(not any(key.startswith("eval_") for key in entry) for entry in trained)


def test_evaluation_does_not_change_training(runs):
    plain, sampled = runs

    def rewards(trainer):
        return [entry["reward"] for entry in trainer.state.log_history if "reward" in entry]

    assert rewards(sampled) == rewards(plain)
    for (name, a), (_, b) in zip(plain.model.named_parameters(), sampled.model.named_parameters(), strict=True):
        assert torch.equal(a, b), name
