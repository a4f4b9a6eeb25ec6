"""Tests of ``trl_zerostd/core/advantages.py``: the advantage estimators and their registry, on tensors, no trainer.

``trl_grpo_advantages`` / ``trl_rloo_advantages`` below are TRL 1.16's own advantage code, copied from the installed
trainers, so "equals TRL" is checked against TRL's arithmetic, not against ours.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from trl.trainer.utils import nanstd

from tests.support.strategies import (
    FLOATS,
    GRPO_MODES,
    PROPERTY,
    SCALES,
    STAT_PATTERNS,
    Batch,
    all_estimators,
    batches,
    bools,
    grpo,
    reward_table,
    rloo,
    row_values,
    stat_pattern,
)
from trl_zerostd import core
from trl_zerostd.core import advantages

# ----------------------------------------------------------------------------------------------------------------
# TRL 1.16's advantage code, verbatim from trl/trainer/{grpo,rloo}_trainer.py `_generate_and_score_completions`.
# Only `self` is a namespace of the attributes the block reads, `device` is the rewards' device, and RLOO's
# `kl = gather(kl)` is the identity (one process); the per-row `kl` is passed in.
# ----------------------------------------------------------------------------------------------------------------


def trl_grpo_advantages(rewards_per_func, reward_weights, num_generations, scale_rewards, multi_objective_aggregation):
    self = SimpleNamespace(
        reward_weights=reward_weights,
        scale_rewards=scale_rewards,
        multi_objective_aggregation=multi_objective_aggregation,
        reward_funcs=[None] * rewards_per_func.shape[1],
    )
    device = rewards_per_func.device
    # --- begin TRL 1.16 grpo_trainer.py ---
    unscorable_mask = torch.isnan(rewards_per_func).all(dim=1)

    if self.multi_objective_aggregation == "sum_then_normalize":
        # Apply weights to each reward function's output and sum
        rewards = (rewards_per_func * self.reward_weights.to(device).unsqueeze(0)).nansum(dim=1)
        rewards[unscorable_mask] = torch.nan
        mean_grouped_rewards = torch.nanmean(rewards.view(-1, num_generations), dim=1)
        mean_grouped_rewards = mean_grouped_rewards.repeat_interleave(num_generations, dim=0)
        if self.scale_rewards in ["group", "none"]:
            # If self.scale_rewards = "none", we'll only use std_rewards to check for zero std for logging
            if num_generations > 1:
                std_rewards = nanstd(rewards.view(-1, num_generations), dim=1)
                std_rewards = std_rewards.repeat_interleave(num_generations, dim=0)
            else:  # doesn't occur during training, but could occur in eval when num_generations_eval=1
                std_rewards = torch.zeros_like(rewards)
        elif self.scale_rewards == "batch":
            # Compute global std
            if rewards.numel() > 1:
                std_rewards = nanstd(rewards).expand_as(rewards)
            else:  # doesn't occur during training, but could occur in eval when num_generations_eval=batch_size=1
                std_rewards = torch.zeros_like(rewards)
        else:
            raise ValueError(
                f"Invalid value for scale_rewards: {self.scale_rewards}. Must be one of 'batch', 'group', or 'none'."
            )

        advantages = rewards - mean_grouped_rewards
        if self.scale_rewards != "none":
            advantages = advantages / (std_rewards + 1e-4)
        is_std_zero = torch.isclose(std_rewards, torch.zeros_like(std_rewards))  # for logging

    elif self.multi_objective_aggregation == "normalize_then_sum":
        grouped = rewards_per_func.view(-1, num_generations, len(self.reward_funcs))
        mean_k = torch.nanmean(grouped, dim=1, keepdim=True)
        std_k = nanstd(grouped, dim=1, keepdim=True) if num_generations > 1 else torch.zeros_like(mean_k)
        reward_k = (grouped - mean_k) / (std_k + 1e-4)
        reward_k = reward_k.view(-1, len(self.reward_funcs))
        rewards = (reward_k * self.reward_weights.to(device).unsqueeze(0)).nansum(dim=1)
        rewards[unscorable_mask] = torch.nan
        std_rewards = nanstd(rewards).expand_as(rewards) if rewards.numel() > 1 else torch.zeros_like(rewards)
        advantages = (rewards - torch.nanmean(rewards)) / (std_rewards + 1e-4)
        is_std_zero = torch.isclose(std_rewards, torch.zeros_like(std_rewards))  # for logging  # noqa: F841

    else:
        raise ValueError(
            f"Invalid multi_objective_aggregation: {self.multi_objective_aggregation}. Must be "
            "'sum_then_normalize' or 'normalize_then_sum'."
        )

    # Unscorable completions (every reward func returned None) carry no learning signal: their reward is NaN here,
    # so zero their advantage to keep them from moving the policy.
    advantages = torch.nan_to_num(advantages, nan=0.0)
    # --- end TRL 1.16 ---
    return advantages


def trl_rloo_advantages(
    rewards_per_func,
    reward_weights,
    num_generations,
    beta=0.0,
    kl=None,
    normalize_advantages=False,
    reward_clip_range=None,
):
    self = SimpleNamespace(
        reward_weights=reward_weights,
        beta=beta,
        normalize_advantages=normalize_advantages,
        reward_clip_range=reward_clip_range,
    )
    device = rewards_per_func.device
    # --- begin TRL 1.16 rloo_trainer.py ---
    unscorable_mask = torch.isnan(rewards_per_func).all(dim=1)

    # Apply weights to each reward function's output and sum
    rewards = (rewards_per_func * self.reward_weights.to(device).unsqueeze(0)).nansum(dim=1)
    rewards[unscorable_mask] = torch.nan

    # Apply reward clipping if specified
    if self.reward_clip_range:
        rewards = rewards.clamp(min=self.reward_clip_range[0], max=self.reward_clip_range[1])

    # Include the KL penalty in the reward
    if self.beta != 0.0:
        # (per_token_kl and kl = (per_token_kl * completion_mask).sum(-1); kl = gather(kl): passed in as `kl`)
        rewards = rewards - self.beta * kl

    grouped_rewards = rewards.view(-1, num_generations)
    mean_grouped_rewards = torch.nanmean(grouped_rewards, dim=1)
    if num_generations > 1:
        std_rewards = nanstd(grouped_rewards, dim=1)
    else:  # doesn't occur during training, but could occur in eval when num_generations_eval=1
        std_rewards = torch.zeros_like(mean_grouped_rewards)  # noqa: F841

    scorable_counts = (~torch.isnan(grouped_rewards)).sum(dim=1, keepdim=True)  # (num_prompts, 1)
    grouped_sum = torch.nansum(grouped_rewards, dim=1, keepdim=True)  # (num_prompts, 1)
    if num_generations > 1:
        baselines = (grouped_sum - grouped_rewards) / (scorable_counts - 1)  # (num_prompts, num_generations)
        baselines = baselines.view(-1)  # Flatten back to match rewards shape
        advantages = rewards - baselines
    else:  # this case doesn't occur during training, but could in eval when num_generations_eval=1
        advantages = torch.zeros_like(rewards)

    # Normalize advantages over the scorable subset only (unscorable advantages are still NaN here).
    if self.normalize_advantages:
        advantages = (advantages - torch.nanmean(advantages)) / (nanstd(advantages) + 1e-4)

    # Unscorable completions carry no learning signal: zero their advantage to keep them from moving the policy.
    advantages = torch.nan_to_num(advantages, nan=0.0)
    # --- end TRL 1.16 ---
    return advantages


# ----------------------------------------------------------------------------------------------------------------
# 1. A masked row never moves another row's advantage
# ----------------------------------------------------------------------------------------------------------------


@PROPERTY
@given(data=st.data())
def test_masked_row_rewards_do_not_move_any_advantage(data):
    """Rewriting the rewards (and KL) of rows outside ``stat_rows`` leaves every advantage bit-identical."""
    batch = data.draw(batches())
    stat_rows = bools(data.draw, batch.n)
    k = batch.rewards_per_func.shape[1]
    new_table = reward_table(data.draw, batch.n, k, data.draw(SCALES))
    new_kl = row_values(data.draw, batch.n, data.draw(SCALES))
    changed = Batch(
        torch.where(stat_rows.unsqueeze(1), batch.rewards_per_func, new_table),
        batch.reward_weights,
        batch.num_generations,
        torch.where(stat_rows, batch.kl, new_kl),
    )
    clip = data.draw(st.none() | st.tuples(st.floats(-3, 0, width=32), st.floats(0.5, 3, width=32)))
    before, after = all_estimators(batch, stat_rows), all_estimators(changed, stat_rows)
    before["rloo clipped"] = rloo(batch, stat_rows, with_kl=True, normalize_advantages=True, reward_clip_range=clip)
    after["rloo clipped"] = rloo(changed, stat_rows, with_kl=True, normalize_advantages=True, reward_clip_range=clip)
    for label in before:
        assert torch.equal(before[label], after[label]), label


def test_the_leak_check_detects_trl_leak():
    """The check above can fail: in TRL's GRPO and RLOO row 3's reward moves rows 0-2; masked in ours, it does not."""
    rewards = torch.tensor([[1.0], [0.0], [0.0], [0.0]])
    changed = torch.tensor([[1.0], [0.0], [0.0], [5.0]])  # the row we would mask (index 3) changes
    weights, g = torch.tensor([1.0]), 4
    assert not torch.equal(
        trl_grpo_advantages(rewards, weights, g, "group", "sum_then_normalize")[:3],
        trl_grpo_advantages(changed, weights, g, "group", "sum_then_normalize")[:3],
    )
    assert not torch.equal(trl_rloo_advantages(rewards, weights, g)[:3], trl_rloo_advantages(changed, weights, g)[:3])
    stat_rows = torch.tensor([True, True, True, False])
    assert torch.equal(
        advantages.grpo_advantages(rewards, weights, g, stat_rows),
        advantages.grpo_advantages(changed, weights, g, stat_rows),
    )


# ----------------------------------------------------------------------------------------------------------------
# 2. With no row masked, TRL's advantages bit for bit
# ----------------------------------------------------------------------------------------------------------------


@PROPERTY
@given(batch=batches(min_generations=1), mode=st.sampled_from(GRPO_MODES))
def test_grpo_equals_trl_when_nothing_is_masked(batch, mode):
    """``stat_rows = ~unscorable``: GRPO advantages are TRL 1.16's, bitwise, in every scale/aggregation mode."""
    stat_rows = ~core.unscorable_rows(batch.rewards_per_func)
    ours = grpo(batch, stat_rows, **mode)
    trl = trl_grpo_advantages(batch.rewards_per_func.clone(), batch.reward_weights, batch.num_generations, **mode)
    assert torch.equal(ours, trl), (ours, trl)


