"""The loss side of the plumbing: TRL's loss on the rows of a micro-batch that its row roles give it.

Each micro-batch carries its rows' ``RowRole`` (``row_role``, shuffled and split with the batch by TRL). Under
``"keep"`` every row is handed to TRL's loss, so its row and ``num_items_in_batch`` normalisers are the base ones;
under ``"exclude"`` the rows this package masked are dropped.
Every rank hands the loss as many rows as the rank that needs most, padding with its own dropped rows: TRL's loss
gathers one value per row across ranks, which needs equal counts. Of the rows handed over, only those that train
(policy or KL term) are forwarded; the others are placeholders with a zero loss mask and constant log-probs: importance
ratio 1, KL 0, entropy 0, loss and gradient exactly 0. With a zero loss mask they also stay out of every token
statistic TRL takes over the mask (entropy quantile, adaptive-entropy mean, logged kl/entropy/clip ratios).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from .. import core
from ..core.advantages import entropy_shaped_advantages
from ..core.settings import ZeroStdArguments, tied_groups_train
from . import trl_layout

# per-row loss-time data carried in TRL's batch dict
ROLE_KEY, BASE_LOSS_MASK_KEY, TIED_SIGN_KEY = "row_role", "base_loss_mask", "tied_sign"


def select_rows(fields: dict, rows: torch.Tensor, batch_size: int) -> dict:
    """The given ``rows`` of a dict of batch fields (TRL's batch, or a forward's keyword arguments): per-row tensors
    (first dimension ``batch_size``) and lists indexed; image fields, which are flat over images, patches or tiles,
    split per row by TRL's ``split_pixel_values_by_grid``, indexed, and joined again; anything else as it is."""
    images = fields.get("pixel_values") is not None and fields.get("num_images") is not None
    if images:  # TRL's split reads a key's presence: a forward's keyword arguments name absent fields with None
        present = trl_layout.split_pixel_values_by_grid(
            {key: value for key, value in fields.items() if value is not None}
        )
        fields = {key: present.get(key) for key in fields}
    index = rows.tolist()
    selected = {}
    for key, value in fields.items():
        if isinstance(value, torch.Tensor) and value.ndim > 0 and value.shape[0] == batch_size:
            value = value[rows.to(value.device)]
        elif isinstance(value, list) and len(value) == batch_size:
            value = [value[i] for i in index]
        selected[key] = value
    if not images:
        return selected
    joined = trl_layout.unsplit_pixel_values_by_grid(
        {key: value for key, value in selected.items() if value is not None}
    )
    return {key: joined.get(key) for key in selected}


ABS_ADVANTAGE_KINDS = ("tied", "tied_high", "tied_low", "informative")


@dataclass(frozen=True)
class TiedTokens:
    """The micro-batch's rows under ``tied_group_entropy_scale > 0``: ``sign`` ``(B,)`` (``RowPlan.tied_sign``: +-1 on
    the rows that train on their group's tie, 0 elsewhere), ``loss_mask`` ``(B, T)`` and ``scale``. ``advantages``
    ``(B, T)``: where some row is tied, the tensor TRL's loss reads as ``inputs["advantages"]``, into which
    ``loss_forward`` writes the tied rows' entropy-shaped advantages from the policy forward's entropies (TRL's
    ``_compute_loss`` computes them before it reads the advantages); elsewhere a view of TRL's ``(B,)`` ones."""

    sign: torch.Tensor
    loss_mask: torch.Tensor
    scale: float
    advantages: torch.Tensor

    def abs_advantage_sums(self, trained: torch.Tensor) -> torch.Tensor:
        """``(4, 2)``: per kind of row (``ABS_ADVANTAGE_KINDS``: tied, all-right, all-wrong, and the informative rows
        among the ``(B,)`` bool ``trained``), the sum of |advantage| over its loss tokens and their count, from
        ``advantages`` once filled. Sums, so that ranks add them before the ratio (``abs_advantage_means``)."""
        tokens = self.loss_mask.float()
        size, tokens = (self.advantages.abs().float() * tokens).sum(1), tokens.sum(1)
        sign = self.sign.to(size.device)
        kinds = [sign != 0, sign > 0, sign < 0, trained.to(sign.device) & (sign == 0)]
        return torch.stack([torch.stack([size[rows].sum(), tokens[rows].sum()]) for rows in kinds])

    def fill(self, entropies: torch.Tensor) -> None:
        rows = self.sign != 0
        if not rows.any():
            return
        shaped = entropy_shaped_advantages(self.sign, entropies, self.loss_mask, self.scale)
        self.advantages[rows] = shaped[rows].to(self.advantages.dtype)


