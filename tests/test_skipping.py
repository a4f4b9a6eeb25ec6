"""Tests of ``trl_zerostd/skipping.py``: outcomes per group, the per-prompt history, the exploration probabilities,
the success-rate predictor."""

import pytest
import torch

from trl_zerostd.sampling import PromptStream
from trl_zerostd.skipping import (
    MAX_STREAK,
    PRIOR_DECAY,
    RATE_PRIOR_ROWS,
    SHARE_DECAY,
    ExploreProbs,
    Outcome,
    PromptHistory,
    PromptSkipper,
    SuccessRates,
    group_outcomes,
    group_successes,
    history_key,
    informative_prob,
)

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


def test_history_key_is_stable_and_names_the_setting_for_non_json_values():
    conversation = [{"role": "user", "content": "2+3="}]
    assert history_key(conversation) == history_key([{"content": "2+3=", "role": "user"}]) > 0
    assert history_key("2+3=") != history_key("3+2=")
    assert history_key("2+3=") == 6407507801603917051  # the same in every process and run (not Python's hash)
    with pytest.raises(ValueError, match="skip_history_key"):
        history_key(object())


def test_streaming_history_is_bounded_and_counts_collisions():
    """Hashed slots: a key's history is found again; a key that lands on a slot another holds is drawn as never seen
    (the other's history is not applied to it), and recording it takes the slot over and counts an eviction."""
    skipper = PromptSkipper.streaming(target=0.25, min_draw_prob=0.05, num_slots=8)
    assert len(skipper.history.kind) == 8
    skipper.record([3, 3], torch.tensor([LOW, LOW]))
    p = skipper.explore.all_low
    assert skipper.draw_prob(torch.tensor([3, 4])).tolist() == pytest.approx([max(p**2, 0.05), 1.0])
    colliding = 3 + 8  # same slot as key 3
    assert skipper.draw_prob(torch.tensor([colliding])).tolist() == [1.0] and skipper.hashed.evictions == 0
    skipper.record([colliding], torch.tensor([HIGH]))
    assert skipper.hashed.evictions == 1
    assert skipper.draw_prob(torch.tensor([3])).tolist() == [1.0]  # 3's history is gone, not misapplied
    assert skipper.history.kind[3] == HIGH and skipper.history.streak[3] == 1
    restored = PromptSkipper.streaming(target=0.25, min_draw_prob=0.05, num_slots=8)
    restored.load_state_dict(skipper.state_dict())
    assert restored.hashed.evictions == 1 and restored.draw_prob(torch.tensor([colliding])).tolist() == pytest.approx(
        skipper.draw_prob(torch.tensor([colliding])).tolist()
    )


def test_a_history_of_another_size_is_refused_on_load():
    saved = PromptSkipper.new(4, target=0.25, min_draw_prob=0.05, keys=["a", "b", "a", "b"]).state_dict()
    with pytest.raises(ValueError, match="skip_history_key differs"):
        PromptSkipper.new(4, target=0.25, min_draw_prob=0.05).load_state_dict(saved)


def test_a_prior_draws_a_never_drawn_prompt_by_its_groups_rate():
    """Rows 0-5 in groups a, a, b, b, c, c. Group a: 2 of 4 outcomes informative, b: 1 of 4, c: 2 outcomes (too few
    to trust: counted as informative, the best rate). Never-drawn rows take their group's rate over the best; a row
    drawn before keeps its own history."""
    skipper = PromptSkipper.new(6, target=0.25, min_draw_prob=0.05, prior_groups=["a", "a", "b", "b", "c", "c"])
    outcomes = torch.tensor([INFO, INFO, HIGH, HIGH, INFO, LOW, LOW, LOW, LOW, LOW])
    skipper.record([0, 0, 0, 0, 2, 2, 2, 2, 4, 4], outcomes)
    assert skipper.prior.counts.tolist() == [[2.0, 4.0], [1.0, 4.0], [0.0, 2.0]]
    p_low, p_high = skipper.explore.all_low, skipper.explore.all_high
    probs = skipper.draw_prob(torch.arange(6))
    assert probs.tolist() == pytest.approx([p_high**2, 0.5, p_low**3, 0.25, p_low**2, 1.0])
    skipper.record([0, 0, 0, 0, 2, 2, 4, 4, 4], torch.tensor([LOW] * 4 + [INFO] + [LOW] * 4))  # counts decayed first
    decay = PRIOR_DECAY
    expected = [[2 * decay, 4 * decay + 4], [decay + 1, 4 * decay + 2], [0, 2 * decay + 3]]
    torch.testing.assert_close(skipper.prior.counts, torch.tensor(expected, dtype=torch.float64))
    rates = [informative / total for informative, total in expected]  # every group trusted now: b's is the best
    assert skipper.draw_prob(torch.tensor([1, 3, 5])).tolist() == pytest.approx([rates[0] / rates[1], 1.0, 0.05])


def test_a_prior_with_no_informative_group_yet_draws_every_prompt():
    skipper = PromptSkipper.new(4, target=0.25, min_draw_prob=0.05, prior_groups=["a", "a", "b", "b"])
    skipper.record([0, 0, 0, 0, 2, 2, 2, 2], torch.tensor([LOW] * 8))
    assert skipper.draw_prob(torch.tensor([1, 3])).tolist() == [1.0, 1.0]  # no group is better than another


