"""Tests of ``trl_zerostd/success_rate.py``: the beta-binomial and the rate predictors."""

import pytest
import torch

from trl_zerostd.predictors import PRIOR_DECAY, Outcome
from trl_zerostd.skipping import PromptSkipper
from trl_zerostd.success_rate import (
    RATE_PRIOR_ROWS,
    SuccessRates,
    informative_prob,
)


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


def record_groups(predictor, slots: list[int], successes: list[float], group_size: int = 8) -> None:
    """One generation batch of whole groups: ``successes`` right of ``group_size`` in each slot's group."""
    right = torch.tensor(successes, dtype=torch.float64)
    outcomes = torch.where(
        right == 0,
        int(Outcome.ALL_LOW),
        torch.where(right == group_size, int(Outcome.ALL_HIGH), int(Outcome.INFORMATIVE)),
    )
    predictor.record(torch.tensor(slots), outcomes, right, torch.full((len(slots),), float(group_size)))


def test_the_success_rate_is_checkpointed_and_a_mismatch_is_refused():
    def skipper(predictor):
        return PromptSkipper.new(6, 0.25, 0.05, prior_groups=list("aabbcc"), predictor=predictor, group_size=8)

    trained = skipper("success_rate")
    trained.record(
        [0, 2, 4], torch.tensor([0, 1, 2]), torch.tensor([3.0, 0.0, 8.0], dtype=torch.float64), torch.full((3,), 8.0)
    )
    restored = skipper("success_rate")
    restored.load_state_dict(trained.state_dict())
    assert torch.equal(restored.draw_prob(torch.arange(6)), trained.draw_prob(torch.arange(6)))
    assert restored.draw_prob(torch.arange(6)).tolist() != [1.0] * 6
    for other in ("streak",):
        with pytest.raises(ValueError, match="success rates do not match"):
            skipper(other).load_state_dict(trained.state_dict())
        with pytest.raises(ValueError, match="success rates do not match"):
            skipper("success_rate").load_state_dict(skipper(other).state_dict())
    with pytest.raises(ValueError, match="needs the rows of a group"):
        PromptSkipper.new(6, 0.25, 0.05, predictor="success_rate")


def test_a_prompts_beta_is_its_groups_rate_weighing_four_rows_plus_its_own_decayed_counts():
    """What per-prompt budgets read as a prompt's prior (``SuccessRates.beta``, ``PromptSkipper.success_prior``)."""
    skipper = PromptSkipper.new(3, 0.25, 0.05, prior_groups=["a", "a", "b"], predictor="success_rate", group_size=4)
    skipper.record([0, 0], torch.zeros(2, dtype=torch.long), torch.tensor([0.0, 1.0], dtype=torch.float64),
                   torch.tensor([4.0, 4.0], dtype=torch.float64))  # fmt: skip
    a, b = skipper.success_prior([0, 1, 2])  # group "a": rate (1 + 1) / (8 + 2); slot 0: 1 success of 6 decayed rows
    torch.testing.assert_close(a, torch.tensor([0.8 + 1.0, 0.8, 2.0], dtype=torch.float64))
    torch.testing.assert_close(b, torch.tensor([3.2 + 5.0, 3.2, 2.0], dtype=torch.float64))
    streak = PromptSkipper.new(3, 0.25, 0.05, predictor="streak")
    assert streak.success_prior([0]) is None
    hashed = PromptSkipper.streaming(0.25, 0.05, num_slots=8, predictor="success_rate", group_size=4)
    hashed.record([9], torch.zeros(1, dtype=torch.long), torch.tensor([4.0], dtype=torch.float64),
                  torch.tensor([4.0], dtype=torch.float64))  # fmt: skip
    a, b = hashed.success_prior([9, 17])  # 17 shares 9's slot but not its history: the group prior alone
    assert a[0] > a[1] and b[0] == b[1]  # 9's own 4 successes, none for 17
