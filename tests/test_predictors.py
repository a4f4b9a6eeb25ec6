"""Tests of ``trl_zerostd/predictors.py``: the per-prompt history, the streak's exploration probabilities and its
controller, the beta-binomial and the success-rate predictor."""

import pytest
import torch

from trl_zerostd.predictors import (
    MAX_STREAK,
    PRIOR_DECAY,
    RATE_PRIOR_ROWS,
    SHARE_DECAY,
    ExploreProbs,
    Outcome,
    PromptHistory,
    SuccessRates,
    informative_prob,
)
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


@pytest.mark.parametrize("a, b", [(1.0, 1.0), (0.3, 2.5), (4.0, 0.6), (12.0, 12.0)])
def test_informative_prob_is_the_beta_binomials(a, b):
    """Against the mean of 1 - q**8 - (1-q)**8 over 2M draws of q ~ Beta(a, b) (standard error below 4e-4)."""
    torch.manual_seed(0)
    q = torch.distributions.Beta(torch.tensor(a, dtype=torch.float64), torch.tensor(b)).sample((2_000_000,))
    expected = (1 - q**8 - (1 - q) ** 8).mean()
    got = informative_prob(torch.tensor([a]), torch.tensor([b]), 8)
    torch.testing.assert_close(got, expected.view(1), atol=2e-3, rtol=0)


def test_informative_prob_of_a_known_rate_is_the_binomials():
    """A rate known to be 0.5 (Beta with a huge weight): 1 - 2 * 0.5**8; one known to be 0.9: 1 - 0.9**8 - 0.1**8."""
    got = informative_prob(torch.tensor([1e7, 9e7]), torch.tensor([1e7, 1e7]), 8)
    torch.testing.assert_close(got, torch.tensor([1 - 2 * 0.5**8, 1 - 0.9**8 - 0.1**8], dtype=torch.float64))


def test_success_rates_rank_a_half_solved_prompt_above_a_nearly_solved_and_a_never_solved_one():
    """Slots 0, 1, 2 got 4, 7 and 0 right of 8; slot 3 was never drawn. The streak predictor sees slots 0 and 1 alike
    (informative); the success rate draws slot 0 always, slot 1 less than a never-drawn prompt, slot 2 least."""
    rates = SuccessRates.new(8, 4)
    rates.record(torch.tensor([0, 1, 2]), torch.tensor([4.0, 7.0, 0.0], dtype=torch.float64), torch.full((3,), 8.0))
    informative = rates.informative_prob(torch.arange(4))
    assert informative[0] > informative[3] > informative[1] > informative[2]
    probs = rates.draw_prob(torch.arange(4), min_draw_prob=0.05)
    assert probs[0] == probs[3] == 1.0 and 0.05 < probs[2] < probs[1] < 1.0
    group_rate = (11 + 1) / (24 + 2)  # Laplace's rule over the group's rows
    torch.testing.assert_close(rates.group_rates(), torch.tensor([group_rate], dtype=torch.float64))
    prior = RATE_PRIOR_ROWS * group_rate
    expected = informative_prob(torch.tensor([prior + 7]), torch.tensor([RATE_PRIOR_ROWS - prior + 1]), 8)
    torch.testing.assert_close(informative[1:2], expected)


def test_a_new_group_halves_the_weight_of_a_prompts_earlier_ones():
    rates = SuccessRates.new(8, 2)
    for successes in (8.0, 8.0, 0.0):
        rates.record(torch.tensor([0]), torch.tensor([successes], dtype=torch.float64), torch.tensor([8.0]))
    assert rates.successes[0].item() == (8 / 2 + 8) / 2 == 6.0  # the documented halving, not SUCCESS_DECAY's value
    assert rates.rows[0].item() == (8 / 2 + 8) / 2 + 8 == 14.0
    rates.record(torch.tensor([1, 0]), torch.tensor([3.0, 0.0], dtype=torch.float64), torch.tensor([0.0, 0.0]))
    assert rates.rows[1].item() == 0.0 and rates.rows[0].item() == 14.0  # no valid row: nothing changes


def test_a_never_drawn_prompt_is_drawn_by_its_groups_rate_relative_to_the_best():
    """Groups "a" (every row right, 8 then 40 rows), "b" (half right), "c" (none yet): a never-drawn prompt of "b" is
    drawn always, of "c" (rate 0.5 before any row) always, of "a" by its rate 9/10 (one group of evidence: the
    beta-binomial's ratio to b's, squared), then at the floor once "a" has 40 rows right; counts decay per batch."""
    rates = SuccessRates.new(8, 6, ["a", "a", "b", "b", "c", "c"])
    rates.record(torch.tensor([0, 2]), torch.tensor([8.0, 4.0], dtype=torch.float64), torch.tensor([8.0, 8.0]))
    probs = rates.draw_prob(torch.tensor([1, 3, 5]), min_draw_prob=0.05)
    fresh = informative_prob(torch.tensor([4 * 0.9, 4 * 0.5]), torch.tensor([4 * 0.1, 4 * 0.5]), 8)
    assert probs.tolist() == pytest.approx([(fresh[0] / fresh[1]).item() ** 2, 1.0, 1.0])
    rates.group_counts[0] = torch.tensor([40.0, 40.0], dtype=torch.float64)
    assert rates.draw_prob(torch.tensor([1]), min_draw_prob=0.05).item() == 0.05
    rates.group_counts[0] = torch.tensor([8.0, 8.0], dtype=torch.float64)
    rates.record(torch.tensor([2]), torch.tensor([0.0], dtype=torch.float64), torch.tensor([8.0]))
    expected = [8 * PRIOR_DECAY, 8 * PRIOR_DECAY, 4 * PRIOR_DECAY, 8 * PRIOR_DECAY + 8, 0.0, 0.0]
    assert rates.group_counts.view(-1).tolist() == pytest.approx(expected)


def test_a_group_no_longer_drawn_returns_toward_half_and_is_drawn_again():
    """The real-model study's failure: a level judged from two all-wrong groups was drawn at the floor, so its counts
    only decayed and its rate (a ratio) stayed 0 for the rest of the run. With the group prior the rate climbs back
    toward 0.5 as the evidence ages, and a never-drawn prompt of it is drawn again, while a group measured all wrong
    batch after batch stays at the floor."""
    rates = SuccessRates.new(8, 6, ["starved", "starved", "hopeless", "hopeless", "half", "half"])
    half = torch.tensor([4.0, 4.0], dtype=torch.float64)  # "half": 4 of 8 right in every batch, the best group
    rates.record(
        torch.tensor([0, 0, 2, 2, 4, 4]), torch.cat([torch.zeros(4, dtype=torch.float64), half]), torch.full((6,), 8.0)
    )
    first = rates.draw_prob(torch.tensor([1, 3]), min_draw_prob=0.05)
    assert first.max() < 0.1
    for _ in range(30):  # 30 batches: "hopeless" measured all wrong in each, "starved" not drawn
        rates.record(
            torch.tensor([2, 2, 4, 4]), torch.cat([torch.zeros(2, dtype=torch.float64), half]), torch.full((4,), 8.0)
        )
    starved, hopeless, _ = rates.group_rates().tolist()
    assert hopeless < 0.02 and 0.35 < starved < 0.5
    later = rates.draw_prob(torch.tensor([1, 3]), min_draw_prob=0.05)
    assert later[0] > 0.5 and later[1] == 0.05
