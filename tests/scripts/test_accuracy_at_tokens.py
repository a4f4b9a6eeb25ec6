"""``scripts/studies/time_to_accuracy_metrics.accuracy_at_tokens``: held-out accuracy at a token budget, the measure
the stuck-prompts study (and the token-budget claims) read."""

import math

import pytest

from studies.accuracy_at_budget import lower_bound, paired_gains, summary
from studies.time_to_accuracy_metrics import accuracy_at_tokens, run_tokens


def record(tokens_per_step: list[float], evaluations: list[list[float]]) -> dict:
    cumulative = [sum(tokens_per_step[: i + 1]) for i in range(len(tokens_per_step))]
    steps = len(tokens_per_step)
    return {"num_tokens": cumulative, "eval": evaluations, "step_time": [1.0] * steps, "generation_s": [0.5] * steps}


def test_interpolates_in_tokens_between_evaluations_and_keeps_the_last_past_the_end():
    """Steps of 100, 300, 100, 500 tokens, evaluated at steps 0, 2 and 4 (0, 400 and 1000 tokens)."""
    run = record([100, 300, 100, 500], [[0, 0.2], [2, 0.6], [4, 0.3]])
    assert run_tokens(run) == 1000
    assert accuracy_at_tokens(run, 0) == 0.2
    assert accuracy_at_tokens(run, 100) == pytest.approx(0.2 + 0.4 * 100 / 400)  # in tokens, not steps
    assert accuracy_at_tokens(run, 400) == pytest.approx(0.6)
    assert accuracy_at_tokens(run, 700) == pytest.approx(0.6 - 0.3 * 300 / 600)
    assert accuracy_at_tokens(run, 5000) == 0.3  # past the run's end: its last evaluation


def test_paired_gains_and_their_lower_bound():
    """Per seed, accuracy at half of TRL's run tokens minus TRL's final (the mean of its last two evaluations)."""
    trl = [record([100, 100, 100, 100], [[0, 0.1], [2, 0.3], [4, 0.5]]), record([50] * 4, [[0, 0.1], [4, 0.7]])]
    ours = [record([100] * 4, [[0, 0.1], [2, 0.6], [4, 0.6]]), record([25] * 8, [[0, 0.1], [8, 0.3]])]
    assert paired_gains(ours, trl, 0.5) == pytest.approx([0.6 - 0.4, 0.2 - 0.4])  # 0.2: halfway to 0.3 in tokens
    assert lower_bound([0.1, 0.2, 0.3]) == pytest.approx(0.2 - 1.886 * 0.1 / 3**0.5)
    assert math.isnan(lower_bound([0.1]))
    assert summary([0.1, 0.2, 0.3]) == f"+0.200 ± 0.100 ({0.2 - 1.886 * 0.1 / 3**0.5:+.3f})"
    assert summary([-0.1]) == "-0.100"  # one seed: its difference, no spread


def test_paired_against_another_arm_subtracts_its_accuracy_at_the_same_tokens():
    """At half of TRL's 400 tokens (200), budgets by TRL's tokens on each seed: seed 0's arm has 0.6 at 200 of its
    400, the other arm 0.1 + (0.5 - 0.1) * 200 / 400 = 0.3; seed 1's arm is past its 100-token end at 0.2, the other
    arm at 0.4."""
    trl = [record([100] * 4, [[0, 0.1], [2, 0.3], [4, 0.5]]), record([100] * 4, [[0, 0.1], [4, 0.2]])]
    ours = [record([100] * 4, [[0, 0.1], [2, 0.6], [4, 0.6]]), record([25] * 4, [[0, 0.1], [4, 0.2]])]
    other = [record([200] * 4, [[0, 0.1], [2, 0.5], [4, 0.9]]), record([50] * 4, [[0, 0.1], [4, 0.4]])]
    assert paired_gains(ours, trl, 0.5, other) == pytest.approx([0.6 - 0.3, 0.2 - 0.4])
    assert paired_gains(ours, trl, 0.5) == pytest.approx([0.6 - 0.4, 0.2 - 0.15])  # without it: TRL's final


def test_tokens_counted_another_way_move_the_budget_and_a_record_without_them_is_left_out():
    """Completion tokens only: TRL's run makes 400 of them, so a third of its budget is 133 of the arm's."""
    from studies.accuracy_at_budget import counted_by

    trl = {**record([100, 300, 100, 500], [[0, 0.2], [2, 0.6], [4, 0.3]]), "completion_tokens": [100, 200, 300, 400]}
    arm = {**record([600, 600, 600, 600], [[0, 0.2], [2, 0.8], [4, 0.9]]), "completion_tokens": [50, 100, 150, 200]}
    budget = run_tokens(counted_by(trl, "completion_tokens")) / 3
    assert accuracy_at_tokens(counted_by(arm, "completion_tokens"), budget) == pytest.approx(
        0.8 + 0.1 * (budget - 100) / 100
    )
    assert accuracy_at_tokens(arm, run_tokens(trl) / 3) == pytest.approx(0.2 + 0.6 * (1000 / 3) / 1200)  # all tokens
    assert counted_by(record([1], [[0, 0.1]]), "completion_tokens") is None
