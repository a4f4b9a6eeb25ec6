"""Advantage estimators over the rows allowed into the statistics: ``grpo_advantages`` and ``rloo_advantages``, plain
functions each trainer calls from its ``_advantages`` hook.

Every estimator takes ``(rewards_per_func (N, K), reward_weights (K,), num_generations, stat_rows (N,) bool,
**options)`` and returns ``(N,)`` advantages, finite everywhere and exactly 0 outside ``stat_rows``. A row outside
``stat_rows`` never moves another row's advantage. With ``stat_rows = ~unscorable_rows(...)`` each equals TRL 1.16's
own computation bit for bit (property-tested). Pure tensor code: no trainer or TRL import.
"""

from __future__ import annotations

import torch

from .groups import expand_groups, grouped, weighted_task_reward

STD_EPS = 1e-4  # TRL's epsilon in every advantage denominator


def nanstd(x: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Bessel-corrected std ignoring NaNs; NaN where fewer than 2 values. Same arithmetic as TRL's ``nanstd``."""
    mean = torch.nanmean(x, dim=dim, keepdim=True)
    variance = torch.nanmean((x - mean) ** 2, dim=dim, keepdim=True)
    count = torch.sum(~torch.isnan(x), dim=dim, keepdim=True)
    correction = count / (count - 1)
    correction = torch.where(count > 1, correction, torch.full_like(correction, float("nan")))
    std = torch.sqrt(variance * correction)
    return std.squeeze() if dim is None else std.squeeze(dim)


def _finish(advantages: torch.Tensor, stat_rows: torch.Tensor) -> torch.Tensor:
    return torch.nan_to_num(advantages, nan=0.0).masked_fill(~stat_rows, 0.0)


def _batch_std(rewards: torch.Tensor) -> torch.Tensor:
    return nanstd(rewards).expand_as(rewards) if rewards.numel() > 1 else torch.zeros_like(rewards)


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
            std = _batch_std(rewards)
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
        advantages = (rewards - torch.nanmean(rewards)) / (_batch_std(rewards) + STD_EPS)
    else:
        raise ValueError(
            "multi_objective_aggregation must be 'sum_then_normalize' or 'normalize_then_sum', "
            f"got {multi_objective_aggregation!r}."
        )
    return _finish(advantages, stat_rows)


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
    rewards = clipped_task_reward(rewards_per_func, reward_weights, reward_clip_range)
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


def clipped_task_reward(
    rewards_per_func: torch.Tensor,
    reward_weights: torch.Tensor,
    reward_clip_range: tuple[float, float] | None,
    decisive: torch.Tensor | None = None,
) -> torch.Tensor:
    """RLOO's task reward: the weighted sum (over the ``decisive`` functions, ``weighted_task_reward``), clipped to
    ``reward_clip_range`` when set (NaN for unscorable rows)."""
    rewards = weighted_task_reward(rewards_per_func, reward_weights, decisive)
    if reward_clip_range:
        rewards = rewards.clamp(min=reward_clip_range[0], max=reward_clip_range[1])
    return rewards


def entropy_shaped_advantages(
    tied_sign: torch.Tensor, entropies: torch.Tensor, loss_mask: torch.Tensor, scale: float
) -> torch.Tensor:
    """RL-ZVP's token advantages (arXiv 2509.21880) for the rows of tied groups that train on their tie.

    ``tied_sign`` ``(B,)``: +1 (an all-right group), -1 (all-wrong), 0 (no signal); ``entropies`` ``(B, T)``: the
    policy's token entropies (nats; read as constants); ``loss_mask`` ``(B, T)``. An all-right row's token gets
    ``scale * H(t)``: its uncertain tokens, where it could have gone wrong, are reinforced most. An all-wrong row gets
    ``-scale * (max_k H(k) - H(t))``, max over the row's loss tokens: its confident tokens are pushed down most.
    Returns ``(B, T)``, 0 outside ``loss_mask`` and on rows of sign 0.
    """
    mask = loss_mask.to(entropies.dtype)
    entropy = entropies.detach() * mask
    peak = entropy.amax(dim=1, keepdim=True)  # entropies are >= 0, so masked tokens (0) never raise it
    sign = tied_sign.to(entropies.dtype).unsqueeze(1)
    shaped = torch.where(sign > 0, entropy, peak - entropy)
    return scale * sign * shaped * mask
