"""Tests of ``trl_zerostd/sampling/skipping.py``: outcomes and successes per group, history keys, the skipper (slots
shared by key, hashed slots, priors, checkpoints, a batch recorded)."""

import pytest
import torch

from trl_zerostd.sampling.skipping import PromptSkipper, group_outcomes, group_successes, history_key
from trl_zerostd.sampling.streams import PromptStream
from trl_zerostd.sampling.success_rate import Outcome

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


def record(skipper: PromptSkipper, keys: list[int], right: list[float], group_size: int = 4) -> None:
    """One generation batch of whole groups of a binary reward: ``right[i]`` rows right in the group of ``keys[i]``."""
    successes = torch.tensor(right, dtype=torch.float64)
    outcomes = torch.where(successes == 0, LOW, torch.where(successes == group_size, HIGH, INFO))
    skipper.record(keys, outcomes, successes, torch.full((len(keys),), float(group_size), dtype=torch.float64))


def test_rows_sharing_a_key_share_one_history():
    """Keys pool rows: the groups of row 0 ("hard") set the draw probability of row 2, never drawn, of the same key;
    rows of the other key are drawn as never seen. Without keys each row has its own history."""
    skipper = PromptSkipper.new(4, 0.05, 4, keys=["hard", "easy", "hard", "easy"])
    assert skipper.slots.tolist() == [0, 1, 0, 1] and len(skipper.rates.successes) == 2
    record(skipper, [0, 0, 0], [0.0, 0.0, 0.0])
    probs = skipper.draw_prob(torch.tensor([2, 0, 1, 3]))
    assert probs[0] == probs[1] < 1.0 and probs[2:].tolist() == [1.0, 1.0]
    per_row = PromptSkipper.new(4, 0.05, 4)
    record(per_row, [0], [0.0])
    assert per_row.slots is None and per_row.draw_prob(torch.tensor([0, 2])).tolist()[1] == 1.0


def test_history_key_is_stable_and_names_the_setting_for_non_json_values():
    conversation = [{"role": "user", "content": "2+3="}]
    assert history_key(conversation) == history_key([{"content": "2+3=", "role": "user"}]) > 0
    assert history_key("2+3=") != history_key("3+2=")
    assert history_key("2+3=") == 6407507801603917051  # the same in every process and run (not Python's hash)
    with pytest.raises(ValueError, match="skip_history_key"):
        history_key(object())


def test_streaming_history_is_bounded_and_counts_collisions():
    """Hashed slots: a key's history is found again; a key that lands on a slot another holds is drawn as never seen
    (the other's history is not applied to it), and recording it takes the slot over with a clean history and counts
    an eviction."""
    skipper = PromptSkipper.streaming(0.05, 4, num_slots=8)
    assert len(skipper.rates.successes) == 8
    record(skipper, [3, 3], [0.0, 0.0])
    assert skipper.draw_prob(torch.tensor([3])).item() < 1.0 and skipper.draw_prob(torch.tensor([4])).item() == 1.0
    colliding = 3 + 8  # same slot as key 3
    assert skipper.draw_prob(torch.tensor([colliding])).tolist() == [1.0] and skipper.hashed.evictions == 0
    record(skipper, [colliding], [2.0])
    assert skipper.hashed.evictions == 1
    assert skipper.draw_prob(torch.tensor([3])).tolist() == [1.0]  # 3's history is gone, not misapplied
    rates = skipper.rates
    assert (rates.successes[3].item(), rates.rows[3].item(), rates.one_sided[3].item()) == (2.0, 4.0, 0.0)
    assert rates.split[3]
    restored = PromptSkipper.streaming(0.05, 4, num_slots=8)
    restored.load_state_dict(skipper.state_dict())
    assert restored.hashed.evictions == 1
    assert torch.equal(
        restored.draw_prob(torch.tensor([colliding, 5])), skipper.draw_prob(torch.tensor([colliding, 5]))
    )