def abs_advantage_means(sums: torch.Tensor) -> dict[str, float]:
    """Mean |advantage| per loss token of each kind of row from ``TiedTokens.abs_advantage_sums`` (summed over
    ranks); a kind no rank has is left out."""
    return {
        f"zero_std/{kind}_adv_abs_mean": float(size / tokens)
        for kind, (size, tokens) in zip(ABS_ADVANTAGE_KINDS, sums.tolist(), strict=True)
        if tokens > 0
    }


@dataclass(frozen=True)
class LossCall:
    """One micro-batch's loss: its ``rows``, the ``(B, T)`` constant log-probs of the rows it does not forward and,
    under ``tied_group_entropy_scale``, its ``tied`` tokens (on every rank, with or without tied rows)."""

    rows: core.LossRows
    fill_logps: torch.Tensor
    tied: TiedTokens | None = None

    def tied_metrics(self, sum_over_ranks: Callable[[torch.Tensor], torch.Tensor]) -> dict[str, float]:
        """``abs_advantage_means`` once the loss ran, the sums added over ranks by ``sum_over_ranks`` (a collective:
        every rank has ``tied`` under ``tied_group_entropy_scale``); none without it."""
        if self.tied is None:
            return {}
        return abs_advantage_means(sum_over_ranks(self.tied.abs_advantage_sums(self.rows.policy)))


def mark_rows(output: dict, role: torch.Tensor, advantages: torch.Tensor, tied_sign: torch.Tensor) -> torch.Tensor:
    """This rank's ``(B,)`` row roles, advantages and tied signs into TRL's ``output``: a row the loss does not forward
    gets a zero completion (and tool) mask, and each row's role, tied sign and base loss mask (completion tokens, tool
    tokens out) travel with the batch to the loss. Returns the ``(B, T)`` base loss mask."""
    mask = output["completion_mask"]
    loss_mask = mask * output["tool_mask"] if output.get("tool_mask") is not None else mask
    forwarded = (role >= core.RowRole.KL_ONLY).unsqueeze(1).to(loss_mask.dtype)
    output["advantages"] = advantages.to(output["advantages"])
    output["completion_mask"] = output["completion_mask"] * forwarded
    if output.get("tool_mask") is not None:
        output["tool_mask"] = output["tool_mask"] * forwarded
    output[ROLE_KEY], output[BASE_LOSS_MASK_KEY], output[TIED_SIGN_KEY] = role, loss_mask, tied_sign.to(role.device)
    return loss_mask


