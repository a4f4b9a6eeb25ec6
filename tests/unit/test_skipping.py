"""Tests of ``trl_zerostd/skipping.py``: outcomes and successes per group, history keys, the skipper (slots shared
by key, hashed slots, priors, checkpoints, a batch recorded)."""

import pytest
import torch

from trl_zerostd.predictors import PRIOR_DECAY, Outcome
from trl_zerostd.sampling import PromptStream
from trl_zerostd.skipping import GroupsOfOneSize, PromptSkipper, group_outcomes, group_successes, history_key

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


def test_rows_sharing_a_key_share_one_history():
    """Keys pool rows: outcomes of row 0 ("hard") set the draw probability of row 2, never drawn, of the same key."""
    skipper = PromptSkipper.new(4, target=0.25, min_draw_prob=0.05, keys=["hard", "easy", "hard", "easy"])
    assert skipper.slots.tolist() == [0, 1, 0, 1] and len(skipper.history.kind) == 2
    skipper.record([0, 0, 0], torch.tensor([LOW, LOW, LOW]))
    p = skipper.predictor.explore.all_low
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
    p = skipper.predictor.explore.all_low
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
    assert skipper.predictor.prior.counts.tolist() == [[2.0, 4.0], [1.0, 4.0], [0.0, 2.0]]
    p_low, p_high = skipper.predictor.explore.all_low, skipper.predictor.explore.all_high
    probs = skipper.draw_prob(torch.arange(6))
    assert probs.tolist() == pytest.approx([p_high**2, 0.5, p_low**3, 0.25, p_low**2, 1.0])
    skipper.record([0, 0, 0, 0, 2, 2, 4, 4, 4], torch.tensor([LOW] * 4 + [INFO] + [LOW] * 4))  # counts decayed first
    decay = PRIOR_DECAY
    expected = [[2 * decay, 4 * decay + 4], [decay + 1, 4 * decay + 2], [0, 2 * decay + 3]]
    torch.testing.assert_close(skipper.predictor.prior.counts, torch.tensor(expected, dtype=torch.float64))
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
    assert torch.equal(restored.predictor.prior.counts, skipper.predictor.prior.counts)
    assert restored.draw_prob(torch.arange(4)).tolist() == skipper.draw_prob(torch.arange(4)).tolist()
    for other in (PromptSkipper.new(4, 0.25, 0.05), PromptSkipper.new(4, 0.25, 0.05, prior_groups=list("abcc"))):
        with pytest.raises(ValueError, match="skip_prior_key"):
            other.load_state_dict(skipper.state_dict())
    with pytest.raises(ValueError, match="not both"):
        PromptSkipper.new(4, 0.25, 0.05, keys=["a", "a", "b", "b"], prior_groups=["a", "a", "b", "b"])


def test_group_successes_rescale_rewards_and_leave_invalid_rows_out():
    rewards = torch.tensor([0.0, 1.0, 1.0, 1.0, 2.0, 0.5, float("nan"), 2.0])
    valid = torch.tensor([True, True, True, False, True, True, True, True])
    successes, rows = group_successes(rewards, valid, 4, (0.0, 2.0))
    assert successes.tolist() == [1.0, 1.0 + 0.25 + 1.0] and rows.tolist() == [3.0, 3.0]
    empty_range, _ = group_successes(rewards, valid, 4, (1.0, 1.0))
    assert empty_range.tolist() == [0.0, 0.0]


