"""Tests of ``trl_zerostd/skipping.py``: outcomes per group, the per-prompt history, the exploration probabilities."""

import pytest
import torch

from trl_zerostd.sampling import PromptStream
from trl_zerostd.skipping import MAX_STREAK, ExploreProbs, Outcome, PromptHistory, PromptSkipper, group_outcomes

LOW, HIGH, INFO = int(Outcome.ALL_LOW), int(Outcome.ALL_HIGH), int(Outcome.INFORMATIVE)


def test_group_outcomes_binary_verifier():
    rewards = torch.tensor([0.0, 0.0, 1.0, 1.0, 0.0, 1.0, float("nan"), float("nan")])
    valid = torch.ones(8, dtype=torch.bool)
    outcomes = group_outcomes(rewards, valid, 2, 1e-6, (0.0, 1.0))
    assert outcomes.tolist() == [LOW, HIGH, INFO, LOW]  # no valid row: all-low


def test_group_outcomes_continuous_rewards_take_the_nearer_end():
    rewards = torch.tensor([0.3, 0.3, 0.8, 0.8, 0.5, 9.0])
    valid = torch.tensor([True, True, True, True, True, False])  # last group: one valid row, zero-variance
    assert group_outcomes(rewards, valid, 2, 1e-6, (0.0, 1.0)).tolist() == [LOW, HIGH, LOW]


def test_history_counts_outcomes_in_a_row():
    history = PromptHistory.empty(3)
    history.record([0, 1, 0], torch.tensor([HIGH, LOW, HIGH]))
    assert history.kind.tolist() == [HIGH, LOW, 0] and history.streak.tolist() == [2, 1, 0]
    history.record([0, 1], torch.tensor([INFO, LOW]))
    assert history.kind.tolist() == [INFO, LOW, 0] and history.streak.tolist() == [1, 2, 0]
    for _ in range(MAX_STREAK + 5):
        history.record([2], torch.tensor([LOW]))
    assert int(history.streak[2]) == MAX_STREAK


def test_draw_prob_is_p_to_the_streak_with_a_floor():
    history = PromptHistory.empty(4)
    history.record([0, 1, 1, 2, 2, 2], torch.tensor([INFO, LOW, LOW, HIGH, HIGH, HIGH]))
    probs = ExploreProbs(target=0.25, min_draw_prob=0.05, all_low=0.5, all_high=0.4).draw_prob(
        history, torch.arange(4)
    )
    torch.testing.assert_close(probs, torch.tensor([1.0, 0.25, 0.064, 1.0], dtype=torch.float64))
    history.record([2] * 10, torch.tensor([HIGH] * 10))
    assert ExploreProbs(0.25, 0.05, all_high=0.4).draw_prob(history, torch.tensor([2])).item() == 0.05


def test_explore_probs_adapt_per_kind_toward_the_target_and_stay_in_bounds():
    probs = ExploreProbs(target=0.5, min_draw_prob=0.05)
    outcomes = torch.tensor([HIGH, HIGH, HIGH, LOW, INFO, INFO, INFO, INFO])  # high 3/8 > 1/4, low 1/8 <= 1/4
    probs.adapt(outcomes)
    assert probs.all_high == pytest.approx(0.49) and probs.all_low == pytest.approx(0.51)
    for _ in range(200):
        probs.adapt(outcomes)
    assert (probs.all_high, probs.all_low) == (0.05, 1.0)


def test_floor_keeps_a_prompt_zero_variance_forever_drawable_at_the_floor_rate():
    """Every prompt all-correct at the maximal streak: each pass still draws about min_draw_prob of them."""
    rows, floor = 2000, 0.05
    history = PromptHistory.empty(rows)
    history.kind[:], history.streak[:] = HIGH, MAX_STREAK
    probs = ExploreProbs(target=0.25, min_draw_prob=floor)
    stream = PromptStream(rows, seed=0)
    drawn, skipped = stream.draw(200, lambda candidates: probs.draw_prob(history, candidates))
    assert len(drawn) == 200
    assert 200 / (200 + skipped) == pytest.approx(floor, abs=0.015)


def test_rows_sharing_a_key_share_one_history():
    """Keys pool rows: outcomes of row 0 ("hard") set the draw probability of row 2, never drawn, of the same key."""
    skipper = PromptSkipper.new(4, target=0.25, min_draw_prob=0.05, keys=["hard", "easy", "hard", "easy"])
    assert skipper.slots.tolist() == [0, 1, 0, 1] and len(skipper.history.kind) == 2
    skipper.record([0, 0, 0], torch.tensor([LOW, LOW, LOW]))
    p = skipper.explore.all_low
    probs = skipper.draw_prob(torch.tensor([2, 1, 3]))
    assert probs.tolist() == pytest.approx([max(p**3, 0.05), 1.0, 1.0])
    per_row = PromptSkipper.new(4, target=0.25, min_draw_prob=0.05)
    per_row.record([0], torch.tensor([LOW]))
    assert per_row.slots is None and per_row.draw_prob(torch.tensor([2])).tolist() == [1.0]