def test_a_history_of_another_size_or_prior_is_refused_on_load():
    saved = PromptSkipper.new(4, 0.05, 4, keys=["a", "b", "a", "b"]).state_dict()
    with pytest.raises(ValueError, match="skip_history_key"):
        PromptSkipper.new(4, 0.05, 4).load_state_dict(saved)
    with_prior = PromptSkipper.new(4, 0.05, 4, prior_groups=["a", "a", "b", "b"])
    record(with_prior, [0, 2], [1.0, 0.0])
    restored = PromptSkipper.new(4, 0.05, 4, prior_groups=["a", "a", "b", "b"])
    restored.load_state_dict(with_prior.state_dict())
    assert torch.equal(restored.draw_prob(torch.arange(4)), with_prior.draw_prob(torch.arange(4)))
    for other in (PromptSkipper.new(4, 0.05, 4), PromptSkipper.new(4, 0.05, 4, prior_groups=list("abcc"))):
        with pytest.raises(ValueError, match="skip_prior_key"):
            other.load_state_dict(with_prior.state_dict())
    with pytest.raises(ValueError, match="not both"):
        PromptSkipper.new(4, 0.05, 4, keys=["a", "a", "b", "b"], prior_groups=["a", "a", "b", "b"])


def test_a_skip_state_of_version_0_1_is_refused_naming_the_version():
    old = {"history": {"kind": torch.zeros(4), "streak": torch.zeros(4)}, "predictor": {"kind": "success_rate"}}
    with pytest.raises(ValueError, match="trl-zerostd 0.1"):
        PromptSkipper.new(4, 0.05, 4).load_state_dict(old)


def test_group_successes_rescale_rewards_and_leave_invalid_rows_out():
    rewards = torch.tensor([0.0, 1.0, 1.0, 1.0, 2.0, 0.5, float("nan"), 2.0])
    valid = torch.tensor([True, True, True, False, True, True, True, True])
    successes, rows = group_successes(rewards, valid, 4, (0.0, 2.0))
    assert successes.tolist() == [1.0, 1.0 + 0.25 + 1.0] and rows.tolist() == [3.0, 3.0]
    empty_range, _ = group_successes(rewards, valid, 4, (1.0, 1.0))
    assert empty_range.tolist() == [0.0, 0.0]


def test_record_batch_turns_rewards_into_outcomes_and_metrics():
    """Two groups of 4, one tied at 1 and one mixed: outcomes against the range widened by the batch, successes for
    the success rate, and the batch's metrics; with a wider range, a group tied at 1 of 0 to 2 is all-low."""
    skipper = PromptSkipper.new(4, 0.05, 4)
    rewards, valid = torch.tensor([1.0, 1.0, 1.0, 1.0, 0.0, 1.0, 0.0, 0.0]), torch.ones(8, dtype=torch.bool)
    metrics = skipper.record_batch(rewards, valid, [0, 1], skipped=2, reward_range=None, atol=1e-6)
    rates = skipper.rates
    assert rates.successes.tolist() == [4.0, 1.0, 0.0, 0.0] and rates.rows.tolist() == [4.0, 4.0, 0.0, 0.0]
    assert rates.one_sided.tolist()[0] == 4.0 and rates.split.tolist() == [False, True, False, False]
    assert metrics == {
        "prompt_skip/prompts_drawn": 4,
        "prompt_skip/skipped_frac": 0.5,
        "prompt_skip/zero_std_group_frac": 0.5,
    }
    wider = PromptSkipper.new(4, 0.05, 4)
    wider.record_batch(rewards, valid, [0, 1], 0, reward_range=(0.0, 2.0), atol=1e-6)  # 1.0 is midway: all-low
    assert wider.rates.one_sided.tolist()[0] == -4.0


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_prompts_tied_forever_are_drawn_at_the_floor_by_the_second_half(seed):
    """16 prompts, half of them tied in every group (4 all wrong, 4 all right), the others split in every group (2 of
    4 right); groups of 4, 4 prompts a step from the seeded stream, floor 0.2, 100 steps. At the floor the tied share
    of the groups generated is 8 * 0.2 / (8 * 0.2 + 8) = 0.17; the success rate without the stuck mixture gave 0.34
    here, the streak 0.19."""
    group_size, floor = 4, 0.2
    levels = torch.tensor([0.0] * 4 + [1.0] * 4 + [0.5] * 8)
    skipper = PromptSkipper.new(16, floor, group_size)
    stream = PromptStream(16, seed)
    split = torch.tensor([1.0, 1.0, 0.0, 0.0])
    tied = generated = 0
    for step in range(100):
        keys, skipped = stream.draw(4, skipper.draw_prob)
        rewards = torch.stack([split if levels[key] == 0.5 else levels[key].expand(group_size) for key in keys])
        valid = torch.ones(rewards.numel(), dtype=torch.bool)
        skipper.record_batch(rewards.view(-1), valid, keys, skipped, (0.0, 1.0), 1e-6)
        if step >= 50:
            tied += sum(levels[key] != 0.5 for key in keys)
            generated += len(keys)
    assert tied / generated <= 0.2