def loss_call(
    inputs: dict, settings: ZeroStdArguments, most_rows: Callable[[int], int]
) -> tuple[dict, LossCall, torch.Tensor]:
    """A micro-batch (``inputs``, TRL's with ``mark_rows``'s keys) for TRL's loss under ``settings`` (its
    ``zero_std_normalization``): its rows (``core.plan_loss_rows``; ``most_rows(n)``: the most rows any rank needs,
    every rank calls it), the ``LossCall`` and the ``(B', T)`` base loss mask of the rows kept. Where a row trains on
    its group's tie the advantages are ``(B', T)``, the tied rows' filled at the policy forward (``TiedTokens``,
    ``tied_group_entropy_scale``)."""
    normalization, inputs = settings.zero_std_normalization, dict(inputs)
    role, base_loss_mask = inputs.pop(ROLE_KEY), inputs.pop(BASE_LOSS_MASK_KEY)
    tied_sign = inputs.pop(TIED_SIGN_KEY)
    rows = core.plan_loss_rows(role.cpu(), normalization, most_rows(core.loss_rows_needed(role.cpu(), normalization)))
    kept = rows.kept.to(role.device)
    if len(kept) < len(role):
        inputs = select_rows(inputs, kept, len(role))
    fill = inputs.get("old_per_token_logps")
    fill = torch.zeros(inputs["completion_ids"].shape, device=role.device) if fill is None else fill
    tied = None
    if tied_groups_train(settings):  # on every rank: its metrics are summed over ranks
        advantages = inputs["advantages"].unsqueeze(1).expand_as(fill)
        if tied_sign[kept].any():  # TRL's loss reads (B, T) advantages only where a row is shaped
            advantages = advantages.clone()
            inputs["advantages"] = advantages
        tied = TiedTokens(tied_sign[kept], base_loss_mask[kept], settings.tied_group_entropy_scale, advantages)
    return inputs, LossCall(rows=rows, fill_logps=fill, tied=tied), base_loss_mask[kept]


def loss_forward(call: LossCall, forward, model, input_ids, attention_mask, logits_to_keep, *args, **kwargs):
    """The loss's policy forward (``forward``: TRL's ``_get_per_token_logps_and_entropies``) of the rows that train;
    the others get ``call.fill_logps`` and zero entropy, as constants. With none, one row is still forwarded at zero
    weight, so every rank runs the same forward and collectives (DDP, ZeRO-3/FSDP gathers), and a MoE auxiliary loss
    gets zero weight."""
    device = input_ids.device
    forwarded = call.rows.forwarded.to(device)
    rows = forwarded if len(forwarded) else torch.zeros(1, dtype=torch.long, device=device)
    kwargs = select_rows(kwargs, rows, input_ids.shape[0])
    logps, entropies, aux_loss = forward(model, input_ids[rows], attention_mask[rows], logits_to_keep, *args, **kwargs)

    def place(fill: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        if len(forwarded) == 0:  # `out` is the zero-weight row's
            return fill.to(out.dtype) + 0.0 * out.sum()
        return fill.to(out.dtype).index_put((forwarded,), out)

    if entropies is not None:  # a row kept for its KL term gets no entropy bonus: its entropy is a constant
        kl_only = (call.rows.role.to(device)[forwarded] == core.RowRole.KL_ONLY).unsqueeze(1)
        entropies = place(torch.zeros_like(call.fill_logps), torch.where(kl_only, entropies.detach(), entropies))
        if call.tied is not None:
            call.tied.fill(entropies)
    elif call.tied is not None:
        raise RuntimeError("Tied groups' entropy-shaped advantages need the loss forward's entropies: TRL asks.")
    if aux_loss is not None and len(forwarded) == 0:
        aux_loss = 0.0 * aux_loss
    return place(call.fill_logps, logps), entropies, aux_loss


def rows_forward(rows, forward, model, input_ids, attention_mask, logits_to_keep, *args, **kwargs):
    """A scoring forward (``forward``: TRL's ``_get_per_token_logps_and_entropies``) of the ``(R,)`` ``rows`` only
    (None: every row); the others get log-probs 0, which nothing reads."""
    if rows is None:
        return forward(model, input_ids, attention_mask, logits_to_keep, *args, **kwargs)
    rows = rows.to(input_ids.device)
    kwargs = select_rows(kwargs, rows, input_ids.shape[0])
    logps, entropies, aux_loss = forward(model, input_ids[rows], attention_mask[rows], logits_to_keep, *args, **kwargs)
    return logps.new_zeros(input_ids.shape[0], logits_to_keep).index_put((rows,), logps), entropies, aux_loss