def test_a_prior_is_checkpointed_and_a_mismatch_is_refused():
    skipper = PromptSkipper.new(4, target=0.25, min_draw_prob=0.05, prior_groups=["a", "a", "b", "b"])
    skipper.record([0, 0, 0, 0, 2], torch.tensor([INFO, LOW, LOW, LOW, INFO]))
    restored = PromptSkipper.new(4, target=0.25, min_draw_prob=0.05, prior_groups=["a", "a", "b", "b"])
    restored.load_state_dict(skipper.state_dict())
    assert torch.equal(restored.prior.counts, skipper.prior.counts)
    assert restored.draw_prob(torch.arange(4)).tolist() == skipper.draw_prob(torch.arange(4)).tolist()
    for other in (PromptSkipper.new(4, 0.25, 0.05), PromptSkipper.new(4, 0.25, 0.05, prior_groups=list("abcc"))):
        with pytest.raises(ValueError, match="skip_prior_key"):
            other.load_state_dict(skipper.state_dict())
    with pytest.raises(ValueError, match="not both"):
        PromptSkipper.new(4, 0.25, 0.05, keys=["a", "a", "b", "b"], prior_groups=["a", "a", "b", "b"])


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


# -- the success-rate predictor --------------------------------------------------------------------------------


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


def test_group_successes_rescale_rewards_and_leave_invalid_rows_out():
    rewards = torch.tensor([0.0, 1.0, 1.0, 1.0, 2.0, 0.5, float("nan"), 2.0])
    valid = torch.tensor([True, True, True, False, True, True, True, True])
    successes, rows = group_successes(rewards, valid, 4, (0.0, 2.0))
    assert successes.tolist() == [1.0, 1.0 + 0.25 + 1.0] and rows.tolist() == [3.0, 3.0]
    empty_range, _ = group_successes(rewards, valid, 4, (1.0, 1.0))
    assert empty_range.tolist() == [0.0, 0.0]


def test_success_rates_rank_a_half_solved_prompt_above_a_nearly_solved_and_a_never_solved_one():
    """Slots 0, 1, 2 got 4, 7 and 0 right of 8; slot 3 was never drawn. The streak predictor sees slots 0 and 1 alike
    (informative); the success rate draws slot 0 always, slot 1 less than a never-drawn prompt, slot 2 least."""
    rates = SuccessRates.new(8, 4)
    rates.record(torch.tensor([0, 1, 2]), torch.tensor([4.0, 7.0, 0.0], dtype=torch.float64), torch.full((3,), 8.0))
    informative = rates.informative_prob(torch.arange(4))
    assert informative[0] > informative[3] > informative[1] > informative[2]
    probs = rates.draw_prob(torch.arange(4), min_draw_prob=0.05)
    assert probs[0] == probs[3] == 1.0 and 0.05 < probs[2] < probs[1] < 1.0
    group_rate = 11 / 24
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
    """Groups "a" (every row right), "b" (half right), "c" (none yet): a never-drawn prompt of "b" is drawn always,
    of "a" at the floor, of "c" (rate 0.5 before any row) always; the groups' counts decay per batch."""
    rates = SuccessRates.new(8, 6, ["a", "a", "b", "b", "c", "c"])
    rates.record(torch.tensor([0, 2]), torch.tensor([8.0, 4.0], dtype=torch.float64), torch.tensor([8.0, 8.0]))
    probs = rates.draw_prob(torch.tensor([1, 3, 5]), min_draw_prob=0.05)
    assert probs.tolist() == [0.05, 1.0, 1.0]
    rates.record(torch.tensor([2]), torch.tensor([0.0], dtype=torch.float64), torch.tensor([8.0]))
    expected = [8 * PRIOR_DECAY, 8 * PRIOR_DECAY, 4 * PRIOR_DECAY, 8 * PRIOR_DECAY + 8, 0.0, 0.0]
    assert rates.group_counts.view(-1).tolist() == pytest.approx(expected)


def test_skipper_success_rates_are_checkpointed_cleared_on_eviction_and_a_mismatch_is_refused():
    skipper = PromptSkipper.streaming(target=0.25, min_draw_prob=0.05, num_slots=8, success_rate_group_size=4)
    skipper.record([3], torch.tensor([HIGH]), torch.tensor([4.0], dtype=torch.float64), torch.tensor([4.0]))
    assert skipper.draw_prob(torch.tensor([3])).item() < 1.0 and skipper.rates.rows[3].item() == 4.0
    restored = PromptSkipper.streaming(target=0.25, min_draw_prob=0.05, num_slots=8, success_rate_group_size=4)
    restored.load_state_dict(skipper.state_dict())
    assert torch.equal(restored.draw_prob(torch.tensor([3])), skipper.draw_prob(torch.tensor([3])))
    colliding = 3 + 8  # same slot, another prompt: it takes the slot over with a clean rate
    skipper.record([colliding], torch.tensor([INFO]), torch.tensor([2.0], dtype=torch.float64), torch.tensor([4.0]))
    assert skipper.rates.successes[3].item() == 2.0 and skipper.rates.rows[3].item() == 4.0
    with pytest.raises(ValueError, match="needs each group's successes"):
        skipper.record([3], torch.tensor([LOW]))
    streak = PromptSkipper.streaming(target=0.25, min_draw_prob=0.05, num_slots=8)
    with pytest.raises(ValueError, match="success rates do not match"):
        streak.load_state_dict(skipper.state_dict())
    with pytest.raises(ValueError, match="success rates do not match"):
        restored.load_state_dict(streak.state_dict())
