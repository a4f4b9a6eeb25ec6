"""``ZeroStdRLOOTrainer``: TRL's ``RLOOTrainer`` whose masked rows have no influence on training."""

from __future__ import annotations

from typing import Any

import torch
from accelerate.utils import gather
from trl import RLOOTrainer

from .. import core
from ..core.advantages import clipped_task_reward, rloo_advantages
from . import trl_layout
from .adapter import ZeroStdAdapter
from .batch import GenerationBatch
from .loss import LossCall


class ZeroStdRLOOTrainer(ZeroStdAdapter, RLOOTrainer):
    """Drop-in for ``trl.RLOOTrainer`` (same constructor). In training mode only, the rows of zero-variance groups
    and every other masked row (SEMANTICS.md) get advantage 0, a zero loss mask, ``old_logps`` 0 (ratio 1) and
    exactly zero gradient, and leave the leave-one-out baselines and the ``normalize_advantages`` statistics of the
    other rows. Eval is TRL's, bit for bit.

    Zero variance is decided on the weighted task reward *before* the KL penalty (TRL folds ``beta * KL`` into the
    reward, so a tied group would otherwise train on differences of KL terms). With ``reward_clip_range`` set it is
    decided on the clipped task reward, the reward the advantages are computed from.

    The masked rows are not forwarded while scoring, so TRL sees their KL as 0. Only two of its logs change: ``kl``
    (their tokens stay in its denominator) and ``frac_reward_zero_std`` (computed on the KL-penalised reward: a
    skipped tied group now counts as zero-std).
    """

    trainer_kind = "rloo"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._init_zero_std()

    def _generate_single_turn(  # type: ignore[override]  # RLOO's signature; the adapter is typed by GRPOTrainer's
        self, prompt_ids: list, images: list | None, multimodal_fields: dict
    ) -> list[list[int]]:
        # follows RLOOTrainer._generate_single_turn (TRL 1.14.1-1.16): TRL's, in the adapter's engine calls; RLOO reads
        # the completions per prompt it asks vLLM for from num_generations, so a call asking fewer sets it for the call
        def decode(ids: list, call_images: list | None, fields: dict, copies: int) -> list[list[int]]:
            with trl_layout.copies_per_prompt(self, copies):
                return RLOOTrainer._generate_single_turn(self, ids, call_images, fields)

        calls = self._engine_calls(prompt_ids, images, multimodal_fields, self._group_size, decode)
        return [row for part in calls for row in part]

    def _generated_rows(self, generated: tuple) -> tuple[list[list[int]], list, dict]:
        out = trl_layout.RLOOGenerated(*generated)  # RLOO (1.14.1-1.16) has no extra fields
        return out.completion_ids, out.completions, {}

    def _split_generated(self, generated: tuple, rows: list[dict]) -> list[tuple]:
        return trl_layout.split_rloo(generated)

    def _join_generated(self, records: list[tuple]) -> tuple:
        return trl_layout.join_rloo(records)

    def _hands_over_in_place(self, last_round_rows: list[dict], rows_that_train: list[dict]) -> bool:
        """Without images: RLOO's method reads its rows' images before ``_generate`` (TRL's rloo_trainer.py,
        1.14.1-1.16), so with images the rows that train get a pass of their own (RLOO prepares prompts with no side
        effect)."""
        return (
            trl_layout.dataset_images(last_round_rows) is None and trl_layout.dataset_images(rows_that_train) is None
        )

    def _task_rewards(self, rewards_per_func: torch.Tensor) -> torch.Tensor:
        return clipped_task_reward(
            rewards_per_func, self.reward_weights, self.reward_clip_range, self._state.decisive_funcs
        )

    def _advantages(self, batch: GenerationBatch) -> torch.Tensor:
        generation, plan = batch.generation, batch.plan
        assert generation is not None and plan is not None, "advantages are computed under the batch's plan"
        return rloo_advantages(
            generation.rewards_per_func, self.reward_weights, self._group_size, plan.trainable,
            kl_penalty=self._kl_penalty(batch), normalize_advantages=self.normalize_advantages,
            reward_clip_range=self.reward_clip_range,
        )  # fmt: skip

    def _rejection_mode(self) -> bool:
        return False  # RLOO (1.14.1-1.16) has no importance-sampling rejection

    def _rejected_rows(self, batch: GenerationBatch, old_logps: torch.Tensor, completion_mask: torch.Tensor):
        raise NotImplementedError("RLOO rejects no row (_rejection_mode is False).")

    def _loss_inputs(self, inputs: dict, call: LossCall, base_loss_mask: torch.Tensor) -> dict:
        return inputs  # the rows not forwarded already have ratio 1 (old_logps 0, _finish_output)

    def _kl_penalty(self, batch: GenerationBatch) -> torch.Tensor | None:
        """Gathered ``(N,)`` ``beta * KL`` of TRL's RLOO: ``KL = sum over completion tokens of old - ref``."""
        if self.beta == 0.0:
            return None
        if len(batch.scoring_logps) != 2:
            raise RuntimeError(
                "Expected RLOOTrainer._generate_and_score_completions to compute the policy then the reference "
                f"log-probs (TRL 1.14.1-1.16), saw {len(batch.scoring_logps)} scoring forward(s)."
            )
        (old_per_token_logps, completion_mask), (ref_per_token_logps, _) = batch.scoring_logps
        kl = ((old_per_token_logps - ref_per_token_logps) * completion_mask).sum(-1)
        return self.beta * gather(kl)

    def _finish_output(self, output: dict, role: torch.Tensor) -> None:
        # RLOO's loss takes the ratio against old_logps = (old_per_token_logps * completion_mask).sum(1): with the
        # masked rows' completion_mask zeroed, their old_logps is 0, so their ratio is 1 and their loss exactly 0.
        output["old_logps"] = output["old_logps"].masked_fill(role < core.RowRole.KL_ONLY, 0.0)
