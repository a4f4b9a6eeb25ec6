"""Each seed's target, from the baseline's held-out gain."""

import pytest

from studies.time_to_accuracy_metrics import targets


def run(arm: str, seed: int, rewards: list[float]) -> dict:
    return {"arm": arm, "seed": seed, "eval": [[step * 5, reward] for step, reward in enumerate(rewards)]}


def test_the_target_is_the_start_plus_a_fraction_of_the_baseline_s_gain():
    records = [run("trl", 0, [0.1, 0.3, 0.5, 0.7]), run("trl", 1, [0.2, 0.4, 0.4, 0.4]), run("other", 0, [0.0, 1.0])]
    assert targets(records, 0.9) == pytest.approx({0: 0.1 + 0.9 * 0.5, 1: 0.2 + 0.9 * 0.2})  # final: last two's mean


def test_a_baseline_that_does_not_rise_fails_naming_its_seed():
    with pytest.raises(ValueError, match="trl-g4's held-out reward does not rise on seed 3"):
        targets([run("trl-g4", 3, [0.3, 0.2, 0.3, 0.3])], 0.9, baseline="trl-g4")
