"""Pure tensor math of the package: groups, row masks, advantages, loss-row plans.

Nothing here imports a trainer or TRL, so every function can be tested alone. Conventions:

- ``N`` rows (completions) in a batch, laid out as ``N // G`` groups of ``G = num_generations`` consecutive rows
  that share one prompt (TRL's ``RepeatSampler`` layout).
- ``K`` reward functions; ``rewards_per_func`` is ``(N, K)`` float, NaN where a function returned None.
- ``stat_rows`` is an ``(N,)`` bool mask of the rows allowed into any statistic (mean, std, leave-one-out
  baseline). A row outside it never moves another row's advantage and gets advantage exactly 0.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

STD_EPS = 1e-4  # TRL's epsilon in every advantage denominator

MASK_REASONS = ("zero_std", "truncated", "unscorable", "rejected")


def nanstd(x: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Bessel-corrected std ignoring NaNs; NaN where fewer than 2 values. Same arithmetic as TRL's ``nanstd``."""
    mean = torch.nanmean(x, dim=dim, keepdim=True)
    variance = torch.nanmean((x - mean) ** 2, dim=dim, keepdim=True)
    count = torch.sum(~torch.isnan(x), dim=dim, keepdim=True)
    correction = count / (count - 1)
    correction = torch.where(count > 1, correction, torch.full_like(correction, float("nan")))
    std = torch.sqrt(variance * correction)
    return std.squeeze() if dim is None else std.squeeze(dim)


