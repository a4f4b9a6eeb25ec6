"""The checks of prompt skipping's decisions (scripts/studies/skip_checks.py) on a record written by hand: a skip is
checked against the last evaluation at or before its step, drawn groups by their own rewards, and a prompt that ties
then splits is followed to its next draw."""

import json

import pytest

from studies.skip_checks import SkipChecksArguments, check_run, main, outcome

NAN = float("nan")


def record(arm="skip-rate-kf", seed=0) -> dict:
    """Steps 1 to 4 (indices 0 to 3), evaluations after 0 and 2 updates, groups of 2."""
    return {
        "arm": arm,
        "seed": seed,
        "train_groups": [
            [0, {"a": [0.0, 0.0], "b": [1.0, 1.0], "c": [0.0, 1.0]}],
            [2, {"a": [0.0, 1.0], "b": [1.0, 1.0], "c": [NAN, 1.0]}],
        ],  # fmt: skip
        "prompt_skips": [[], ["a", "b"], ["c"], ["a"]],
        "prompt_rewards": [
            {"a": [0.0, 0.0], "c": [0.0, 1.0, 1.0, 1.0]},
            {"c": [1.0, 0.0]},
            {"b": [1.0, 1.0]},
            {"a": [0.0, 1.0]},
        ],  # fmt: skip
    }


def test_outcome_names_split_and_both_ties():
    assert [outcome(r) for r in ([0.0, 1.0], [1.0, 1.0], [0.0, 0.0], [NAN, NAN])] == [
        "split", "all right", "all wrong", "all wrong",
    ]  # fmt: skip


def test_skips_are_checked_against_the_last_evaluation_at_or_before_them():
    checks = check_run(record())
    # index 1: a (all wrong at 0), b (all right at 0); index 2: c (at 2: one finite reward, a tie); index 3: a (split)
    assert checks.skips == {"split": 1, "all right": 2, "all wrong": 1}
    # drawn groups of 2: a tied wrong, c split then tied right, c split, b tied right, a split
    assert checks.drawn == {"split": 3, "all right": 2, "all wrong": 1}
    assert checks.train_split_frac == [(0, pytest.approx(1 / 3)), (2, pytest.approx(1 / 3))]
    assert checks.comeback_waits == [1]  # a: tied at 0, split at 2, drawn again at index 3


def test_the_report_leaves_out_records_without_train_groups_and_names_them(tmp_path, capsys):
    (tmp_path / "skip-rate-kf-seed0.json").write_text(json.dumps(record()))
    old = record(seed=1)
    del old["train_groups"]
    (tmp_path / "skip-rate-kf-seed1.json").write_text(json.dumps(old))
    levels = {"a": "1", "b": "1", "c": "2"}
    out = main(SkipChecksArguments(runs_dir=str(tmp_path), arms=["skip-rate-kf"], seeds=[0, 1]), lambda seed: levels)
    assert "| skip-rate-kf seed 0 | 4 |" in out
    # level 1: a all wrong (split at the later probe), b all right, a split; level 2: c tied right
    assert (
        "| skip-rate-kf seed 0 | 1 | 1 / 1 / 1 | 1 / 0 |" in out
        and "| skip-rate-kf seed 0 | 2 | 0 / 1 / 0 | 0 / 0 |" in out
    )
    assert "Left out (run before --eval_train_groups): skip-rate-kf seed 1" in out
