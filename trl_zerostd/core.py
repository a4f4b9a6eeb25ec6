"""Pure tensor math of the package: groups, row masks, the row plan of a batch, and the rows each forward reads.

Nothing here imports a trainer or TRL, so every function can be tested alone. Conventions:

- ``N`` rows (completions) in a gathered batch, laid out as ``N // G`` groups of ``G = num_generations``
  consecutive rows that share one prompt (TRL's ``RepeatSampler`` layout); ``B`` rows on one rank.
- ``K`` reward functions; ``rewards_per_func`` is ``(N, K)`` float, NaN where a function returned None.
- Masks are ``(N,)`` or ``(B,)`` bool; rewards are in the reward functions' units.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import IntEnum
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


# --------------------------------------------------------------------------------------------------------------
# The row plan: one decision per generation batch
# --------------------------------------------------------------------------------------------------------------


class RowRole(IntEnum):
    """What the loss does with a row. Ordered: a role at or above ``KL_ONLY`` is forwarded in the loss."""

    OUT = 0  # masked by this package: no term at all; a placeholder under "keep", dropped under "exclude"
    TRL_MASKED = 1  # masked by TRL itself (truncated): no term, and TRL's normalisers as TRL has them
    KL_ONLY = 2  # a zero-variance row that keeps its KL term (zero_std_kl), and only it
    TRAIN = 3  # trains: policy term, KL term, entropy bonus


@dataclass(frozen=True)
class RowPlan:
    """Why each row of a gathered batch is masked and what every later step reads from it.

    ``reasons`` maps each of ``MASK_REASONS`` to an ``(N,)`` bool mask; ``role`` is ``(N,)`` ``RowRole`` values; the
    ``trainable`` rows are the only ones allowed into any statistic (group mean and std, leave-one-out baseline, batch
    std) that other rows' advantages come from, and a row outside them gets advantage exactly 0. ``zero_std_groups``,
    ``low_tied_groups`` and ``high_tied_groups`` are ``(N // G,)`` bool.
    """

    reasons: Mapping[str, torch.Tensor]
    role: torch.Tensor
    zero_std_groups: torch.Tensor
    low_tied_groups: torch.Tensor
    high_tied_groups: torch.Tensor

    @property
    def trainable(self) -> torch.Tensor:
        return self.role == RowRole.TRAIN

    @property
    def masked(self) -> torch.Tensor:
        return self.role != RowRole.TRAIN

    @property
    def forwarded(self) -> torch.Tensor:
        """Rows whose log-probs the loss reads (the policy's, the reference's, the old policy's)."""
        return self.role >= RowRole.KL_ONLY


def decide_row_plan(
    task_rewards: torch.Tensor,
    num_generations: int,
    *,
    truncated: torch.Tensor,
    unscorable: torch.Tensor,
    rejected: torch.Tensor,
    mask_zero_std_groups: bool = True,
    zero_std_atol: float = 1e-6,
    zero_std_kl: str = "mask",
    reward_range: tuple[float, float] | None = None,
) -> RowPlan:
    """Apply the one rule (SEMANTICS.md) to a gathered batch.

    Truncated, unscorable and rejected rows are invalid. A group is zero-variance over its valid rows; its valid
    rows are masked with reason ``zero_std``. ``zero_std_kl`` keeps the KL term of the zero-variance rows tied at the
    low end of ``reward_range`` (the lowest and highest task rewards seen in training), or of all of them; while the
    range is one level (a constant reward so far), no group is low- or high-tied. ``truncated`` marks rows TRL already
    masks (``mask_truncated_completions``).
    """
    valid = ~(truncated | unscorable | rejected)
    if mask_zero_std_groups:
        zero_groups = zero_std_groups(task_rewards, valid, num_generations, zero_std_atol)
    else:
        zero_groups = torch.zeros(task_rewards.shape[0] // num_generations, dtype=torch.bool, device=valid.device)
    low, high = reward_range if reward_range is not None else (None, None)
    if low is not None and high is not None and high - low <= zero_std_atol:  # both None or neither
        low = high = None  # one level seen: a group tied at it has neither failed nor succeeded against another
    low_tied = zero_groups & tied_groups(task_rewards, valid, num_generations, zero_std_atol, low)
    high_tied = zero_groups & ~low_tied & tied_groups(task_rewards, valid, num_generations, zero_std_atol, high)
    zero_std = expand_groups(zero_groups, num_generations) & valid

    role = torch.full_like(task_rewards, RowRole.TRAIN, dtype=torch.long)
    keeps_kl = {"mask": torch.zeros_like(zero_groups), "keep_failed": low_tied, "keep": zero_groups}[zero_std_kl]
    role[zero_std] = RowRole.OUT
    role[zero_std & expand_groups(keeps_kl, num_generations)] = RowRole.KL_ONLY
    role[unscorable | rejected] = RowRole.OUT
    role[truncated] = RowRole.TRL_MASKED
    return RowPlan(
        reasons={"zero_std": zero_std, "truncated": truncated, "unscorable": unscorable, "rejected": rejected},
        role=role,
        zero_std_groups=zero_groups,
        low_tied_groups=low_tied,
        high_tied_groups=high_tied,
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


def plan_metrics(plan: RowPlan, row_tokens: torch.Tensor, zero_std_kl: str) -> dict[str, float]:
    """Train metrics of one gathered batch's plan (shares of its groups, rows or loss tokens); ``row_tokens``
    ``(N,)``: TRL's loss tokens per row."""
    rows = torch.tensor(len(plan.role)).clamp(min=1)
    groups = torch.tensor(len(plan.zero_std_groups)).clamp(min=1)

    def share(mask: torch.Tensor, count: torch.Tensor) -> float:
        return (mask.sum() / count).item()

    metrics = {
        "zero_std/masked_group_frac": share(plan.zero_std_groups, groups),
        "zero_std/all_low_group_frac": share(plan.low_tied_groups, groups),
        "zero_std/all_high_group_frac": share(plan.high_tied_groups, groups),
        "zero_std/masked_token_frac": share(row_tokens * plan.reasons["zero_std"], row_tokens.sum().clamp(min=1)),
    }
    if zero_std_kl != "mask":
        metrics["zero_std/kl_kept_row_frac"] = share(plan.role == RowRole.KL_ONLY, rows)
    for reason in MASK_REASONS:
        metrics[f"masked/row_frac/{reason}"] = share(plan.reasons[reason], rows)
    return metrics


# --------------------------------------------------------------------------------------------------------------
# Which rows each forward reads
# --------------------------------------------------------------------------------------------------------------


def forward_rows(needed: torch.Tensor, rank: int) -> torch.Tensor | None:
    """This rank's rows for a scoring forward, from the gathered ``(world_size, B)`` bool ``needed``.

    Every rank forwards as many rows, the most needed rows any rank has (at least one): TRL chunks the forward by a
    fixed batch size, so every rank makes the same number of model calls (DDP, ZeRO-3/FSDP gathers). A rank with
    fewer pads with rows it does not need. Returns ``(R,)`` row indices, or None when the rank forwards every row.
    """
    count = max(int(needed.sum(dim=1).max()), 1)
    if count == needed.shape[1]:
        return None
    return torch.argsort((~needed[rank]).int(), stable=True)[:count]


@dataclass(frozen=True)
class LossRows:
    """Which rows of a micro-batch TRL's loss sees and which it forwards.

    ``kept``: indices into the micro-batch of the rows handed to the loss (the others leave every normaliser).
    ``role``: their ``RowRole`` values. Rows below ``KL_ONLY`` are placeholders: constant log-probs, zero loss and
    gradient, yet counted by the row normalisers.
    """

    kept: torch.Tensor
    role: torch.Tensor

    @property
    def forwarded(self) -> torch.Tensor:
        """Positions within ``kept`` of the rows whose log-probs the loss reads."""
        return (self.role >= RowRole.KL_ONLY).nonzero(as_tuple=True)[0]

    @property
    def policy(self) -> torch.Tensor:
        """``(len(kept),)`` bool: rows with a policy term, the only ones TRL's token statistics may read (rule 3)."""
        return self.role == RowRole.TRAIN


def loss_rows(role: torch.Tensor, normalization: str) -> torch.Tensor:
    """``(B,)`` bool: the rows of a micro-batch TRL's loss must see. ``"keep"``: every row; ``"exclude"``: not the
    rows this package masked (``RowRole.OUT``; rows TRL masks itself stay, as in TRL)."""
    return torch.ones_like(role, dtype=torch.bool) if normalization == "keep" else role > RowRole.OUT


def loss_rows_needed(role: torch.Tensor, normalization: str) -> int:
    """How many rows ``loss_rows`` names, at least one."""
    return max(int(loss_rows(role, normalization).sum()), 1)


def plan_loss_rows(role: torch.Tensor, normalization: str, rows: int | None = None) -> LossRows:
    """Plan the loss micro-batch from the ``(B,)`` row roles: the rows ``loss_rows`` names, then, up to ``rows``
    (every rank hands TRL's loss as many rows: it gathers one value per row across ranks), the first of the others as
    placeholders with a zero loss mask, which only the normalisers that count rows see."""
    keep = loss_rows(role, normalization)
    padding = max(rows or 1, int(keep.sum()), 1) - int(keep.sum())
    keep[(~keep).nonzero(as_tuple=True)[0][:padding]] = True
    kept = keep.nonzero(as_tuple=True)[0]
    return LossRows(kept=kept, role=role[kept])