def grouped(x: torch.Tensor, num_generations: int) -> torch.Tensor:
    """View ``(N, ...)`` as ``(N // G, G, ...)``; a batch that is not whole groups is a layout error."""
    if num_generations < 1 or x.shape[0] % num_generations != 0:
        raise ValueError(
            f"A batch of {x.shape[0]} rows is not a whole number of groups of num_generations={num_generations}."
        )
    return x.view(x.shape[0] // num_generations, num_generations, *x.shape[1:])


def weighted_task_reward(rewards_per_func: torch.Tensor, reward_weights: torch.Tensor) -> torch.Tensor:
    """``(N, K) -> (N,)`` weighted sum over reward functions, NaN-skipping; NaN where every function gave None."""
    rewards = (rewards_per_func * reward_weights.to(rewards_per_func.device).unsqueeze(0)).nansum(dim=1)
    return rewards.masked_fill(torch.isnan(rewards_per_func).all(dim=1), float("nan"))


def unscorable_rows(rewards_per_func: torch.Tensor) -> torch.Tensor:
    """``(N,)`` bool: every reward function returned None (NaN) for the row."""
    return torch.isnan(rewards_per_func).all(dim=1)


def zero_std_groups(
    rewards: torch.Tensor, valid_rows: torch.Tensor, num_generations: int, atol: float
) -> torch.Tensor:
    """``(N // G,)`` bool: groups with no learning signal.

    A group is zero-variance when, over its valid rows (``valid_rows`` and a non-NaN reward), the spread
    ``max - min`` of ``rewards`` is at most ``atol`` (reward units), or when it has fewer than 2 valid rows.
    Decided from the raw rewards, so it does not depend on any reward scaling.
    """
    valid = grouped(valid_rows & ~torch.isnan(rewards), num_generations)
    values = grouped(rewards, num_generations)
    high = values.masked_fill(~valid, float("-inf")).amax(dim=1)
    low = values.masked_fill(~valid, float("inf")).amin(dim=1)
    few_rows = valid.sum(dim=1) < 2
    return few_rows | ((high - low) <= atol)


def expand_groups(per_group: torch.Tensor, num_generations: int) -> torch.Tensor:
    """``(N // G, ...) -> (N, ...)``: broadcast a per-group value to each of the group's rows."""
    return per_group.repeat_interleave(num_generations, dim=0)


def mismatched_groups(prompts: Sequence[Any], num_generations: int) -> list[int]:
    """Indices of groups whose ``num_generations`` consecutive rows do not all carry the same prompt."""
    if num_generations < 1 or len(prompts) % num_generations != 0:
        raise ValueError(f"{len(prompts)} rows is not a whole number of groups of num_generations={num_generations}.")
    return [
        start // num_generations
        for start in range(0, len(prompts), num_generations)
        if any(p != prompts[start] for p in prompts[start + 1 : start + num_generations])
    ]


# --------------------------------------------------------------------------------------------------------------
# Advantage estimators. Each takes the gathered rewards and ``stat_rows`` and returns ``(N,)`` advantages that are
# finite everywhere and exactly 0 outside ``stat_rows``. With ``stat_rows = ~unscorable_rows(...)`` each equals
# TRL 1.16's own computation bit for bit.
# --------------------------------------------------------------------------------------------------------------

AdvantageEstimator = Callable[..., torch.Tensor]
ADVANTAGE_ESTIMATORS: dict[str, AdvantageEstimator] = {}


def register_advantage_estimator(name: str) -> Callable[[AdvantageEstimator], AdvantageEstimator]:
    def register(fn: AdvantageEstimator) -> AdvantageEstimator:
        ADVANTAGE_ESTIMATORS[name] = fn
        return fn

    return register


def get_advantage_estimator(name: str) -> AdvantageEstimator:
    if name not in ADVANTAGE_ESTIMATORS:
        raise ValueError(f"Unknown advantage estimator {name!r}; registered: {sorted(ADVANTAGE_ESTIMATORS)}.")
    return ADVANTAGE_ESTIMATORS[name]


def _finish(advantages: torch.Tensor, stat_rows: torch.Tensor) -> torch.Tensor:
    return torch.nan_to_num(advantages, nan=0.0).masked_fill(~stat_rows, 0.0)


@register_advantage_estimator("grpo")
def grpo_advantages(
    rewards_per_func: torch.Tensor,
    reward_weights: torch.Tensor,
    num_generations: int,
    stat_rows: torch.Tensor,
    scale_rewards: str = "group",
    multi_objective_aggregation: str = "sum_then_normalize",
) -> torch.Tensor:
    """GRPO advantages (follows ``GRPOTrainer._generate_and_score_completions``, TRL 1.16) over ``stat_rows`` only.

    Rows outside ``stat_rows`` are NaN before any statistic, so they leave every group mean and std, the batch std
    of ``scale_rewards="batch"`` and the per-function statistics of ``normalize_then_sum``.
    """
    weights = reward_weights.to(rewards_per_func.device).unsqueeze(0)
    n = num_generations
    if multi_objective_aggregation == "sum_then_normalize":
        rewards = (rewards_per_func * weights).nansum(dim=1).masked_fill(~stat_rows, float("nan"))
        mean = expand_groups(torch.nanmean(grouped(rewards, n), dim=1), n)
        if scale_rewards in ("group", "none"):
            std = expand_groups(nanstd(grouped(rewards, n), dim=1), n) if n > 1 else torch.zeros_like(rewards)
        elif scale_rewards == "batch":
            std = nanstd(rewards).expand_as(rewards) if rewards.numel() > 1 else torch.zeros_like(rewards)
        else:
            raise ValueError(f"scale_rewards must be 'group', 'batch' or 'none', got {scale_rewards!r}.")
        advantages = rewards - mean
        if scale_rewards != "none":
            advantages = advantages / (std + STD_EPS)
    elif multi_objective_aggregation == "normalize_then_sum":
        per_func = grouped(rewards_per_func.masked_fill(~stat_rows.unsqueeze(1), float("nan")), n)
        mean_k = torch.nanmean(per_func, dim=1, keepdim=True)
        std_k = nanstd(per_func, dim=1).unsqueeze(1) if n > 1 else torch.zeros_like(mean_k)
        normalized = ((per_func - mean_k) / (std_k + STD_EPS)).view(-1, rewards_per_func.shape[1])
        rewards = (normalized * weights).nansum(dim=1).masked_fill(~stat_rows, float("nan"))
        std = nanstd(rewards).expand_as(rewards) if rewards.numel() > 1 else torch.zeros_like(rewards)
        advantages = (rewards - torch.nanmean(rewards)) / (std + STD_EPS)
    else:
        raise ValueError(
            "multi_objective_aggregation must be 'sum_then_normalize' or 'normalize_then_sum', "
            f"got {multi_objective_aggregation!r}."
        )
    return _finish(advantages, stat_rows)


@register_advantage_estimator("rloo")
def rloo_advantages(
    rewards_per_func: torch.Tensor,
    reward_weights: torch.Tensor,
    num_generations: int,
    stat_rows: torch.Tensor,
    kl_penalty: torch.Tensor | None = None,
    normalize_advantages: bool = False,
    reward_clip_range: tuple[float, float] | None = None,
) -> torch.Tensor:
    """RLOO advantages (follows ``RLOOTrainer._generate_and_score_completions``, TRL 1.16) over ``stat_rows`` only.

    ``kl_penalty`` is ``beta * KL`` per row, ``(N,)``, subtracted from the reward before the leave-one-out baseline.
    Each row's baseline is the mean over the other ``stat_rows`` of its group; ``normalize_advantages`` takes its
    batch mean and std over ``stat_rows`` only.
    """
    rewards = weighted_task_reward(rewards_per_func, reward_weights)
    if reward_clip_range:
        rewards = rewards.clamp(min=reward_clip_range[0], max=reward_clip_range[1])
    if kl_penalty is not None:
        rewards = rewards - kl_penalty
    rewards = rewards.masked_fill(~stat_rows, float("nan"))
    if num_generations > 1:
        group_rewards = grouped(rewards, num_generations)
        counts = (~torch.isnan(group_rewards)).sum(dim=1, keepdim=True)
        sums = torch.nansum(group_rewards, dim=1, keepdim=True)
        baselines = ((sums - group_rewards) / (counts - 1)).view(-1)
        advantages = rewards - baselines
    else:
        advantages = torch.zeros_like(rewards)
    if normalize_advantages:
        advantages = (advantages - torch.nanmean(advantages)) / (nanstd(advantages) + STD_EPS)
    return _finish(advantages, stat_rows)


# --------------------------------------------------------------------------------------------------------------
# Row masks
# --------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RowMasks:
    """Why each row of the gathered batch is masked, and what enters the statistics. All ``(N,)`` bool."""

    reasons: dict[str, torch.Tensor]  # one entry per MASK_REASONS
    zero_std_groups: torch.Tensor  # (N // G,)
    trainable: torch.Tensor  # rows that keep their loss tokens and advantage
    stat_rows: torch.Tensor  # rows allowed into the statistics other rows' advantages come from

    @property
    def masked(self) -> torch.Tensor:
        return ~self.trainable


def decide_row_masks(
    task_rewards: torch.Tensor,
    num_generations: int,
    *,
    truncated: torch.Tensor,
    unscorable: torch.Tensor,
    rejected: torch.Tensor,
    mask_zero_std_groups: bool = True,
    zero_std_atol: float = 1e-6,
    exclude_masked_from_baseline: bool = True,
) -> RowMasks:
    """Apply the one rule (SEMANTICS.md) to a gathered batch.

    Rows that are truncated, unscorable or rejected are invalid. A group is zero-variance over its valid rows
    (``zero_std_groups``); its valid rows are masked with reason ``zero_std``. ``stat_rows`` are the trainable rows
    when ``exclude_masked_from_baseline``, else every scorable row (TRL's own statistics).
    """
    invalid = truncated | unscorable | rejected
    if mask_zero_std_groups:
        zero_groups = zero_std_groups(task_rewards, ~invalid, num_generations, zero_std_atol)
    else:
        zero_groups = torch.zeros(task_rewards.shape[0] // num_generations, dtype=torch.bool, device=invalid.device)
    zero_std = expand_groups(zero_groups, num_generations) & ~invalid
    trainable = ~(invalid | zero_std)
    stat_rows = trainable if exclude_masked_from_baseline else ~unscorable
    reasons = {"zero_std": zero_std, "truncated": truncated, "unscorable": unscorable, "rejected": rejected}
    return RowMasks(reasons=reasons, zero_std_groups=zero_groups, trainable=trainable, stat_rows=stat_rows)


def truncated_rows(completion_ids: torch.Tensor, completion_mask: torch.Tensor, pad_token_id: int) -> torch.Tensor:
    """``(B,)`` bool: rows that TRL's ``mask_truncated_completions`` zeroed (tokens present, loss mask all zero)."""
    return (completion_mask.sum(dim=1) == 0) & (completion_ids != pad_token_id).any(dim=1)


def rejected_rows(importance_sampling_ratio: torch.Tensor | None, mode: str | None, batch_size: int) -> torch.Tensor:
    """``(B,)`` bool: rows that vLLM importance sampling in ``mode="sequence_mask"`` rejected (ratio ``(B, 1)`` 0).

    Other modes truncate or mask tokens and reject no whole row; the shape alone cannot tell a sequence ratio from a
    token ratio of a one-token completion, hence ``mode``.
    """
    if importance_sampling_ratio is None or mode != "sequence_mask":
        return torch.zeros(batch_size, dtype=torch.bool)
    return importance_sampling_ratio.view(-1) == 0


# --------------------------------------------------------------------------------------------------------------
# Loss rows
# --------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LossRows:
    """Which rows of a micro-batch the loss sees, and which of those train.

    ``kept``: indices into the micro-batch of the rows handed to the loss (the others are dropped: they leave
    every normaliser). ``active``: positions within ``kept`` of rows with an active loss token. The other kept rows
    are placeholders: zero contribution and zero gradient, yet counted by the row and token normalisers.
    """

    kept: torch.Tensor
    active: torch.Tensor


def plan_loss_rows(loss_mask: torch.Tensor, base_loss_mask: torch.Tensor, normalization: str) -> LossRows:
    """Plan the loss micro-batch from the ``(B, T)`` loss mask after and before this package's masking.

    ``"keep"`` keeps every row so each normaliser is the base trainer's. ``"exclude"`` drops the rows this package
    masked (tokens before, none after); rows TRL masks itself (truncated) stay, as in TRL. At least one row is
    always kept so every rank runs the same forward and collectives.
    """
    if normalization not in ("keep", "exclude"):
        raise ValueError(f"zero_std_normalization must be 'keep' or 'exclude', got {normalization!r}.")
    active = loss_mask.sum(dim=1) > 0
    keep = torch.ones_like(active)
    if normalization == "exclude":
        keep = active | (base_loss_mask.sum(dim=1) == 0)
        if not keep.any():
            keep[0] = True
    kept = keep.nonzero(as_tuple=True)[0]
    return LossRows(kept=kept, active=active[kept].nonzero(as_tuple=True)[0])
