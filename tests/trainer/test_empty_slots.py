"""Prompt skipping with ``skip_refill=False``: a skipped prompt's place stays an empty slot, which trains as TRL on
the groups generated and is out of every loss normaliser."""

from __future__ import annotations

import math

import pytest
import torch

from tests.support.refill import DATA, EMPTY_SLOTS, assert_trains_as_trl, group_prompts, tied_or_informative
from tests.support.trainers import assert_grads_close, grad_norm, loss_and_grads, move_policy_away, train_batch


def draw_only(trainer, prompt):
    """The skipper draws ``prompt`` always and every other prompt of DATA never; the stream's next two places are
    ``prompt`` and another (in the stream's order), so the batch of two groups has one empty slot."""
    trainer.zero_std.skipper.draw_prob = lambda rows: (rows == DATA.index(prompt)).double()
    stream = trainer.zero_std.refiller.stream
    place = stream._pass()[0].tolist().index(DATA.index(prompt))
    stream.position = max(place - 1, 0)


@pytest.mark.parametrize("kind", ["grpo", "rloo"])
@pytest.mark.parametrize("normalization", ["keep", "exclude"])
def test_an_empty_slot_trains_as_trl_on_the_groups_generated(make_trainer, kind, normalization):
    """Two places, one skipped: only "2+3=" is generated (TRL's token count), and loss and gradients equal TRL's on
    the batch of that group alone (beta > 0, policy moved; every normaliser, both modes); the empty slot's rows have
    advantage 0, an all-zero mask and no statistic."""
    ours = make_trainer(kind, prompts=DATA, zero_std_normalization=normalization, **EMPTY_SLOTS)
    base = make_trainer(kind, ours=False, prompts=DATA, per_device_train_batch_size=4, beta=0.1)
    for trainer in (ours, base):
        move_policy_away(trainer.model)
    draw_only(ours, "2+3=")
    ours_batch = train_batch(ours, ["2+3=", "4+4="], tied_or_informative)
    base_batch = train_batch(base, ["2+3="], tied_or_informative)
    slot = 0 if ours.zero_std.refiller.stream.position == 1 else 1  # which place held "2+3="
    generated = slice(4 * slot, 4 * slot + 4)
    for key in ("prompt_ids", "completion_ids", "completion_mask", "advantages"):
        torch.testing.assert_close(ours_batch[key][generated], base_batch[key], rtol=0, atol=0, msg=key)
    empty = slice(4 * (1 - slot), 4 * (1 - slot) + 4)
    assert not ours_batch["completion_mask"][empty].any() and not ours_batch["advantages"][empty].any()
    metrics, base_metrics = ours._metrics["train"], base._metrics["train"]
    assert metrics["num_tokens"] == base_metrics["num_tokens"]
    assert metrics["prompt_skip/empty_slot_frac"][-1] == 0.5 and metrics["prompt_skip/skipped_frac"][-1] == 0.5
    assert metrics["zero_std/masked_group_frac"][-1] == 0.0 and metrics["masked/row_frac/unscorable"][-1] == 0.0
    assert metrics["reward"][-1] == base_metrics["reward"][-1]
    logged = list(ours._logs["rewards"]["answer_reward"])[-8:]  # the completions table: no reward for an empty slot
    assert (
        all(math.isnan(reward) for reward in logged[empty])
        and logged[generated] == list(base._logs["rewards"]["answer_reward"])[-4:]
    )
    assert_trains_as_trl(ours, ours_batch, base, base_batch)


def test_an_empty_slot_is_out_of_every_loss_normaliser(make_trainer):
    """Under "keep", each of TRL's GRPO losses normalises by the rows generated only: the gradient equals TRL's on
    the group generated (a normaliser that counted the empty slot's 4 copied rows would halve it)."""
    from tests.support.trainers import LOSS_TYPES

    for loss_type in LOSS_TYPES:
        ours = make_trainer(prompts=DATA, loss_type=loss_type, **EMPTY_SLOTS)
        base = make_trainer(ours=False, prompts=DATA, loss_type=loss_type, per_device_train_batch_size=4, beta=0.1)
        for trainer in (ours, base):
            move_policy_away(trainer.model)
        draw_only(ours, "4+4=")
        ours_grads = loss_and_grads(ours, train_batch(ours, DATA[:2], tied_or_informative))[1]
        base_grads = loss_and_grads(base, train_batch(base, ["4+4="], tied_or_informative))[1]
        assert grad_norm(base_grads) > 1e-4, loss_type
        assert_grads_close(ours_grads, base_grads, rtol=1e-5, atol=1e-7)


def test_a_step_whose_places_are_all_skipped_generates_its_first(make_trainer):
    """Every place skipped: the first generates (a step trains on something), the second stays empty, and only the
    group generated enters the skip history."""
    trainer = make_trainer(prompts=DATA, **EMPTY_SLOTS)
    skipper, recorded = trainer.zero_std.skipper, []
    skipper.draw_prob = lambda rows: torch.zeros(len(rows), dtype=torch.float64)
    record = skipper.record
    skipper.record = lambda keys, *args: recorded.append(list(keys)) or record(keys, *args)
    first = trainer.zero_std.refiller.stream._pass()[0][0].item()
    batch = train_batch(trainer, DATA[:2], tied_or_informative)
    assert group_prompts(trainer, batch)[0] == DATA[first] and recorded == [[first]]
    assert trainer._metrics["train"]["prompt_skip/empty_slot_frac"][-1] == 0.5
