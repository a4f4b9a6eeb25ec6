"""The row plan of a generation batch (pure): one decision per batch of which rows train, which keep only their KL
term and which are out, with why; its metrics; and the rows each forward reads (scoring forwards, loss calls).

Shapes as in ``groups``: ``N`` gathered rows in groups of ``G``, ``B`` rows on one rank.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import IntEnum

import torch

from .groups import MASK_REASONS, expand_groups, grouped, tied_groups, zero_std_groups


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
    ``low_tied_groups``, ``high_tied_groups`` and ``tied_training_groups`` (the tied groups that train on their tie,
    ``tied_group_entropy_scale``) are ``(N // G,)`` bool. ``tied_sign`` ``(N,)`` float: +1 on the valid rows of a
    high-tied group that trains on its tie, -1 on a low-tied one's, 0 elsewhere; those rows train and are outside
    ``trainable``.
    """

    reasons: Mapping[str, torch.Tensor]
    role: torch.Tensor
    zero_std_groups: torch.Tensor
    low_tied_groups: torch.Tensor
    high_tied_groups: torch.Tensor
    tied_training_groups: torch.Tensor
    tied_sign: torch.Tensor

    @property
    def trainable(self) -> torch.Tensor:
        """The informative rows that train: the only ones any advantage statistic reads."""
        return (self.role == RowRole.TRAIN) & (self.tied_sign == 0)

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
    tied_groups_train: bool = False,
) -> RowPlan:
    """Apply the one rule (SEMANTICS.md) to a gathered batch.

    Truncated, unscorable and rejected rows are invalid. A group is zero-variance over its valid rows; its valid
    rows are masked with reason ``zero_std``. ``zero_std_kl`` keeps the KL term of the zero-variance rows tied at the
    low end of ``reward_range`` (the lowest and highest task rewards seen in training), or of all of them; while the
    range is one level (a constant reward so far), no group is low- or high-tied. ``tied_groups_train``: the valid
    rows of a low- or high-tied group with at least two of them train instead (``tied_sign``). ``truncated`` marks
    rows TRL already masks (``mask_truncated_completions``).
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
    learning, tied_sign = _tied_training(task_rewards, valid, num_generations, low_tied, high_tied, tied_groups_train)
    zero_std = expand_groups(zero_groups, num_generations) & valid & (tied_sign == 0)

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
        tied_training_groups=learning,
        tied_sign=tied_sign,
    )


def _tied_training(task_rewards, valid, num_generations, low_tied, high_tied, on: bool):
    """The ``(N // G,)`` tied groups that train on their tie (``on``: at least two rows the tie was decided on, valid
    and scored by the deciding functions) and the ``(N,)`` sign of those rows (+1 high-tied, -1 low-tied)."""
    tied_rows = valid & ~torch.isnan(task_rewards)
    learning = (low_tied | high_tied) & (grouped(tied_rows, num_generations).sum(dim=1) >= 2) & on
    return learning, expand_groups((high_tied.float() - low_tied.float()) * learning, num_generations) * tied_rows


def plan_metrics(
    plan: RowPlan, row_tokens: torch.Tensor, zero_std_kl: str, tied_groups_train: bool = False
) -> dict[str, float]:
    """Train metrics of one gathered batch's plan (shares of its groups, rows or loss tokens); ``row_tokens``
    ``(N,)``: TRL's loss tokens per row; ``tied_groups_train``: the share of tied groups that train is logged, 0
    included."""
    rows = torch.tensor(len(plan.role)).clamp(min=1)
    groups = torch.tensor(len(plan.zero_std_groups)).clamp(min=1)

    def share(mask: torch.Tensor, count: torch.Tensor) -> float:
        return (mask.sum() / count).item()

    metrics = {
        "zero_std/masked_group_frac": share(plan.zero_std_groups & ~plan.tied_training_groups, groups),
        "zero_std/all_low_group_frac": share(plan.low_tied_groups, groups),
        "zero_std/all_high_group_frac": share(plan.high_tied_groups, groups),
        "zero_std/masked_token_frac": share(row_tokens * plan.reasons["zero_std"], row_tokens.sum().clamp(min=1)),
    }
    if tied_groups_train:
        metrics["zero_std/tied_trained_group_frac"] = share(plan.tied_training_groups, groups)
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