def test_skipper_success_rates_are_checkpointed_cleared_on_eviction_and_a_mismatch_is_refused():
    skipper = PromptSkipper.streaming(
        target=0.25, min_draw_prob=0.05, num_slots=8, predictor="success_rate", group_size=4
    )
    skipper.record([3], torch.tensor([HIGH]), torch.tensor([4.0], dtype=torch.float64), torch.tensor([4.0]))
    assert skipper.draw_prob(torch.tensor([3])).item() < 1.0 and skipper.predictor.rates.rows[3].item() == 4.0
    restored = PromptSkipper.streaming(
        target=0.25, min_draw_prob=0.05, num_slots=8, predictor="success_rate", group_size=4
    )
    restored.load_state_dict(skipper.state_dict())
    assert torch.equal(restored.draw_prob(torch.tensor([3])), skipper.draw_prob(torch.tensor([3])))
    colliding = 3 + 8  # same slot, another prompt: it takes the slot over with a clean rate
    skipper.record([colliding], torch.tensor([INFO]), torch.tensor([2.0], dtype=torch.float64), torch.tensor([4.0]))
    assert skipper.predictor.rates.successes[3].item() == 2.0 and skipper.predictor.rates.rows[3].item() == 4.0
    with pytest.raises(ValueError, match="needs each group's successes"):
        skipper.record([3], torch.tensor([LOW]))
    streak = PromptSkipper.streaming(target=0.25, min_draw_prob=0.05, num_slots=8)
    with pytest.raises(ValueError, match="success rates do not match"):
        streak.load_state_dict(skipper.state_dict())
    with pytest.raises(ValueError, match="success rates do not match"):
        restored.load_state_dict(streak.state_dict())


def test_record_batch_turns_rewards_into_outcomes_and_metrics():
    """Two whole groups of 4 (one tied at 1, one mixed), one tied screen of 2 (at 0), one screen never completed:
    outcomes against the range widened by the batch, successes for the success rate, and the batch's metrics."""
    skipper = PromptSkipper.new(4, target=0.25, min_draw_prob=0.05, predictor="success_rate", group_size=4)
    whole = GroupsOfOneSize(
        torch.tensor([1.0, 1.0, 1.0, 1.0, 0.0, 1.0, 0.0, 0.0]), torch.ones(8, dtype=torch.bool), 4, [0, 1]
    )
    screen = GroupsOfOneSize(torch.tensor([0.0, 0.0]), torch.ones(2, dtype=torch.bool), 2, [2])
    metrics = skipper.record_batch([whole, screen], unfinished_keys=[3], skipped=4, reward_range=None, atol=1e-6)
    assert skipper.history.kind.tolist() == [HIGH, INFO, LOW, INFO] and skipper.history.streak.tolist() == [1] * 4
    rates = skipper.predictor.rates
    assert rates.successes.tolist() == [4.0, 1.0, 0.0, 0.0] and rates.rows.tolist() == [4.0, 4.0, 2.0, 0.0]
    assert metrics == {
        "prompt_skip/prompts_drawn": 8,
        "prompt_skip/skipped_frac": 0.5,
        "prompt_skip/zero_std_group_frac": 0.5,
    }
    streak = PromptSkipper.new(4, target=0.25, min_draw_prob=0.05)
    metrics = streak.record_batch([whole], [], 0, reward_range=(0.0, 2.0), atol=1e-6)  # 1.0 is midway: all-low
    assert streak.history.kind[:2].tolist() == [LOW, INFO]
    assert metrics["prompt_skip/explore_prob_all_low"] == streak.predictor.explore.all_low


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_prompts_tied_forever_are_drawn_at_the_floor_by_the_second_half(seed):
    """16 prompts, half of them tied in every group (4 all wrong, 4 all right), the others split in every group (2 of
    4 right); groups of 4, 4 prompts a step from the seeded stream, floor 0.2, 100 steps. At the floor the tied share
    of the groups generated is 8 * 0.2 / (8 * 0.2 + 8) = 0.17; the success rate without the stuck mixture gave 0.34
    here, the streak 0.19."""
    group_size, floor = 4, 0.2
    levels = torch.tensor([0.0] * 4 + [1.0] * 4 + [0.5] * 8)
    skipper = PromptSkipper.new(16, 0.25, floor, predictor="success_rate", group_size=group_size)
    stream = PromptStream(16, seed)
    split = torch.tensor([1.0, 1.0, 0.0, 0.0])
    tied = generated = 0
    for step in range(100):
        keys, skipped = stream.draw(4, skipper.draw_prob)
        rewards = torch.stack([split if levels[key] == 0.5 else levels[key].expand(group_size) for key in keys])
        part = GroupsOfOneSize(rewards.view(-1), torch.ones(rewards.numel(), dtype=torch.bool), group_size, keys)
        skipper.record_batch([part], [], skipped, (0.0, 1.0), 1e-6)
        if step >= 50:
            tied += sum(levels[key] != 0.5 for key in keys)
            generated += len(keys)
    assert tied / generated <= 0.2
