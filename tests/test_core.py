"""Tests of ``trl_zerostd/core.py``: the pure tensor math, on tensors, no trainer.

Property tests draw small batches (``G`` in 2..6 generations, 1..5 groups, 1..3 reward functions, some ``None``
rewards) with hypothesis. ``trl_grpo_advantages`` / ``trl_rloo_advantages`` below are TRL 1.16's own advantage code,
copied from the installed trainers, so "equals TRL" is checked against TRL's arithmetic, not against ours.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from types import SimpleNamespace

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from trl.trainer.utils import nanstd

from trl_zerostd import core

PROPERTY = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

SCALE_REWARDS = ("group", "batch", "none")
AGGREGATIONS = ("sum_then_normalize", "normalize_then_sum")
GRPO_MODES = [{"scale_rewards": s, "multi_objective_aggregation": a} for s in SCALE_REWARDS for a in AGGREGATIONS]
RLOO_MODES = [{"normalize_advantages": n, "with_kl": k} for n in (False, True) for k in (False, True)]

# A reward is a small integer cell times a per-batch scale; cells above 8 are None (NaN, ~1 in 5 cells).
# Scale 0.25 gives quarter-grid rewards whose sums are exact (well conditioned); an arbitrary float32 scale gives
# rewards with rounding everywhere, for the bitwise comparisons. Integer cells keep hypothesis fast.
GRID = st.just(0.25)
SCALES = st.sampled_from([0.25, 1.0]) | st.floats(0.015625, 3, width=32)
FLOATS = st.floats(-10, 10, width=32)
WEIGHTS = st.sampled_from([1.0, 0.5, 2.0, -1.0, 0.0]) | st.floats(-3, 3, width=32)


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
# Strategies and helpers
# ----------------------------------------------------------------------------------------------------------------


@dataclass
class Batch:
    rewards_per_func: torch.Tensor  # (N, K), NaN = the function returned None
    reward_weights: torch.Tensor  # (K,)
    num_generations: int
    kl: torch.Tensor  # (N,) a per-row sequence KL, for RLOO's penalty

    @property
    def n(self) -> int:
        return self.rewards_per_func.shape[0]

    @property
    def num_groups(self) -> int:
        return self.n // self.num_generations


def reward_table(draw, n, k, scale, dtype=torch.float32):
    """``(n, k)`` rewards: cells in -8..12 times ``scale``, NaN (the function returned None) for cells above 8.

    One drawn integer per row holds its ``k`` cells (base 21): a third of the draws, same distribution."""
    packed = draw(st.lists(st.integers(0, 21**k - 1), min_size=n, max_size=n))
    cells = torch.tensor([[code // 21**j % 21 - 8 for j in range(k)] for code in packed], dtype=torch.float64)
    return torch.where(cells > 8, math.nan, cells * scale).to(dtype)


def row_values(draw, n, scale, dtype=torch.float32):
    """``(n,)`` finite values: cells in -8..8 times ``scale``."""
    return (torch.tensor(draw(st.lists(st.integers(-8, 8), min_size=n, max_size=n)), dtype=torch.float64) * scale).to(
        dtype
    )


@st.composite
def batches(draw, scales=SCALES, min_generations=2, dtype=torch.float32):
    num_generations = draw(st.integers(min_generations, 6))
    n = num_generations * draw(st.integers(1, 5))
    k = draw(st.integers(1, 3))
    rewards = reward_table(draw, n, k, draw(scales), dtype)
    weights = torch.tensor(draw(st.lists(WEIGHTS, min_size=k, max_size=k)), dtype=dtype)
    return Batch(rewards, weights, num_generations, row_values(draw, n, draw(scales), dtype))


def bools(draw, n):
    """``(n,)`` bool from one drawn bitmask."""
    bits = draw(st.integers(0, 2**n - 1))
    return torch.tensor([(bits >> i) & 1 for i in range(n)], dtype=torch.bool)


def grpo(batch, stat_rows, **mode):
    return core.grpo_advantages(batch.rewards_per_func, batch.reward_weights, batch.num_generations, stat_rows, **mode)


def rloo(batch, stat_rows, normalize_advantages=False, with_kl=False, beta=0.05, reward_clip_range=None):
    return core.rloo_advantages(
        batch.rewards_per_func,
        batch.reward_weights,
        batch.num_generations,
        stat_rows,
        kl_penalty=beta * batch.kl if with_kl else None,
        normalize_advantages=normalize_advantages,
        reward_clip_range=reward_clip_range,
    )


def all_estimators(batch, stat_rows):
    """``{label: advantages}`` for every GRPO mode and every RLOO mode."""
    out = {f"grpo {m}": grpo(batch, stat_rows, **m) for m in GRPO_MODES}
    out.update({f"rloo {m}": rloo(batch, stat_rows, **m) for m in RLOO_MODES})
    return out


def expected_zero_std_groups(rewards, valid_rows, num_generations, atol):
    """Reference for ``zero_std_groups``, group by group in Python (the spread computed in float32, like the batch)."""
    out = []
    rewards, valid_rows = rewards.tolist(), valid_rows.tolist()
    for start in range(0, len(rewards), num_generations):
        values = [
            rewards[i] for i in range(start, start + num_generations) if valid_rows[i] and rewards[i] == rewards[i]
        ]
        spread = torch.tensor(max(values)) - torch.tensor(min(values)) if len(values) >= 2 else None  # float32
        out.append(spread is None or bool(spread <= atol))
    return torch.tensor(out, dtype=torch.bool)


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
    """The check above can fail: in TRL's own GRPO and RLOO row 3's reward moves rows 0-2; masked in ours, it does not."""
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
        core.grpo_advantages(rewards, weights, g, stat_rows), core.grpo_advantages(changed, weights, g, stat_rows)
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
    ours = core.rloo_advantages(
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
    """core.nanstd (whole tensor and per dim) is bitwise TRL's nanstd, NaN where fewer than 2 values."""
    t = torch.tensor([math.nan if v is None else v for v in x] * rows, dtype=torch.float32).view(rows, -1)
    assert torch.equal(core.nanstd(t), nanstd(t)) or (core.nanstd(t).isnan() and nanstd(t).isnan())
    for dim in (0, 1):
        ours, theirs = core.nanstd(t, dim=dim), nanstd(t, dim=dim)
        assert ours.shape == theirs.shape
        assert torch.equal(ours.nan_to_num(-1.0), theirs.nan_to_num(-1.0))


