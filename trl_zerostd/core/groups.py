"""Rows and groups of a generation batch (pure): task rewards, the rows each mask reason takes out, tied and
zero-variance groups, the reward range.

Nothing in ``core`` imports a trainer or TRL, so every function can be tested alone. Conventions:

- ``N`` rows (completions) in a gathered batch, laid out as ``N // G`` groups of ``G = num_generations``
  consecutive rows that share one prompt (TRL's ``RepeatSampler`` layout); ``B`` rows on one rank.
- ``K`` reward functions; ``rewards_per_func`` is ``(N, K)`` float, NaN where a function returned None.
- Masks are ``(N,)`` or ``(B,)`` bool; rewards are in the reward functions' units.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

MASK_REASONS = ("zero_std", "truncated", "unscorable", "rejected")


def grouped(x: torch.Tensor, num_generations: int) -> torch.Tensor:
    """View ``(N, ...)`` as ``(N // G, G, ...)``; a batch that is not whole groups is a layout error."""
    if num_generations < 1 or x.shape[0] % num_generations != 0:
        raise ValueError(
            f"A batch of {x.shape[0]} rows is not a whole number of groups of num_generations={num_generations}."
        )
    return x.view(x.shape[0] // num_generations, num_generations, *x.shape[1:])


def expand_groups(per_group: torch.Tensor, num_generations: int) -> torch.Tensor:
    """``(N // G, ...) -> (N, ...)``: broadcast a per-group value to each of the group's rows."""
    return per_group.repeat_interleave(num_generations, dim=0)


def weighted_task_reward(
    rewards_per_func: torch.Tensor, reward_weights: torch.Tensor, decisive: torch.Tensor | None = None
) -> torch.Tensor:
    """``(N, K) -> (N,)`` weighted sum over reward functions, NaN-skipping; NaN where every function gave None.
    ``decisive`` ``(K,)`` bool: the sum over those functions only (``zero_std_reward_funcs``), NaN where each of them
    gave None."""
    if decisive is not None:
        rewards_per_func = rewards_per_func[:, decisive.to(rewards_per_func.device)]
        reward_weights = reward_weights[decisive.to(reward_weights.device)]
    rewards = (rewards_per_func * reward_weights.to(rewards_per_func.device).unsqueeze(0)).nansum(dim=1)
    return rewards.masked_fill(unscorable_rows(rewards_per_func), float("nan"))


def decisive_functions(names: Sequence[str], chosen: Sequence[str] | None) -> torch.Tensor | None:
    """``(K,)`` bool: the reward functions among ``names`` (TRL's ``reward_func_names``) that ``chosen``
    (``zero_std_reward_funcs``) names; None when ``chosen`` is None (all decide). An unknown name is a ValueError."""
    if chosen is None:
        return None
    unknown = [name for name in chosen if name not in names]
    shared = [name for name in chosen if list(names).count(name) > 1]
    if shared:
        raise ValueError(
            f"zero_std_reward_funcs names {shared}, which more than one reward function of this trainer is called "
            f"({list(names)}): give them distinct names (a def, or a __name__)."
        )
    if unknown:
        raise ValueError(
            f"zero_std_reward_funcs names {unknown}, which are not reward functions of this trainer: its reward "
            f"functions are {list(names)} (a function's __name__, a reward model's name)."
        )
    return torch.tensor([name in chosen for name in names], dtype=torch.bool)


def unscorable_rows(rewards_per_func: torch.Tensor) -> torch.Tensor:
    """``(N,)`` bool: every reward function returned None (NaN) for the row."""
    return torch.isnan(rewards_per_func).all(dim=1)


def truncated_rows(completion_ids: Sequence[Sequence[int]], stop_token_ids: Sequence[int]) -> torch.Tensor:
    """``(B,)`` bool: completions that end without a stop token (EOS or pad), TRL's own truncation test."""
    stop = set(stop_token_ids)
    return torch.tensor([len(ids) > 0 and ids[-1] not in stop for ids in completion_ids], dtype=torch.bool)


def rejected_rows(
    old_logps: torch.Tensor,
    sampling_logps: torch.Tensor,
    loss_mask: torch.Tensor,
    clip_min: float | None,
    clip_max: float | None,
) -> torch.Tensor:
    """``(B,)`` bool: rows that vLLM importance sampling in ``"sequence_mask"`` mode gives ratio 0.

    The same arithmetic as TRL 1.16: ``exp(sum over loss tokens of old - sampling)`` (NaN differences count 0)
    outside ``[clip_min, clip_max]``. ``old_logps``/``sampling_logps``/``loss_mask`` are ``(B, T)``.
    """
    log_ratio = torch.nan_to_num((old_logps - sampling_logps) * loss_mask, nan=0.0).sum(dim=-1)
    ratio = torch.exp(log_ratio)
    low = clip_min if clip_min is not None else -float("inf")
    high = clip_max if clip_max is not None else float("inf")
    return (ratio < low) | (ratio > high)


def zero_std_groups(
    rewards: torch.Tensor, valid_rows: torch.Tensor, num_generations: int, atol: float
) -> torch.Tensor:
    """``(N // G,)`` bool: groups with no learning signal.

    A group is zero-variance when, over its valid rows (``valid_rows`` and a non-NaN reward), the spread
    ``max - min`` of ``rewards`` is at most ``atol`` (reward units), or when it has fewer than 2 valid rows.
    Decided from the raw rewards, so it does not depend on any reward scaling.
    """
    low, high, count = _valid_extremes(rewards, valid_rows, num_generations)
    return (count < 2) | ((high - low) <= atol)


def tied_groups(
    rewards: torch.Tensor,
    valid_rows: torch.Tensor,
    num_generations: int,
    atol: float,
    level: float | None,
) -> torch.Tensor:
    """``(N // G,)`` bool: groups with at least one valid row, all within ``atol`` of ``level`` (None: no group).

    With ``level`` the lowest task reward seen in training, these are the groups that failed together (binary
    verifier: all wrong); with the highest, those that all succeeded.
    """
    low, high, count = _valid_extremes(rewards, valid_rows, num_generations)
    if level is None:
        return torch.zeros_like(count, dtype=torch.bool)
    return (count > 0) & ((high - level).abs() <= atol) & ((low - level).abs() <= atol)


def _valid_extremes(rewards, valid_rows, num_generations):
    valid = grouped(valid_rows & ~torch.isnan(rewards), num_generations)
    values = grouped(rewards, num_generations)
    low = values.masked_fill(~valid, float("inf")).amin(dim=1)
    high = values.masked_fill(~valid, float("-inf")).amax(dim=1)
    return low, high, valid.sum(dim=1)


def mismatched_groups(prompts: Sequence[Any], num_generations: int) -> list[int]:
    """Indices of groups whose ``num_generations`` consecutive rows do not all carry the same prompt."""
    if num_generations < 1 or len(prompts) % num_generations != 0:
        raise ValueError(f"{len(prompts)} rows is not a whole number of groups of num_generations={num_generations}.")
    return [
        start // num_generations
        for start in range(0, len(prompts), num_generations)
        if any(p != prompts[start] for p in prompts[start + 1 : start + num_generations])
    ]


def check_groups_share_prompt(prompts: Sequence[Any], num_generations: int) -> None:
    """Raise ValueError naming the groups of a gathered batch's ``prompts`` (one per row) that mix prompts."""
    bad_groups = mismatched_groups(prompts, num_generations)
    if bad_groups:
        first = bad_groups[0] * num_generations
        raise ValueError(
            f"Group(s) {bad_groups} of the generation batch mix dataset prompts (rows {first}.."
            f"{first + num_generations - 1}); each group must be num_generations={num_generations} consecutive rows "
            "of one prompt, as TRL's RepeatSampler gives them. Check a custom sampler, dataloader or rollout_func."
        )


def widen_reward_range(
    reward_range: tuple[float, float] | None, task_rewards: torch.Tensor, valid_rows: torch.Tensor
) -> tuple[float, float] | None:
    """The lowest and highest valid task reward seen so far, ``reward_range`` widened by this batch's."""
    values = task_rewards[valid_rows & ~torch.isnan(task_rewards)]
    if values.numel() == 0:
        return reward_range
    low, high = values.min().item(), values.max().item()
    if reward_range is None:
        return low, high
    return min(reward_range[0], low), max(reward_range[1], high)
