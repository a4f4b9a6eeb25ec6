"""The sampled held-out evaluation (scripts/demo/held_out_eval.py): on TRL's schedule, TRL's own evaluation off, its
metrics in entries of their own, and no effect on training (its sampling runs under a forked RNG); with
--eval_train_groups, a group of every train prompt at each evaluation, again without effect on training."""

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
    probed = spread_run(tmp_path_factory.mktemp("probed"), *EVAL, "--eval_by_sampling", "true",
                        "--eval_train_groups", "true")  # fmt: skip
    return plain, sampled, probed


def test_evaluates_on_trls_schedule_with_trls_own_evaluation_off(runs):
    _, sampled, _ = runs
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
    plain, sampled, probed = runs

    def rewards(trainer):
        return [entry["reward"] for entry in trainer.state.log_history if "reward" in entry]

    for evaluated in (sampled, probed):
        assert rewards(evaluated) == rewards(plain)
        for (name, a), (_, b) in zip(plain.model.named_parameters(), evaluated.model.named_parameters(), strict=True):
            assert torch.equal(a, b), name


def held_out(trainer) -> list[dict]:
    return [{key: value for key, value in entry.items() if key != "eval_train_informative_frac"}
            for entry in trainer.state.log_history if "eval_reward" in entry]  # fmt: skip


def test_train_groups_sample_a_group_of_every_train_prompt_beside_the_held_out_samples(runs):
    """Each evaluation of --eval_train_groups: one group of num_generations rewards per train row, the share of
    groups that split logged, and the held-out evaluation as without it."""
    from demo.held_out_eval import SampledEvaluation, splits

    _, sampled, probed = runs
    (evaluation,) = [c for c in probed.callback_handler.callbacks if isinstance(c, SampledEvaluation)]
    assert sorted(evaluation.train_groups) == [0, 2, 4]
    logged = {entry["step"]: entry["eval_train_informative_frac"] for entry in probed.state.log_history
              if "eval_train_informative_frac" in entry}  # fmt: skip
    for step, groups in evaluation.train_groups.items():
        assert len(groups) == len(probed.train_dataset) and {len(g) for g in groups} == {probed.num_generations}
        assert logged[step] == sum(map(splits, groups)) / len(groups)
    assert len({tuple(map(tuple, groups)) for groups in evaluation.train_groups.values()}) == 3  # sampled anew
    assert held_out(probed) == held_out(sampled)


def test_splits_needs_two_finite_rewards_that_differ():
    from demo.held_out_eval import splits

    assert splits([0.0, 1.0, 1.0]) and not splits([1.0, 1.0]) and not splits([1.0, float("nan")])


def test_train_groups_without_the_sampled_evaluation_is_refused(tmp_path):
    with pytest.raises(ValueError, match="--eval_train_groups"):
        spread_run(tmp_path, "--eval_train_groups", "true")


def test_each_train_group_holds_one_prompts_samples(monkeypatch):
    """The probe's rows are each train prompt repeated num_generations times, in batches of whole groups: a stand-in
    sampler and scorer that score a row by its prompt give each group one prompt's score."""
    from types import SimpleNamespace

    from demo.held_out_eval import SampledEvaluation

    evaluation = SampledEvaluation.__new__(SampledEvaluation)
    evaluation.trainer = SimpleNamespace(num_generations=4, args=SimpleNamespace(seed=0))
    evaluation.batch_size, evaluation.train_groups = 6, {}  # 6 rows a batch: one whole group of 4 each
    evaluation.train_rows = [{"prompt": text} for text in ("a", "b", "c")]
    batches = []
    monkeypatch.setattr(evaluation, "_sample", lambda model, batch: batches.append(len(batch)) or [[0]] * len(batch))
    monkeypatch.setattr(evaluation, "_score", lambda batch, ids, logged: [float(ord(row["prompt"])) for row in batch])
    assert evaluation._probe_train_groups(torch.nn.Linear(1, 1), step=0) == 0.0  # every group tied
    assert evaluation.train_groups[0] == [[97.0] * 4, [98.0] * 4, [99.0] * 4] and batches == [4, 4, 4]