# ----------------------------------------------------------------------------------------------------------------
# 3. Permuting rows within a group permutes advantages and masks
# ----------------------------------------------------------------------------------------------------------------


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
        "exclude_masked_from_baseline": data.draw(st.booleans()),
    }
    shuffled = Batch(batch.rewards_per_func[perm], batch.reward_weights, g, batch.kl[perm])

    def pipeline(b, trunc, rej):
        masks = core.decide_row_masks(
            core.weighted_task_reward(b.rewards_per_func, b.reward_weights),
            g,
            truncated=trunc,
            unscorable=core.unscorable_rows(b.rewards_per_func),
            rejected=rej,
            **flags,
        )
        return masks, all_estimators(b, masks.stat_rows)

    masks, advantages = pipeline(batch, truncated, rejected)
    masks_p, advantages_p = pipeline(shuffled, truncated[perm], rejected[perm])
    assert torch.equal(masks_p.zero_std_groups, masks.zero_std_groups)
    assert torch.equal(masks_p.trainable, masks.trainable[perm])
    assert torch.equal(masks_p.stat_rows, masks.stat_rows[perm])
    for reason in core.MASK_REASONS:
        assert torch.equal(masks_p.reasons[reason], masks.reasons[reason][perm]), reason
    for label in advantages:  # (a plain max-difference check: assert_close is slow at this many calls)
        gap = (advantages_p[label] - advantages[label][perm]).abs().max().item()
        assert gap <= 1e-9, (label, advantages_p[label], advantages[label][perm])


# ----------------------------------------------------------------------------------------------------------------
# 4. Always finite; masked rows exactly 0
# ----------------------------------------------------------------------------------------------------------------

STAT_PATTERNS = ("random", "none", "all", "one_per_group", "all_but_one_per_group")


def stat_pattern(draw, pattern, n, g):
    if pattern == "random":
        return bools(draw, n)
    if pattern in ("none", "all"):
        return torch.full((n,), pattern == "all")
    chosen = torch.tensor([start + draw(st.integers(0, g - 1)) for start in range(0, n, g)])
    one = torch.zeros(n, dtype=torch.bool).index_fill(0, chosen, True)
    return one if pattern == "one_per_group" else ~one


