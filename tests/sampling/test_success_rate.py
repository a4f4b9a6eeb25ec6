"""Tests of ``trl_zerostd/sampling/success_rate.py``: the beta-binomial, the success rates and the stuck mixture."""

import pytest
import torch

from trl_zerostd.sampling.success_rate import (
    PRIOR_DECAY,
    RATE_PRIOR_ROWS,
    STUCK_PRIOR,
    Outcome,
    SuccessRates,
    informative_prob,
    stuck_prob,
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
    """Slots 0, 1, 2 got 4, 7 and 0 right of 8; slot 3 was never drawn. Slot 0 is the likeliest to split again, slot
    2 (tied once) the least; a never-drawn prompt may be stuck (``STUCK_PRIOR``), a prompt that split is not."""
    rates = SuccessRates.new(8, 4)
    record_binary(
        rates, torch.tensor([0, 1, 2]), torch.tensor([4.0, 7.0, 0.0], dtype=torch.float64), torch.full((3,), 8.0)
    )
    informative = rates.informative_prob(torch.arange(4))
    assert informative[0] > informative[1] > informative[3] > informative[2]
    probs = rates.draw_prob(torch.arange(4), min_draw_prob=0.05)
    assert probs[0] == probs[1] == probs[3] == 1.0 and 0.05 < probs[2] < 0.5
    group_rate = (11 + 1) / (24 + 2)  # Laplace's rule over the group's rows
    torch.testing.assert_close(rates.group_rates(), torch.tensor([group_rate], dtype=torch.float64))
    prior = RATE_PRIOR_ROWS * group_rate
    expected = informative_prob(torch.tensor([prior + 7]), torch.tensor([RATE_PRIOR_ROWS - prior + 1]), 8)
    torch.testing.assert_close(informative[1:2], expected)  # split: not stuck, its Beta's alone
    fresh = informative_prob(torch.tensor([prior]), torch.tensor([RATE_PRIOR_ROWS - prior]), 8)
    torch.testing.assert_close(informative[3:], (1 - STUCK_PRIOR) * fresh)


def test_a_new_group_halves_the_weight_of_a_prompts_earlier_ones():
    rates = SuccessRates.new(8, 2)
    for successes in (8.0, 8.0, 0.0):
        record_binary(rates, torch.tensor([0]), torch.tensor([successes], dtype=torch.float64), torch.tensor([8.0]))
    assert rates.successes[0].item() == (8 / 2 + 8) / 2 == 6.0  # the documented halving, not SUCCESS_DECAY's value
    assert rates.rows[0].item() == (8 / 2 + 8) / 2 + 8 == 14.0
    record_binary(rates, torch.tensor([1, 0]), torch.tensor([3.0, 0.0], dtype=torch.float64), torch.tensor([0.0, 0.0]))
    assert rates.rows[1].item() == 0.0 and rates.rows[0].item() == 14.0  # no valid row: nothing changes


def test_a_never_drawn_prompt_is_drawn_by_its_groups_rate_relative_to_the_best():
    """Groups "a" (every row right, 8 then 40 rows), "b" (half right), "c" (none yet): a never-drawn prompt of "b" is
    drawn always, of "c" (rate 0.5 before any row) always, of "a" by its rate 9/10 (one group of evidence: the
    beta-binomial's ratio to b's, squared), then at the floor once "a" has 40 rows right; counts decay per batch."""
    rates = SuccessRates.new(8, 6, ["a", "a", "b", "b", "c", "c"])
    record_binary(rates, torch.tensor([0, 2]), torch.tensor([8.0, 4.0], dtype=torch.float64), torch.tensor([8.0, 8.0]))
    probs = rates.draw_prob(torch.tensor([1, 3, 5]), min_draw_prob=0.05)
    fresh = informative_prob(torch.tensor([4 * 0.9, 4 * 0.5]), torch.tensor([4 * 0.1, 4 * 0.5]), 8)
    assert probs.tolist() == pytest.approx([(fresh[0] / fresh[1]).item() ** 2, 1.0, 1.0])
    rates.group_counts[0] = torch.tensor([40.0, 40.0], dtype=torch.float64)
    assert rates.draw_prob(torch.tensor([1]), min_draw_prob=0.05).item() == 0.05
    rates.group_counts[0] = torch.tensor([8.0, 8.0], dtype=torch.float64)
    record_binary(rates, torch.tensor([2]), torch.tensor([0.0], dtype=torch.float64), torch.tensor([8.0]))
    expected = [8 * PRIOR_DECAY, 8 * PRIOR_DECAY, 4 * PRIOR_DECAY, 8 * PRIOR_DECAY + 8, 0.0, 0.0]
    assert rates.group_counts.view(-1).tolist() == pytest.approx(expected)


def test_a_group_no_longer_drawn_returns_toward_half_and_is_drawn_again():
    """The real-model study's failure: a level judged from two all-wrong groups was drawn at the floor, so its counts
    only decayed and its rate (a ratio) stayed 0 for the rest of the run. With the group prior the rate climbs back
    toward 0.5 as the evidence ages, and a never-drawn prompt of it is drawn again, while a group measured all wrong
    batch after batch stays at the floor."""
    rates = SuccessRates.new(8, 6, ["starved", "starved", "hopeless", "hopeless", "half", "half"])
    half = torch.tensor([4.0, 4.0], dtype=torch.float64)  # "half": 4 of 8 right in every batch, the best group
    record_binary(
        rates,
        torch.tensor([0, 0, 2, 2, 4, 4]),
        torch.cat([torch.zeros(4, dtype=torch.float64), half]),
        torch.full((6,), 8.0),
    )
    first = rates.draw_prob(torch.tensor([1, 3]), min_draw_prob=0.05)
    assert first.max() < 0.1
    for _ in range(30):  # 30 batches: "hopeless" measured all wrong in each, "starved" not drawn
        record_binary(
            rates,
            torch.tensor([2, 2, 4, 4]),
            torch.cat([torch.zeros(2, dtype=torch.float64), half]),
            torch.full((4,), 8.0),
        )
    starved, hopeless, _ = rates.group_rates().tolist()
    assert hopeless < 0.02 and 0.35 < starved < 0.5
    later = rates.draw_prob(torch.tensor([1, 3]), min_draw_prob=0.05)
    assert later[0] > 0.5 and later[1] == 0.05


def binary_outcomes(successes: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """``Outcome`` of groups of a binary reward: all-low with no success, all-high with every row right."""
    return torch.where(
        successes == 0,
        int(Outcome.ALL_LOW),
        torch.where(successes == rows, int(Outcome.ALL_HIGH), int(Outcome.INFORMATIVE)),
    )


def record_binary(rates: SuccessRates, slots: torch.Tensor, successes: torch.Tensor, rows: torch.Tensor) -> None:
    rates.record(slots, binary_outcomes(successes, rows.double()), successes, rows)


def test_the_success_rates_are_checkpointed_and_a_mismatch_is_refused():
    rates = SuccessRates.new(8, 6, list("aabbcc"))
    record_binary(
        rates, torch.tensor([0, 2, 4]), torch.tensor([3.0, 0.0, 8.0], dtype=torch.float64), torch.full((3,), 8.0)
    )
    restored = SuccessRates.new(8, 6, list("aabbcc"))
    restored.load_state_dict(rates.state_dict())
    assert torch.equal(restored.draw_prob(torch.arange(6), 0.05), rates.draw_prob(torch.arange(6), 0.05))
    assert restored.draw_prob(torch.arange(6), 0.05).tolist() != [1.0] * 6
    for other in (SuccessRates.new(8, 6), SuccessRates.new(8, 5, list("aabbc"))):
        with pytest.raises(ValueError, match="success rates do not match"):
            other.load_state_dict(rates.state_dict())


def test_a_checkpoint_keeps_the_rates_each_slot_was_recorded_at_and_one_without_them_weighs_its_evidence_fully():
    """After the group's rate moved, the restored predictor draws as the saved one (the recorded rates travel); a
    checkpoint without them takes the group's rate at the checkpoint: weight 1 until it moves."""
    rates = SuccessRates.new(8, 4, list("aabb"))
    rates.evidence_fade = 1.0  # the fade studied in issue 70 (the package's is 0)
    record_binary(rates, torch.tensor([0, 2]), torch.tensor([0.0, 8.0], dtype=torch.float64), torch.full((2,), 8.0))
    record_binary(rates, torch.tensor([1]), torch.tensor([6.0], dtype=torch.float64), torch.full((1,), 8.0))
    assert rates.evidence_weights(torch.tensor([0]))[1].item() < 0.5  # its failures, as the rate rose
    restored = SuccessRates.new(8, 4, list("aabb"))
    restored.evidence_fade = 1.0  # the fade studied in issue 70 (the package's is 0)
    restored.load_state_dict(rates.state_dict())
    assert torch.equal(restored.draw_prob(torch.arange(4), 0.05), rates.draw_prob(torch.arange(4), 0.05))
    old = {name: value for name, value in rates.state_dict().items() if name != "recorded_rates"}
    restored.load_state_dict(old)
    assert [weights.tolist() for weights in restored.evidence_weights(torch.arange(4))] == [[1.0] * 4] * 2


def test_evidence_weights_fade_failures_as_the_rate_rises_and_successes_as_it_falls():
    """Slot 0 recorded when its group's rate was 0.1, slot 1 at 0.75, slot 2 at the rate it has now; the group's rate
    is now 0.25: slot 0's failures weigh the odds ratio of 1/9 and 1/3 (1/3), slot 1's successes that of 3 and 1/3
    (1/9), the rest 1. With ``evidence_fade`` 2, squared."""
    rates = SuccessRates.new(8, 3)
    rates.evidence_fade = 1.0  # the fade studied in issue 70 (the package's is 0)
    rates.group_counts[0] = torch.tensor([9.5, 40.0], dtype=torch.float64)  # (9.5 + 1) / (40 + 2) = 0.25
    rates.recorded_rates = torch.tensor([0.1, 0.75, 0.25], dtype=torch.float64)
    successes, failures = rates.evidence_weights(torch.arange(3))
    torch.testing.assert_close(successes, torch.tensor([1.0, 1 / 9, 1.0], dtype=torch.float64))
    torch.testing.assert_close(failures, torch.tensor([1 / 3, 1.0, 1.0], dtype=torch.float64))
    rates.evidence_fade = 2.0
    torch.testing.assert_close(rates.evidence_weights(torch.arange(3))[0], successes**2)
    torch.testing.assert_close(rates.evidence_weights(torch.arange(3))[1], failures**2)


def test_weighed_evidence_weighs_successes_failures_and_each_side_of_the_ties_by_their_weights():
    """Slot 0: 2 right of 8 and all-wrong ties of 6 rows; slot 1: 8 right of 8, all right; rate then 0.1 and 0.75,
    now 0.25, as above."""
    rates = SuccessRates.new(8, 2)
    rates.evidence_fade = 1.0  # the fade studied in issue 70 (the package's is 0)
    rates.group_counts[0] = torch.tensor([9.5, 40.0], dtype=torch.float64)
    rates.recorded_rates = torch.tensor([0.1, 0.75], dtype=torch.float64)
    rates.successes, rates.rows = torch.tensor([2.0, 8.0]), torch.tensor([8.0, 8.0])
    rates.one_sided = torch.tensor([-6.0, 8.0])
    successes, rows, one_sided = rates.weighed_evidence(torch.arange(2))
    torch.testing.assert_close(successes, torch.tensor([2.0, 8 / 9], dtype=torch.float64))
    torch.testing.assert_close(rows, torch.tensor([2.0 + 6 / 3, 8 / 9], dtype=torch.float64))
    torch.testing.assert_close(one_sided, torch.tensor([-6 / 3, 8 / 9], dtype=torch.float64))


def test_a_new_group_lands_on_the_earlier_evidence_weighed_as_it_stood():
    """Slot 0 tied all wrong (8 rows), then its group's rate moved to 0.25: its next group (4 right of 8) is added to
    the earlier evidence weighed by ``evidence_weights``, not to that evidence at full weight again."""
    rates = SuccessRates.new(8, 2)
    rates.evidence_fade = 1.0  # the fade studied in issue 70 (the package's is 0)
    record_binary(rates, torch.tensor([0]), torch.tensor([0.0], dtype=torch.float64), rows(1))
    rates.group_counts[0] = torch.tensor([9.5, 40.0], dtype=torch.float64)  # rate 0.25
    weight = rates.evidence_weights(torch.tensor([0]))[1].item()  # its failures: the rate rose
    assert 0 < weight < 0.9
    record_binary(rates, torch.tensor([0]), torch.tensor([4.0], dtype=torch.float64), rows(1))
    assert rates.rows[0].item() == pytest.approx(0.5 * weight * 8 + 8)
    assert rates.successes[0].item() == pytest.approx(4.0)
    assert rates.one_sided[0].item() == pytest.approx(-8 * weight) and rates.split[0]


def rows(num_groups: int) -> torch.Tensor:
    return torch.full((num_groups,), 8.0)


def test_a_prompt_stuck_while_its_level_was_out_of_reach_is_drawn_again_once_the_levels_rate_rises():
    """Two levels of two prompts, and a level "half" whose one prompt gets 4 of 8 right in every batch. Four batches
    in which the others tie all wrong put both prompts of "rising" and of "flat" at the floor. Then the other prompt
    of "rising" gets 6 of 8 right for 20 batches, while "flat" keeps tying all wrong: the stuck prompt of "rising" is
    drawn again (its evidence weighs the odds ratio of its level's rate then and now), the one of "flat" stays at
    the floor. Without the fade (``evidence_fade`` 0) both stay there."""
    floor = 0.05
    for fade, expected_rising in ((1.0, True), (0.0, False)):
        rates = SuccessRates.new(8, 5, ["rising", "rising", "flat", "flat", "half"])
        rates.evidence_fade = fade
        half = torch.tensor([4.0], dtype=torch.float64)  # "half": 4 of 8 right in every batch, the best group
        for _ in range(4):
            record_binary(rates, torch.arange(5), torch.cat([torch.zeros(4, dtype=torch.float64), half]), rows(5))
        assert rates.draw_prob(torch.tensor([0, 2]), floor).tolist() == [floor, floor]
        for _ in range(20):
            record_binary(
                rates, torch.tensor([1, 3, 4]), torch.cat([torch.tensor([6.0, 0.0]), half]).double(), rows(3)
            )
        rising, flat = rates.draw_prob(torch.tensor([0, 2]), floor).tolist()
        assert flat == floor
        assert (rising > 0.5) is expected_rising, (fade, rising)


def test_a_prompts_beta_is_its_groups_rate_weighing_four_rows_plus_its_own_decayed_counts():
    rates = SuccessRates.new(4, 3, ["a", "a", "b"])
    record_binary(rates, torch.tensor([0, 0]), torch.tensor([0.0, 1.0], dtype=torch.float64), torch.tensor([4.0, 4.0]))
    a, b = rates.beta(
        torch.tensor([0, 1, 2])
    )  # group "a": rate (1 + 1) / (8 + 2); slot 0: 1 success of 6 decayed rows
    torch.testing.assert_close(a, torch.tensor([0.8 + 1.0, 0.8, 2.0], dtype=torch.float64))
    torch.testing.assert_close(b, torch.tensor([3.2 + 5.0, 3.2, 2.0], dtype=torch.float64))


def beta_alone_draw_prob(rates: SuccessRates, slots: torch.Tensor, min_draw_prob: float) -> torch.Tensor:
    """The draw probability from the success rate's ``Beta`` alone, without the stuck mixture: what the predictor drew
    by before ``stuck_prob``."""
    group_rates = rates.group_rates()
    best = informative_prob(RATE_PRIOR_ROWS * group_rates, RATE_PRIOR_ROWS * (1 - group_rates), rates.group_size).max()
    return ((informative_prob(*rates.beta(slots), rates.group_size) / best) ** 2).clamp(min_draw_prob, 1.0)


@pytest.mark.parametrize("group_size", [4, 8])
@pytest.mark.parametrize("prior_column", [False, True])
def test_a_prompt_that_ties_in_every_group_falls_to_the_floor_within_a_few_groups(group_size, prior_column):
    """A quarter of the prompts all wrong in every group, a quarter all right, half split (half right). By the
    success rate's Beta alone the tied ones stay above 0.3 (their own evidence halves with every group and never
    outweighs the prior of 4 rows); with the stuck mixture they reach the floor by their fourth group, with their
    own level in a prior column or without one."""
    floor = 0.05
    rates = SuccessRates.new(group_size, 4, ["wrong", "right", "split", "split"] if prior_column else None)
    rows = torch.full((4,), float(group_size))
    successes = torch.tensor([0.0, group_size, group_size / 2, group_size / 2], dtype=torch.float64)
    probs = []
    for _ in range(4):
        record_binary(rates, torch.arange(4), successes, rows)
        probs.append(rates.draw_prob(torch.arange(2), floor))
    assert probs[-1].tolist() == [floor, floor]
    assert all((earlier >= later).all() for earlier, later in zip(probs, probs[1:]))
    if not prior_column:
        assert (beta_alone_draw_prob(rates, torch.arange(2), floor) > 0.3).all()  # what it drew by before


@pytest.mark.parametrize("group_size", [4, 8])
@pytest.mark.parametrize("every", [5, 10])
@pytest.mark.parametrize("overall_rate", [0.2, 0.5])
def test_a_prompt_that_splits_one_group_in_five_or_ten_is_drawn_at_least_as_before(group_size, every, overall_rate):
    """A prompt that splits (one right) one group in ``every`` and ties all wrong in between, among prompts solved at
    ``overall_rate``: after each of its groups it is drawn at least as often as by its success rate's Beta alone."""
    rates = SuccessRates.new(group_size, 2)
    rows = torch.full((2,), float(group_size))
    for group in range(3 * every):
        right = 1.0 if group % every == 0 else 0.0
        record_binary(rates, torch.tensor([0]), torch.tensor([right], dtype=torch.float64), rows[:1])
        rates.group_counts[0] = torch.tensor([40 * overall_rate, 40.0], dtype=torch.float64)
        new, before = rates.draw_prob(torch.tensor([0]), 0.05), beta_alone_draw_prob(rates, torch.tensor([0]), 0.05)
        assert new.item() >= before.item()
    assert before.item() < 1.0  # the comparison is not at the cap


def test_one_sided_counts_the_rows_of_ties_on_one_side_until_a_split():
    rates = SuccessRates.new(4, 3)
    record_binary(
        rates, torch.tensor([0, 1, 2]), torch.tensor([0.0, 4.0, 2.0], dtype=torch.float64), torch.full((3,), 4.0)
    )
    record_binary(rates, torch.tensor([0, 1]), torch.tensor([0.0, 0.0], dtype=torch.float64), torch.tensor([3.0, 4.0]))
    assert rates.one_sided[0].item() == -7.0 and rates.split.tolist() == [False, True, True]
    record_binary(rates, torch.tensor([0]), torch.tensor([1.0], dtype=torch.float64), torch.tensor([0.0]))
    assert rates.one_sided[0].item() == -7.0  # a group with no valid row changes nothing
    rates.clear(torch.tensor([1]))
    assert rates.one_sided[1].item() == 0.0 and not rates.split[1]


def test_stuck_prob_is_the_mixtures_posterior():
    """Prior Beta(2, 2): 8 rows all wrong have probability B(2, 10) / B(2, 2) = 6 / 110 under the rate model."""
    a, b = torch.tensor([2.0, 2.0, 2.0, 2.0]), torch.tensor([2.0, 2.0, 2.0, 2.0])
    got = stuck_prob(a, b, torch.tensor([0.0, -8.0, 8.0, -8.0]), torch.tensor([False, False, False, True]))
    variable = (1 - STUCK_PRIOR) * 6 / 110
    expected = [STUCK_PRIOR, STUCK_PRIOR / (STUCK_PRIOR + variable), STUCK_PRIOR / (STUCK_PRIOR + variable), 0.0]
    torch.testing.assert_close(got, torch.tensor(expected, dtype=torch.float64))
