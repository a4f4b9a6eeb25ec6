"""``ZeroStdGRPOTrainer``: TRL's ``GRPOTrainer`` whose masked rows have no influence on training."""

from __future__ import annotations

import torch
from trl import GRPOTrainer

from . import core
from ._masking import RowMaskingMixin


class ZeroStdGRPOTrainer(RowMaskingMixin, GRPOTrainer):
    """Drop-in for ``trl.GRPOTrainer`` (same constructor). In training mode only, the rows of zero-variance groups
    and every other masked row (SEMANTICS.md) get advantage 0, a zero loss mask and exactly zero gradient, KL term
    included, and leave the statistics of the other rows' advantages. Eval is TRL's, bit for bit."""

    def _token_mean_metrics(self) -> tuple[str, ...]:
        # Placeholders have KL 0, entropy 0, ratio 1 and advantage 0 (never clipped). TRL's clip ratios are token
        # means only at token-level importance sampling (row means otherwise).
        clip_ratios = ("clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/region_mean", "cispo_clip_ratio")
        return ("kl", "entropy", *(clip_ratios if self.importance_sampling_level == "token" else ()))

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._init_row_masking()

    def _row_advantages(self, rewards_per_func: torch.Tensor, stat_rows: torch.Tensor) -> torch.Tensor:
        return core.grpo_advantages(
            rewards_per_func,
            self.reward_weights,
            self.num_generations,
            stat_rows,
            scale_rewards=self.scale_rewards,
            multi_objective_aggregation=self.multi_objective_aggregation,
        )

    def _generation_outputs(self, generated: tuple) -> tuple[list[list[int]], list, dict]:
        # GRPOTrainer._generate (TRL 1.16) returns (prompt_ids, completion_ids, tool_mask, completions,
        # sampling_per_token_logps, extra_fields, images, tool_images)
        return generated[1], generated[3], generated[5]

    def _skips_scoring_forward(self, call: int) -> bool:
        # Under vLLM importance-sampling correction TRL's first scoring forward gives the old log-probs the ratio is
        # computed from, and a row's ratio can reject it: forward every row there (rejection is decided after it).
        return call > 0 or not (self.use_vllm and self.vllm_importance_sampling_correction)

    def _placeholder_inputs(self, inputs: dict, placeholders: torch.Tensor, base_loss_mask: torch.Tensor) -> dict:
        # TRL's token normalisers (bnpo, entropy bonus) read the loss mask: give placeholders their base tokens back.
        rows = placeholders.unsqueeze(1)
        inputs["completion_mask"] = torch.where(rows, base_loss_mask, inputs["completion_mask"])
        if inputs.get("tool_mask") is not None:
            inputs["tool_mask"] = torch.where(rows, torch.ones_like(inputs["tool_mask"]), inputs["tool_mask"])
        return inputs