@PROPERTY
@given(data=st.data(), pattern=st.sampled_from(STAT_PATTERNS), rewards=st.sampled_from(["random", "all_nan", "flat"]))
def test_advantages_are_finite_and_masked_rows_are_zero(data, pattern, rewards):
    """Whatever ``stat_rows`` and rewards: finite advantages, exactly 0 outside ``stat_rows``; one row per group -> 0."""
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


# ----------------------------------------------------------------------------------------------------------------
# 5. Zero-variance groups and row masks
# ----------------------------------------------------------------------------------------------------------------


@PROPERTY
@given(data=st.data(), atol=st.sampled_from([0.0, 1e-6, 0.25, 0.5, 1.0]))
def test_zero_std_groups_matches_its_definition(data, atol):
    """True iff the group has < 2 valid non-NaN rows or their max - min <= atol; invalid/NaN rows do not count."""
    batch = data.draw(batches())
    rewards = batch.rewards_per_func[:, 0]
    valid = bools(data.draw, batch.n)
    got = core.zero_std_groups(rewards, valid, batch.num_generations, atol)
    assert torch.equal(got, expected_zero_std_groups(rewards, valid, batch.num_generations, atol))
    # Invalid rows can take any reward without changing the decision.
    noise = row_values(data.draw, batch.n, data.draw(SCALES))
    assert torch.equal(
        core.zero_std_groups(torch.where(valid, rewards, noise), valid, batch.num_generations, atol), got
    )


@PROPERTY
@given(data=st.data(), scale=st.floats(0.01, 100))
def test_zero_std_groups_ignores_positive_rescaling_at_atol_zero(data, scale):
    """With atol=0 the decision is the same for ``rewards`` and ``scale * rewards`` (quarter-grid rewards)."""
    batch = data.draw(batches(scales=GRID))
    rewards, valid, g = batch.rewards_per_func[:, 0], bools(data.draw, batch.n), batch.num_generations
    assert torch.equal(
        core.zero_std_groups(rewards * scale, valid, g, 0.0), core.zero_std_groups(rewards, valid, g, 0.0)
    )


def test_zero_std_groups_cases():
    """Tie, spread, spread within atol, one valid row, NaN rewards, and invalid rows, one group each (G=3)."""
    nan = math.nan
    groups = [
        [2.0, 2.0, 2.0],  # tie -> True
        [0.0, 1.0, 1.0],  # spread 1 -> False
        [0.0, 0.5, 0.25],  # spread 0.5 <= atol 0.5 -> True
        [1.0, nan, nan],  # one valid row -> True
        [1.0, 1.0, nan],  # NaN does not add spread -> True
        [1.0, 1.0, 9.0],  # the 9 is an invalid row -> True
        [1.0, 3.0, 9.0],  # valid rows differ -> False
    ]
    rewards = torch.tensor(groups).view(-1)
    valid = torch.ones(21, dtype=torch.bool)
    valid[17] = False
    got = core.zero_std_groups(rewards, valid, 3, 0.5)
    assert got.tolist() == [True, False, True, True, True, True, False]
    assert core.zero_std_groups(rewards, valid, 3, 0.0).tolist() == [True, False, False, True, True, True, False]
    assert core.zero_std_groups(rewards, torch.zeros(21, dtype=torch.bool), 3, 0.0).all()


