"""Tests of ``trl_zerostd/predictors.py``: the per-prompt history, the streak's exploration probabilities and its
controller."""

import pytest
import torch

from trl_zerostd.predictors import MAX_STREAK, SHARE_DECAY, ExploreProbs, Outcome, PromptHistory
from trl_zerostd.sampling import PromptStream

LOW, HIGH, INFO = int(Outcome.ALL_LOW), int(Outcome.ALL_HIGH), int(Outcome.INFORMATIVE)


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


def settled_share(groups: int, target: float, share_decay: float, batches: int = 1200) -> tuple[float, ExploreProbs]:
    """The controller alone against a population 20% informative, 40% all-low, 40% all-high, each zero-variance
    kind drawn in proportion to its p: the mean zero-variance share of the second half of the batches."""
    generator = torch.Generator().manual_seed(0)
    probs = ExploreProbs(target=target, min_draw_prob=0.05, share_decay=share_decay)
    shares = []
    for _ in range(batches):
        weights = torch.tensor([0.2, 0.4 * probs.all_low, 0.4 * probs.all_high])
        outcomes = torch.multinomial(weights / weights.sum(), groups, replacement=True, generator=generator)
        probs.adapt(outcomes)
        shares.append((outcomes != INFO).float().mean().item())
    return sum(shares[batches // 2 :]) / (batches - batches // 2), probs


@pytest.mark.parametrize("groups", [4, 8])
def test_the_controller_reaches_its_target_with_small_batches(groups):
    """Steered by one batch's share (0 or at least 1/groups), p drifts: the share settles well above a target of
    0.25, and above the lowest reachable at target 0. Steered by the decayed share (the default) it settles at the
    target, and at target 0 both p reach the floor (the lowest share this population allows is 0.167)."""
    decayed, _ = settled_share(groups, 0.25, SHARE_DECAY)
    one_batch, _ = settled_share(groups, 0.25, 0.0)
    assert abs(decayed - 0.25) < 0.035 and one_batch > 0.3
    lowest, floor = settled_share(groups, 0.0, SHARE_DECAY)
    drifted, _ = settled_share(groups, 0.0, 0.0)
    assert floor.all_low == floor.all_high == 0.05 and lowest < 0.18 and drifted > lowest + 0.02
