"""The difficulty-spread task: bands, a held-out split disjoint from the train split, determinism, the banded
reward's per-band metrics, and the CLI's ``--task spread``."""

import collections

import pytest

from demo.spread_task import BANDS, band_counts, banded_sum_reward, spread_splits


def test_bands_shares_and_prompt_shapes():
    train, held_out = spread_splits(2000, 200, seed=0)
    assert len(train) == 2000 and len(held_out) == 200
    assert collections.Counter(train["band"]) == {"easy": 500, "medium": 800, "hard": 700}
    assert band_counts(200) == [50, 80, 70]
    digits = {"easy": (1, 1), "medium": (2, 1), "hard": (3, 3)}
    for row in train.select(range(300)):
        left, right = row["prompt"].rstrip("=").split("+")
        assert (len(left), len(right)) == digits[row["band"]] and int(left) + int(right) == row["answer"]
    assert sum(band.share for band in BANDS) == pytest.approx(1.0)


def test_held_out_prompts_are_never_in_the_train_split():
    train, held_out = spread_splits(2000, 200, seed=3)
    assert not set(train["prompt"]) & set(held_out["prompt"])
    assert len(set(held_out["prompt"])) == len(held_out)  # distinct held-out prompts


def test_splits_are_deterministic_in_the_seed():
    first, second, other = spread_splits(500, 60, seed=1), spread_splits(500, 60, seed=1), spread_splits(500, 60, 2)
    assert first[0]["prompt"] == second[0]["prompt"] and first[1]["prompt"] == second[1]["prompt"]
    assert first[0]["prompt"] != other[0]["prompt"]


def test_too_many_held_out_prompts_for_a_band_is_refused():
    with pytest.raises(ValueError, match="num_eval"):
        spread_splits(100, 500, seed=0)  # 125 easy held-out prompts of the 100 that exist


def test_banded_reward_logs_accuracy_and_tied_groups_per_band():
    logged = collections.defaultdict(list)
    prompts = ["1+2="] * 2 + ["12+3="] * 2 + ["100+200="] * 2
    completions = ["3", "3", "15", "14", "1", "2"]
    rewards = banded_sum_reward(
        completions,
        prompts,
        answer=[3, 3, 15, 15, 300, 300],
        band=["easy"] * 2 + ["medium"] * 2 + ["hard"] * 2,
        log_metric=lambda name, value: logged[name].append(value),
    )
    assert rewards == [1.0, 1.0, 1.0, 0.0, 0.0, 0.0]
    assert logged["spread/easy/all_right_frac"] == [1.0] and logged["spread/hard/all_wrong_frac"] == [1.0]
    assert logged["spread/medium/accuracy"] == [0.5] and logged["spread/medium/all_wrong_frac"] == [0.0]
    assert logged["spread/all_wrong_group_frac"] == [pytest.approx(1 / 3)]
    assert logged["spread/all_right_group_frac"] == [pytest.approx(1 / 3)]


def test_cli_task_spread_evaluates_on_the_held_out_split(tmp_path):
    from demo.train_cli import run
    from trl_zerostd import ZeroStdGRPOConfig, ZeroStdGRPOTrainer

    argv = [
        "--output_dir", str(tmp_path), "--task", "spread", "--max_steps", "2", "--warm_start_steps", "5",
        "--num_prompts", "64", "--num_eval_prompts", "12", "--per_device_train_batch_size", "16",
        "--eval_strategy", "steps", "--eval_steps", "2", "--num_generations_eval", "2",
        "--per_device_eval_batch_size", "24", "--max_completion_length", "6", "--plot", "false",
    ]  # fmt: skip
    trainer = run(ZeroStdGRPOTrainer, ZeroStdGRPOConfig, argv)
    _, held_out = spread_splits(64, 12, seed=trainer.args.seed)
    assert trainer.eval_dataset["prompt"] == held_out["prompt"]
    assert not set(trainer.train_dataset["prompt"]) & set(held_out["prompt"])
    evaluation = next(entry for entry in trainer.state.log_history if "eval_reward" in entry)
    assert {f"eval_spread/{band.name}/accuracy" for band in BANDS} <= set(evaluation)
    assert any("spread/all_wrong_group_frac" in entry for entry in trainer.state.log_history)