@PROPERTY
@given(
    data=st.data(),
    mask_zero_std=st.booleans(),
    exclude=st.booleans(),
    atol=st.sampled_from([0.0, 1e-6, 0.5]),
)
def test_decide_row_masks_matches_the_rule(data, mask_zero_std, exclude, atol):
    """Reasons, zero-variance groups (over valid rows only), trainable and stat_rows as SEMANTICS.md states."""
    batch = data.draw(batches(scales=GRID))
    g = batch.num_generations
    task = core.weighted_task_reward(batch.rewards_per_func, batch.reward_weights)
    unscorable = core.unscorable_rows(batch.rewards_per_func)
    truncated, rejected = bools(data.draw, batch.n), bools(data.draw, batch.n)
    masks = core.decide_row_masks(
        task,
        g,
        truncated=truncated,
        unscorable=unscorable,
        rejected=rejected,
        mask_zero_std_groups=mask_zero_std,
        zero_std_atol=atol,
        exclude_masked_from_baseline=exclude,
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
    assert torch.equal(masks.stat_rows, masks.trainable if exclude else ~unscorable)
    # The decision ignores the rewards of invalid rows.
    noise = row_values(data.draw, batch.n, 0.25)
    again = core.decide_row_masks(
        torch.where(invalid, noise, task),
        g,
        truncated=truncated,
        unscorable=unscorable,
        rejected=rejected,
        mask_zero_std_groups=mask_zero_std,
        zero_std_atol=atol,
        exclude_masked_from_baseline=exclude,
    )
    assert torch.equal(again.zero_std_groups, masks.zero_std_groups)
    assert torch.equal(again.trainable, masks.trainable)


@pytest.mark.parametrize("reason", ["truncated", "unscorable", "rejected"])
def test_group_of_tied_valid_rows_is_zero_variance_despite_a_differing_invalid_row(reason):
    """[1, 1, 1, 5] with the 5 invalid: the group is zero-variance, rows 0-2 masked as zero_std, row 3 by its reason."""
    task = torch.tensor([1.0, 1.0, 1.0, 5.0, 0.0, 1.0, 1.0, 1.0])
    flags = {name: torch.zeros(8, dtype=torch.bool) for name in ("truncated", "unscorable", "rejected")}
    flags[reason][3] = True
    if reason == "unscorable":
        task[3] = math.nan  # an unscorable row has a NaN task reward
    masks = core.decide_row_masks(task, 4, **flags)
    assert masks.zero_std_groups.tolist() == [True, False]
    assert masks.reasons["zero_std"].tolist() == [True, True, True, False, False, False, False, False]
    assert masks.reasons[reason].tolist() == [False, False, False, True] + [False] * 4
    assert masks.trainable.tolist() == [False] * 4 + [True] * 4
    assert torch.equal(masks.stat_rows, masks.trainable)
    kept = core.decide_row_masks(task, 4, exclude_masked_from_baseline=False, **flags)
    assert kept.stat_rows.tolist() == [True, True, True, reason != "unscorable"] + [True] * 4
    off = core.decide_row_masks(task, 4, mask_zero_std_groups=False, **flags)
    assert not off.zero_std_groups.any() and not off.reasons["zero_std"].any()
    assert off.trainable.tolist() == [True, True, True, False] + [True] * 4


def test_a_lone_valid_row_gets_zero_advantage_through_the_pipeline():
    """Group 0 has one valid row (others truncated): it is masked as zero_std and its advantage is 0 in every mode."""
    rewards = torch.tensor([[3.0], [0.0], [1.0], [0.0], [1.0], [3.0]])
    weights = torch.tensor([1.0])
    truncated = torch.tensor([False, True, True, False, False, False])
    none = torch.zeros(6, dtype=torch.bool)
    masks = core.decide_row_masks(
        core.weighted_task_reward(rewards, weights), 3, truncated=truncated, unscorable=none, rejected=none
    )
    assert masks.reasons["zero_std"].tolist() == [True, False, False, False, False, False]
    batch = Batch(rewards, weights, 3, torch.zeros(6))
    for label, adv in all_estimators(batch, masks.stat_rows).items():
        assert adv[:3].tolist() == [0.0, 0.0, 0.0], label
        assert (adv[3:] != 0).all(), label  # the other group still learns


# ----------------------------------------------------------------------------------------------------------------
# 6. Deterministic units
# ----------------------------------------------------------------------------------------------------------------


def test_weighted_task_reward_and_unscorable_rows():
    """Weighted NaN-skipping sum; NaN (and unscorable) only where every function gave None."""
    nan = math.nan
    rewards = torch.tensor([[1.0, 2.0], [nan, 2.0], [nan, nan], [0.0, nan]])
    got = core.weighted_task_reward(rewards, torch.tensor([2.0, -1.0]))
    assert got[:2].tolist() == [0.0, -2.0] and got[2].isnan() and got[3].item() == 0.0
    assert core.unscorable_rows(rewards).tolist() == [False, False, True, False]


def test_plan_loss_rows_keep_keeps_every_row():
    loss = torch.tensor([[1, 1], [0, 0], [0, 1], [0, 0]])
    base = torch.ones(4, 2, dtype=torch.long)
    rows = core.plan_loss_rows(loss, base, "keep")
    assert rows.kept.tolist() == [0, 1, 2, 3]
    assert rows.active.tolist() == [0, 2]


def test_plan_loss_rows_exclude_drops_our_masked_rows_and_keeps_truncated_ones():
    """Row 1 had tokens and lost them (ours: dropped); row 2 never had any (TRL's truncation: kept, inactive)."""
    base = torch.tensor([[1, 1], [1, 0], [0, 0], [1, 1], [1, 1]])
    loss = torch.tensor([[0, 0], [0, 0], [0, 0], [1, 1], [1, 0]])
    rows = core.plan_loss_rows(loss, base, "exclude")
    assert rows.kept.tolist() == [2, 3, 4]
    assert rows.active.tolist() == [1, 2]  # positions within `kept`, not batch indices


def test_plan_loss_rows_exclude_keeps_one_row_when_all_are_masked():
    base = torch.ones(3, 4)
    rows = core.plan_loss_rows(torch.zeros(3, 4), base, "exclude")
    assert rows.kept.tolist() == [0]
    assert rows.active.tolist() == []
    rows = core.plan_loss_rows(torch.zeros(3, 4), base, "keep")
    assert rows.kept.tolist() == [0, 1, 2] and rows.active.tolist() == []


def test_plan_loss_rows_rejects_unknown_normalization():
    with pytest.raises(ValueError, match="zero_std_normalization"):
        core.plan_loss_rows(torch.ones(2, 2), torch.ones(2, 2), "drop")


def test_mismatched_groups():
    assert core.mismatched_groups(["a", "a", "b", "b"], 2) == []
    assert core.mismatched_groups(["a", "b", "b", "b", "c", "c"], 2) == [0]
    assert core.mismatched_groups(["a", "a", "b", "b", "c", "d"], 2) == [2]
    assert core.mismatched_groups(["a", "a", "b", "b"], 4) == [0]
    chat = [[{"role": "user", "content": "1+1="}]] * 2 + [[{"role": "user", "content": "2+2="}]] * 2
    assert core.mismatched_groups(chat, 2) == []
    assert core.mismatched_groups(chat, 4) == [0]
    with pytest.raises(ValueError):
        core.mismatched_groups(["a"] * 5, 2)


def test_grouped_and_expand_groups():
    x = torch.arange(12).view(6, 2)
    assert core.grouped(x, 3).shape == (2, 3, 2)
    assert torch.equal(core.grouped(x, 3)[1, 0], torch.tensor([6, 7]))
    assert core.expand_groups(torch.tensor([True, False]), 3).tolist() == [True] * 3 + [False] * 3
    for bad in (4, 0):
        with pytest.raises(ValueError, match="whole number of groups"):
            core.grouped(torch.arange(6), bad)


def test_truncated_rows():
    """Tokens present but a zeroed loss mask; an empty (all-pad) row is not truncated."""
    pad = 0
    ids = torch.tensor([[5, 6, 7], [5, 2, 0], [0, 0, 0], [7, 0, 0]])
    mask = torch.tensor([[0, 0, 0], [1, 1, 0], [0, 0, 0], [1, 0, 0]])
    assert core.truncated_rows(ids, mask, pad).tolist() == [True, False, False, False]


def test_rejected_rows():
    """In sequence_mask mode a ratio (B, 1) of 0 rejects a row; other modes and no ratio reject none, even a token
    ratio of one-token completions, whose shape is (B, 1) too."""
    seq = torch.tensor([[1.0], [0.0], [0.5]])
    got = core.rejected_rows(seq, "sequence_mask", 3)
    assert got.dtype == torch.bool and got.tolist() == [False, True, False]
    assert core.rejected_rows(seq, "token_mask", 3).tolist() == [False, False, False]
    tokens = torch.tensor([[0.0, 0.0], [1.0, 0.0], [0.0, 1.0]])
    assert core.rejected_rows(tokens, "token_mask", 3).tolist() == [False, False, False]
    none = core.rejected_rows(None, "sequence_mask", 4)
    assert none.dtype == torch.bool and none.tolist() == [False] * 4


def test_advantage_estimator_registry():
    assert core.get_advantage_estimator("grpo") is core.grpo_advantages
    assert core.get_advantage_estimator("rloo") is core.rloo_advantages
    with pytest.raises(ValueError, match="ppo"):
        core.get_advantage_estimator("ppo")


def test_estimators_reject_unknown_modes():
    rewards, weights, stat = torch.zeros(4, 1), torch.ones(1), torch.ones(4, dtype=torch.bool)
    with pytest.raises(ValueError, match="scale_rewards"):
        core.grpo_advantages(rewards, weights, 2, stat, scale_rewards="global")
    with pytest.raises(ValueError, match="multi_objective_aggregation"):
        core.grpo_advantages(rewards, weights, 2, stat, multi_objective_aggregation="mean")