@PROPERTY
@given(
    batch=batches(min_generations=1),
    normalize=st.booleans(),
    beta=st.sampled_from([0.0, 0.05, 1.0]),
    clip=st.none() | st.tuples(st.floats(-3, 0, width=32), st.floats(0.5, 3, width=32)),
)
def test_rloo_equals_trl_when_nothing_is_masked(batch, normalize, beta, clip):
    """``stat_rows = ~unscorable``: RLOO advantages (clip, KL penalty, normalisation) are TRL 1.16's, bitwise."""
    stat_rows = ~core.unscorable_rows(batch.rewards_per_func)
    ours = advantages.rloo_advantages(
        batch.rewards_per_func,
        batch.reward_weights,
        batch.num_generations,
        stat_rows,
        kl_penalty=beta * batch.kl if beta != 0.0 else None,
        normalize_advantages=normalize,
        reward_clip_range=clip,
    )
    trl = trl_rloo_advantages(
        batch.rewards_per_func.clone(),
        batch.reward_weights,
        batch.num_generations,
        beta=beta,
        kl=batch.kl,
        normalize_advantages=normalize,
        reward_clip_range=clip,
    )
    assert torch.equal(ours, trl), (ours, trl)


@settings(max_examples=150, deadline=None)
@given(x=st.lists(st.none() | FLOATS, min_size=1, max_size=12), rows=st.integers(1, 3))
def test_nanstd_is_trl_nanstd(x, rows):
    """advantages.nanstd (whole tensor and per dim) is bitwise TRL's nanstd, NaN where fewer than 2 values."""
    t = torch.tensor([math.nan if v is None else v for v in x] * rows, dtype=torch.float32).view(rows, -1)
    assert torch.equal(advantages.nanstd(t), nanstd(t)) or (advantages.nanstd(t).isnan() and nanstd(t).isnan())
    for dim in (0, 1):
        ours, theirs = advantages.nanstd(t, dim=dim), nanstd(t, dim=dim)
        assert ours.shape == theirs.shape
        assert torch.equal(ours.nan_to_num(-1.0), theirs.nan_to_num(-1.0))


