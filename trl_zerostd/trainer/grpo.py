"""``ZeroStdGRPOTrainer``: TRL's ``GRPOTrainer`` whose masked rows have no influence on training."""

from __future__ import annotations

from typing import Any

import torch
from accelerate.utils import gather
from trl import GRPOTrainer

from .. import core
from ..core.advantages import grpo_advantages
from . import trl_layout
from .adapter import ZeroStdAdapter
from .batch import GenerationBatch
from .loss import LossCall


class ZeroStdGRPOTrainer(ZeroStdAdapter, GRPOTrainer):
    """Drop-in for ``trl.GRPOTrainer`` (same constructor). In training mode only, the rows of zero-variance groups
    and every other masked row (SEMANTICS.md) get advantage 0, a zero loss mask and exactly zero gradient, KL term
    included (unless ``zero_std_kl`` keeps it), and leave the statistics of the other rows' advantages and TRL's
    token statistics. Eval is TRL's, bit for bit."""

    trainer_kind = "grpo"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._init_zero_std()

    def _generate_single_turn(
        self,
        prompt_ids: list,
        images: list | None,
        multimodal_fields: dict,
        num_generations: int,
        has_tool_images: bool = False,
    ) -> tuple[list[list[int]], list | None]:
        # follows GRPOTrainer._generate_single_turn (TRL 1.14.1-1.16): TRL's, in the adapter's engine calls
        def decode(ids: list, call_images: list | None, fields: dict, copies: int) -> tuple:
            generate_single_turn = super(ZeroStdGRPOTrainer, self)._generate_single_turn
            return generate_single_turn(ids, call_images, fields, copies, has_tool_images)

        calls = self._engine_calls(prompt_ids, images, multimodal_fields, num_generations, decode)
        if len(calls) == 1:
            return calls[0]
        logprobs = None if calls[0][1] is None else [row for _, part in calls for row in part]
        return [row for part, _ in calls for row in part], logprobs

    def _generated_rows(self, generated: tuple) -> tuple[list[list[int]], list, dict]:
        out = trl_layout.GRPOGenerated(*generated)
        return out.completion_ids, out.completions, out.extra_fields

    def _split_generated(self, generated: tuple, rows: list[dict]) -> list[tuple]:
        return trl_layout.split_grpo(generated, rows)

    def _join_generated(self, records: list[tuple]) -> tuple:
        return trl_layout.join_grpo(records)

    def _hands_over_in_place(self, last_round_rows: list[dict], rows_that_train: list[dict]) -> bool:
        """GRPO's method reads the images ``_generate`` returns; only where that is none does it take the images of
        the round's rows (read before the call), which must then be none too."""
        no_images = trl_layout.dataset_images(rows_that_train) is None
        return not no_images or trl_layout.dataset_images(last_round_rows) is None

    def _task_rewards(self, rewards_per_func: torch.Tensor) -> torch.Tensor:
        return core.weighted_task_reward(rewards_per_func, self.reward_weights, self._state.decisive_funcs)

    def _finish_output(self, output: dict, role: torch.Tensor) -> None:
        """Nothing beyond the adapter's: GRPO's loss reads the masks and advantages it set."""

    def _advantages(self, batch: GenerationBatch) -> torch.Tensor:
        generation, plan = batch.generation, batch.plan
        assert generation is not None and plan is not None, "advantages are computed under the batch's plan"
        return grpo_advantages(
            generation.rewards_per_func, self.reward_weights, self._group_size, plan.trainable,
            scale_rewards=self.scale_rewards, multi_objective_aggregation=self.multi_objective_aggregation,
        )  # fmt: skip

    def _rejection_mode(self) -> bool:
        # Under vLLM importance-sampling correction the old-policy forward gives the ratio (and its logged
        # statistics) TRL computes from every row, and in "sequence_mask" mode that ratio can reject a row.
        return bool(self.use_vllm and self.vllm_importance_sampling_correction)

    def _rejected_rows(self, batch: GenerationBatch, old_logps: torch.Tensor, completion_mask: torch.Tensor):
        rejected = torch.zeros(len(old_logps), dtype=torch.bool, device=old_logps.device)
        if self.vllm_importance_sampling_mode == "sequence_mask":
            assert batch.generation is not None, "the old-policy forward follows the batch's generation"
            generated = trl_layout.GRPOGenerated(*batch.generation.generated)
            tool_mask, sampling_logps = generated.tool_mask, generated.sampling_per_token_logps
            assert sampling_logps is not None, "vLLM's sampling log-probs come with importance sampling"
            mask = completion_mask if tool_mask is None else completion_mask * padded(tool_mask, old_logps, 1.0)
            rejected = core.rejected_rows(
                old_logps,
                padded(sampling_logps, old_logps, 0.0),
                mask,
                self.vllm_importance_sampling_clip_min,
                self.vllm_importance_sampling_clip_max,
            )
        return gather(rejected)

    def _loss_inputs(self, inputs: dict, call: LossCall, base_loss_mask: torch.Tensor) -> dict:
        role = call.rows.role.to(base_loss_mask.device).unsqueeze(1)
        if inputs.get("ref_per_token_logps") is not None:  # KL exactly 0 on the rows not forwarded
            inputs["ref_per_token_logps"] = torch.where(
                role < core.RowRole.KL_ONLY, call.fill_logps, inputs["ref_per_token_logps"]
            )
        if self.loss_type == "bnpo" and self._state.settings.zero_std_normalization == "keep":
            # bnpo's normaliser counts the micro-batch's loss-mask tokens: give our masked rows theirs back
            out = role == core.RowRole.OUT
            inputs["completion_mask"] = torch.where(out, base_loss_mask, inputs["completion_mask"])
            if inputs.get("tool_mask") is not None:
                inputs["tool_mask"] = torch.where(out, torch.ones_like(inputs["tool_mask"]), inputs["tool_mask"])
        return inputs

    def get_high_entropy_mask(self, entropies: torch.Tensor, mask: torch.Tensor, threshold: float) -> torch.Tensor:
        # follows GRPOTrainer.get_high_entropy_mask (TRL 1.14.1-1.16): the quantile over policy rows (rule 3)
        if isinstance(self._loss_call, LossCall):  # not a Mock(spec=...) attribute, as in TRL's own tests
            mask = mask * self._loss_call.rows.policy.to(mask.device).unsqueeze(1).to(mask.dtype)
        return super().get_high_entropy_mask(entropies, mask, threshold)


def padded(rows: list[list[float | None]], like: torch.Tensor, value: float) -> torch.Tensor:
    """Per-row lists right-padded with ``value`` to ``like``'s ``(B, T)`` shape; None becomes NaN (as in TRL)."""
    out = torch.full_like(like, value)
    for i, row in enumerate(rows):
        out[i, : len(row)] = torch.tensor([float("nan") if x is None else x for x in row], dtype=like.dtype)
    return out
