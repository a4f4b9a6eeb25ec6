"""Tests of ``trl_zerostd/core/plan.py``: the row plan, its roles and metrics, and the rows each forward reads, on
tensors, no trainer. Property tests draw batches with the strategies of ``tests/support/strategies.py``."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from tests.support.strategies import (
    GRID,
    PROPERTY,
    Batch,
    all_estimators,
    batches,
    bools,
    expected_zero_std_groups,
    row_values,
)
from trl_zerostd import core

ROLE = core.RowRole


@PROPERTY
@given(data=st.data())
def test_permuting_rows_within_groups_permutes_everything(data):
    """Shuffle rows inside each group: masks permute exactly, advantages permute (up to summation order).

    float64 on quarter-grid rewards: the permutation changes the order of the variance sums, so results may differ
    in the last ulp, which a near-zero std (+1e-4) could magnify; in float64 that stays far below 1e-9.
    """
    batch = data.draw(batches(scales=GRID, dtype=torch.float64))
    g = batch.num_generations
    perm = torch.cat([start + torch.tensor(data.draw(st.permutations(range(g)))) for start in range(0, batch.n, g)])
    truncated, rejected = bools(data.draw, batch.n), bools(data.draw, batch.n)
    flags = {
        "mask_zero_std_groups": data.draw(st.booleans()),
        "zero_std_atol": data.draw(st.sampled_from([0.0, 1e-6, 0.25])),
    }
    shuffled = Batch(batch.rewards_per_func[perm], batch.reward_weights, g, batch.kl[perm])

    def pipeline(b, trunc, rej):
        masks = core.decide_row_plan(
            core.weighted_task_reward(b.rewards_per_func, b.reward_weights),
            g,
            truncated=trunc,
            unscorable=core.unscorable_rows(b.rewards_per_func),
            rejected=rej,
            **flags,
        )
        return masks, all_estimators(b, masks.trainable)

    masks, advantages = pipeline(batch, truncated, rejected)
    masks_p, advantages_p = pipeline(shuffled, truncated[perm], rejected[perm])
    assert torch.equal(masks_p.zero_std_groups, masks.zero_std_groups)
    assert torch.equal(masks_p.trainable, masks.trainable[perm])
    assert torch.equal(masks_p.trainable, masks.trainable[perm])
    for reason in core.MASK_REASONS:
        assert torch.equal(masks_p.reasons[reason], masks.reasons[reason][perm]), reason
    for label in advantages:  # (a plain max-difference check: assert_close is slow at this many calls)
        gap = (advantages_p[label] - advantages[label][perm]).abs().max().item()
        assert gap <= 1e-9, (label, advantages_p[label], advantages[label][perm])


@PROPERTY
@given(
    data=st.data(),
    mask_zero_std=st.booleans(),
    atol=st.sampled_from([0.0, 1e-6, 0.5]),
)
def test_decide_row_plan_matches_the_rule(data, mask_zero_std, atol):
    """Reasons, zero-variance groups (over valid rows only), trainable and stat_rows as SEMANTICS.md states."""
    batch = data.draw(batches(scales=GRID))
    g = batch.num_generations
    task = core.weighted_task_reward(batch.rewards_per_func, batch.reward_weights)
    unscorable = core.unscorable_rows(batch.rewards_per_func)
    truncated, rejected = bools(data.draw, batch.n), bools(data.draw, batch.n)
    masks = core.decide_row_plan(
        task,
        g,
        truncated=truncated,
        unscorable=unscorable,
        rejected=rejected,
        mask_zero_std_groups=mask_zero_std,
        zero_std_atol=atol,
    )
    invalid = truncated | unscorable | rejected
    if mask_zero_std:
        groups = expected_zero_std_groups(task, ~invalid, g, atol)
    else:
        groups = torch.zeros(batch.num_groups, dtype=torch.bool)
    zero_std = groups.repeat_interleave(g) & ~invalid
    assert torch.equal(masks.zero_std_groups, groups)
    assert set(masks.reasons) == set(core.MASK_REASONS)
    assert torch.equal(masks.reasons["zero_std"], zero_std)
    assert torch.equal(masks.reasons["truncated"], truncated)
    assert torch.equal(masks.reasons["unscorable"], unscorable)
    assert torch.equal(masks.reasons["rejected"], rejected)
    assert torch.equal(masks.trainable, ~invalid & ~zero_std)
    assert torch.equal(masks.masked, invalid | zero_std)
    assert torch.equal(masks.role == core.RowRole.TRL_MASKED, truncated)
    assert torch.equal(masks.role == core.RowRole.OUT, (zero_std | unscorable | rejected) & ~truncated)
    assert not masks.forwarded[~masks.trainable].any()  # zero_std_kl="mask": no KL-only row
    # The decision ignores the rewards of invalid rows.
    noise = row_values(data.draw, batch.n, 0.25)
    again = core.decide_row_plan(
        torch.where(invalid, noise, task),
        g,
        truncated=truncated,
        unscorable=unscorable,
        rejected=rejected,
        mask_zero_std_groups=mask_zero_std,
        zero_std_atol=atol,
    )
    assert torch.equal(again.zero_std_groups, masks.zero_std_groups)
    assert torch.equal(again.trainable, masks.trainable)


@pytest.mark.parametrize("reason", ["truncated", "unscorable", "rejected"])
def test_group_of_tied_valid_rows_is_zero_variance_despite_a_differing_invalid_row(reason):
    """[1, 1, 1, 5], the 5 invalid: the group is zero-variance, rows 0-2 masked as zero_std, row 3 by its reason."""
    task = torch.tensor([1.0, 1.0, 1.0, 5.0, 0.0, 1.0, 1.0, 1.0])
    flags = {name: torch.zeros(8, dtype=torch.bool) for name in ("truncated", "unscorable", "rejected")}
    flags[reason][3] = True
    if reason == "unscorable":
        task[3] = math.nan  # an unscorable row has a NaN task reward
    masks = core.decide_row_plan(task, 4, **flags)
    assert masks.zero_std_groups.tolist() == [True, False]
    assert masks.reasons["zero_std"].tolist() == [True, True, True, False, False, False, False, False]
    assert masks.reasons[reason].tolist() == [False, False, False, True] + [False] * 4
    assert masks.trainable.tolist() == [False] * 4 + [True] * 4
    off = core.decide_row_plan(task, 4, mask_zero_std_groups=False, **flags)
    assert not off.zero_std_groups.any() and not off.reasons["zero_std"].any()
    assert off.trainable.tolist() == [True, True, True, False] + [True] * 4


def test_a_lone_valid_row_gets_zero_advantage_through_the_pipeline():
    """Group 0 has one valid row (others truncated): it is masked as zero_std and its advantage is 0 in every mode."""
    rewards = torch.tensor([[3.0], [0.0], [1.0], [0.0], [1.0], [3.0]])
    weights = torch.tensor([1.0])
    truncated = torch.tensor([False, True, True, False, False, False])
    none = torch.zeros(6, dtype=torch.bool)
    masks = core.decide_row_plan(
        core.weighted_task_reward(rewards, weights), 3, truncated=truncated, unscorable=none, rejected=none
    )
    assert masks.reasons["zero_std"].tolist() == [True, False, False, False, False, False]
    batch = Batch(rewards, weights, 3, torch.zeros(6))
    for label, adv in all_estimators(batch, masks.trainable).items():
        assert adv[:3].tolist() == [0.0, 0.0, 0.0], label
        assert (adv[3:] != 0).all(), label  # the other group still learns


NO_ROWS = torch.zeros(12, dtype=torch.bool)


def kl_plan(zero_std_kl, reward_range=(0.0, 1.0), **flags):
    """Three groups of 4: all wrong (0), all right (1), informative; row 3 of the first group truncated."""
    task = torch.tensor([0.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.0, 1.0, 0.0])
    truncated = NO_ROWS.clone()
    truncated[3] = True
    return core.decide_row_plan(
        task, 4, truncated=truncated, unscorable=NO_ROWS, rejected=NO_ROWS, zero_std_kl=zero_std_kl,
        reward_range=reward_range, **flags,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("mode", "kl_only"),
    [("mask", []), ("keep_failed", [0, 1, 2]), ("keep", [0, 1, 2, 4, 5, 6, 7])],
)
def test_zero_std_kl_keeps_the_kl_term_of_tied_groups_only(mode, kl_only):
    """Truncated rows never keep a KL term; KL-only rows stay out of the statistics (rules 2 and 3)."""
    plan = kl_plan(mode)
    assert plan.low_tied_groups.tolist() == [True, False, False]
    assert plan.high_tied_groups.tolist() == [False, True, False]
    assert (plan.role == ROLE.KL_ONLY).nonzero().view(-1).tolist() == kl_only
    assert plan.role[3] == ROLE.TRL_MASKED
    assert plan.trainable.nonzero().view(-1).tolist() == [8, 9, 10, 11]
    assert torch.equal(plan.forwarded, plan.trainable | (plan.role == ROLE.KL_ONLY))


def test_low_and_high_ties_follow_the_reward_range():
    """A continuous reward: a group tied at 0.5 is low-tied only when 0.5 is the lowest reward seen."""
    task = torch.tensor([0.5, 0.5, 2.0, 2.0, 0.5, 2.0])
    plan = core.decide_row_plan(
        task, 2, truncated=NO_ROWS[:6], unscorable=NO_ROWS[:6], rejected=NO_ROWS[:6], zero_std_kl="keep_failed",
        reward_range=(0.5, 2.0),
    )  # fmt: skip
    assert plan.low_tied_groups.tolist() == [True, False, False]
    assert plan.high_tied_groups.tolist() == [False, True, False]
    lower_seen = core.decide_row_plan(
        task, 2, truncated=NO_ROWS[:6], unscorable=NO_ROWS[:6], rejected=NO_ROWS[:6], zero_std_kl="keep_failed",
        reward_range=(0.0, 2.0),
    )  # fmt: skip
    assert not lower_seen.low_tied_groups.any() and not (lower_seen.role == ROLE.KL_ONLY).any()
    no_range = kl_plan("keep_failed", reward_range=None)
    assert not no_range.low_tied_groups.any() and not no_range.high_tied_groups.any()


def test_plan_loss_rows_keep_keeps_every_row():
    role = torch.tensor([ROLE.TRAIN, ROLE.OUT, ROLE.KL_ONLY, ROLE.TRL_MASKED])
    rows = core.plan_loss_rows(role, "keep")
    assert rows.kept.tolist() == [0, 1, 2, 3]
    assert rows.forwarded.tolist() == [0, 2]
    assert rows.policy.tolist() == [True, False, False, False]


def test_plan_loss_rows_exclude_drops_our_masked_rows_and_keeps_trls():
    """Row 1 is ours (dropped); row 2 TRL masked itself (kept, not forwarded); row 4 keeps its KL term."""
    role = torch.tensor([ROLE.TRAIN, ROLE.OUT, ROLE.TRL_MASKED, ROLE.TRAIN, ROLE.KL_ONLY])
    rows = core.plan_loss_rows(role, "exclude")
    assert rows.kept.tolist() == [0, 2, 3, 4]
    assert rows.forwarded.tolist() == [0, 2, 3]  # positions within `kept`, not batch indices
    assert rows.policy.tolist() == [True, False, True, False]


def test_plan_loss_rows_exclude_keeps_one_row_when_all_are_masked():
    role = torch.full((3,), ROLE.OUT)
    rows = core.plan_loss_rows(role, "exclude")
    assert rows.kept.tolist() == [0] and rows.forwarded.tolist() == []
    rows = core.plan_loss_rows(role, "keep")
    assert rows.kept.tolist() == [0, 1, 2] and rows.forwarded.tolist() == []


def test_loss_rows_needed_counts_every_row_under_keep_and_the_unmasked_under_exclude():
    role = torch.tensor([ROLE.OUT, ROLE.TRAIN, ROLE.TRL_MASKED, ROLE.OUT])
    assert [core.loss_rows_needed(role, mode) for mode in ("keep", "exclude")] == [4, 2]
    assert core.loss_rows_needed(torch.full((2,), ROLE.OUT), "exclude") == 1  # at least one


def test_plan_loss_rows_pad_to_the_rows_every_rank_hands_the_loss():
    """A rank that needs fewer rows than another adds its first other rows as placeholders (not forwarded)."""
    role = torch.tensor([ROLE.OUT, ROLE.TRAIN, ROLE.OUT, ROLE.OUT])
    rows = core.plan_loss_rows(role, "exclude", rows=3)
    assert rows.kept.tolist() == [0, 1, 2] and rows.forwarded.tolist() == [1]
    assert core.plan_loss_rows(role, "exclude", rows=1).kept.tolist() == [1]  # never fewer than it needs


def test_forward_rows_match_across_ranks():
    """Every rank forwards as many rows (the most any rank needs, at least one), its needed rows first."""
    needed = torch.tensor([[False, False, False, False], [True, False, True, False]])
    assert core.forward_rows(needed, 0).tolist() == [0, 1]
    assert core.forward_rows(needed, 1).tolist() == [0, 2]
    assert core.forward_rows(torch.zeros(2, 4, dtype=torch.bool), 1).tolist() == [0]
    assert core.forward_rows(torch.tensor([[False, True], [True, True]]), 0) is None


def test_plan_metrics_are_shares_of_groups_rows_and_tokens():
    """Groups of 2: tied low, tied high, mixed, and one with a truncated row (tied over its one valid row)."""
    rewards = torch.tensor([0.0, 0.0, 1.0, 1.0, 0.0, 1.0, 1.0, 0.0])
    truncated = torch.tensor([False] * 7 + [True])
    no = torch.zeros(8, dtype=torch.bool)
    plan = core.decide_row_plan(rewards, 2, truncated=truncated, unscorable=no, rejected=no, zero_std_kl="keep_failed",
                                reward_range=(0.0, 1.0))  # fmt: skip
    tokens = torch.tensor([1.0, 1.0, 2.0, 2.0, 1.0, 1.0, 3.0, 1.0])
    metrics = core.plan_metrics(plan, tokens, "keep_failed")
    assert metrics == pytest.approx({
        "zero_std/masked_group_frac": 0.75,
        "zero_std/all_low_group_frac": 0.25,
        "zero_std/all_high_group_frac": 0.5,
        "zero_std/masked_token_frac": (1 + 1 + 2 + 2 + 3) / 12,
        "zero_std/kl_kept_row_frac": 2 / 8,
        "masked/row_frac/zero_std": 5 / 8,
        "masked/row_frac/truncated": 1 / 8,
        "masked/row_frac/unscorable": 0.0,
        "masked/row_frac/rejected": 0.0,
    })  # fmt: skip
    assert "zero_std/kl_kept_row_frac" not in core.plan_metrics(plan, tokens, "mask")


def test_tied_groups_train_only_with_two_valid_rows_tied_at_an_end():
    """Groups of 4: all wrong; all right with one truncated row; one valid row (the others unscorable); tied in the
    middle of the range; informative; all wrong with one row whose verifier returned None. Only the rows the tie was
    decided on, in groups of at least two such rows tied at an end of the range, get a sign; the informative rows
    alone are ``trainable``."""
    nan = float("nan")
    rewards = torch.tensor([0, 0, 0, 0, 1, 1, 1, 0, 1, 0, 0, 0, 0.5, 0.5, 0.5, 0.5, 1, 0, 1, 0, 0, 0, 0, nan])
    truncated = torch.zeros(24, dtype=torch.bool)
    truncated[7] = True
    unscorable = torch.zeros(24, dtype=torch.bool)
    unscorable[9:12] = True
    plan = core.decide_row_plan(
        rewards, 4, truncated=truncated, unscorable=unscorable, rejected=torch.zeros(24, dtype=torch.bool),
        reward_range=(0.0, 1.0), tied_groups_train=True,
    )  # fmt: skip
    sign = [-1] * 4 + [1, 1, 1, 0] + [0] * 4 + [0] * 4 + [0] * 4 + [-1, -1, -1, 0]
    assert plan.tied_sign.tolist() == sign
    assert plan.tied_training_groups.tolist() == [True, True, False, False, False, True]
    assert plan.trainable.nonzero().view(-1).tolist() == [16, 17, 18, 19]
    assert plan.role[plan.tied_sign != 0].eq(ROLE.TRAIN).all()
    assert plan.reasons["zero_std"].nonzero().view(-1).tolist() == [8, 12, 13, 14, 15, 23]
    off = core.decide_row_plan(
        rewards, 4, truncated=truncated, unscorable=unscorable, rejected=torch.zeros(24, dtype=torch.bool),
        reward_range=(0.0, 1.0),
    )  # fmt: skip
    assert not off.tied_sign.any() and torch.equal(off.trainable, plan.trainable)
    metrics = core.plan_metrics(plan, torch.ones(24), "mask", tied_groups_train=True)
    assert metrics["zero_std/tied_trained_group_frac"] == pytest.approx(3 / 6)
    assert metrics["zero_std/masked_group_frac"] == pytest.approx(2 / 6)