# ----------------------------------------------------------------------------------------------------------------
# 4. Always finite; masked rows exactly 0
# ----------------------------------------------------------------------------------------------------------------


@PROPERTY
@given(data=st.data(), pattern=st.sampled_from(STAT_PATTERNS), rewards=st.sampled_from(["random", "all_nan", "flat"]))
def test_advantages_are_finite_and_masked_rows_are_zero(data, pattern, rewards):
    """Whatever ``stat_rows`` and rewards: finite advantages, 0 outside ``stat_rows``; one row per group -> all 0."""
    batch = data.draw(batches(scales=SCALES | st.sampled_from([1e6, 1e-30])))
    if rewards == "all_nan":
        batch.rewards_per_func.fill_(math.nan)
    elif rewards == "flat":  # quarter-grid value, unit weights: exact group sums (else TRL's own ~1e-7 residue shows)
        batch.rewards_per_func.fill_(data.draw(st.integers(-8, 8)) / 4)
        batch.reward_weights.fill_(1.0)
    stat_rows = stat_pattern(data.draw, pattern, batch.n, batch.num_generations)
    for label, adv in all_estimators(batch, stat_rows).items():
        assert adv.shape == (batch.n,)
        assert torch.isfinite(adv).all(), (label, adv)
        assert (adv[~stat_rows] == 0.0).all(), (label, adv)
        no_signal = rewards == "all_nan" or (rewards == "flat" and "'with_kl': True" not in label)
        if pattern == "one_per_group" or no_signal:
            assert (adv == 0.0).all(), (label, adv)


def test_estimators_reject_unknown_modes():
    rewards, weights, stat = torch.zeros(4, 1), torch.ones(1), torch.ones(4, dtype=torch.bool)
    with pytest.raises(ValueError, match="scale_rewards"):
        advantages.grpo_advantages(rewards, weights, 2, stat, scale_rewards="global")
    with pytest.raises(ValueError, match="multi_objective_aggregation"):
        advantages.grpo_advantages(rewards, weights, 2, stat, multi_objective_aggregation="mean")


def test_entropy_shaped_advantages_by_hand():
    entropies = torch.tensor([[0.5, 1.5, 9.0], [0.2, 1.0, 0.6], [1.0, 1.0, 1.0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 1, 1]])
    shaped = advantages.entropy_shaped_advantages(torch.tensor([1.0, -1.0, 0.0]), entropies, mask, scale=0.1)
    expected = torch.tensor([[0.05, 0.15, 0.0], [-0.08, 0.0, -0.04], [0.0, 0.0, 0.0]])
    torch.testing.assert_close(shaped, expected)  # the masked 9.0 is neither shaped nor the all-wrong row's max
