"""``ZeroStdRLOOTrainer``: TRL's ``RLOOTrainer`` whose masked rows have no influence on training."""

from __future__ import annotations

import torch
from accelerate.utils import gather
from trl import RLOOTrainer

from . import core
from ._masking import RowMaskingMixin


class ZeroStdRLOOTrainer(RowMaskingMixin, RLOOTrainer):
    """Drop-in for ``trl.RLOOTrainer`` (same constructor). In training mode only, the rows of zero-variance groups
    and every other masked row (SEMANTICS.md) get advantage 0, a zero loss mask, ``old_logps`` 0 (ratio 1) and
    exactly zero gradient, and leave the leave-one-out baselines and the ``normalize_advantages`` statistics of the
    other rows. Eval is TRL's, bit for bit.

    Zero variance is decided on the weighted task reward *before* the KL penalty (TRL folds ``beta * KL`` into the
    reward, so a tied group would otherwise train on differences of KL terms). With ``reward_clip_range`` set it is
    decided on the clipped task reward, the reward the advantages are computed from: a group whose rewards all clip
    to the same bound carries no signal.
    """

    def __init__(self, *args, **kwargs):
        self._recorded_logps: list[tuple[torch.Tensor, torch.Tensor]] | None = None
        super().__init__(*args, **kwargs)
        self._init_row_masking()

    def _generate_and_score_completions(self, inputs):
        # follows RLOOTrainer._generate_and_score_completions (TRL 1.16): record its policy/reference log-probs
        if not self.model.training:
            return super()._generate_and_score_completions(inputs)
        self._recorded_logps = []
        try:
            return super()._generate_and_score_completions(inputs)
        finally:
            self._recorded_logps = None

    def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep, *args, **kwargs):
        # follows RLOOTrainer._get_per_token_logps_and_entropies (TRL 1.16): unchanged; while recording, keep the
        # log-probs and the completion mask TRL passed (attention_mask = cat([prompt_mask, completion_mask]))
        result = super()._get_per_token_logps_and_entropies(
            model, input_ids, attention_mask, logits_to_keep, *args, **kwargs
        )
        if self._recorded_logps is not None:
            self._recorded_logps.append((result[0], attention_mask[:, -logits_to_keep:]))
        return result

    def _kl_penalty(self) -> torch.Tensor | None:
        """Gathered ``(N,)`` ``beta * KL`` of TRL 1.16's RLOO: ``KL = sum over completion tokens of old - ref``."""
        if self.beta == 0.0:
            return None
        if self._recorded_logps is None or len(self._recorded_logps) != 2:
            raise RuntimeError(
                "Expected RLOOTrainer._generate_and_score_completions to compute the policy then the reference "
                f"log-probs (TRL 1.16), recorded {len(self._recorded_logps or [])} call(s)."
            )
        (old_per_token_logps, completion_mask), (ref_per_token_logps, _) = self._recorded_logps
        kl = ((old_per_token_logps - ref_per_token_logps) * completion_mask).sum(-1)
        return self.beta * gather(kl)

    def _task_rewards(self, rewards_per_func: torch.Tensor) -> torch.Tensor:
        rewards = core.weighted_task_reward(rewards_per_func, self.reward_weights)
        if self.reward_clip_range:
            rewards = rewards.clamp(min=self.reward_clip_range[0], max=self.reward_clip_range[1])
        return rewards

    def _row_advantages(self, rewards_per_func: torch.Tensor, stat_rows: torch.Tensor) -> torch.Tensor:
        return core.rloo_advantages(
            rewards_per_func,
            self.reward_weights,
            self.num_generations,
            stat_rows,
            kl_penalty=self._kl_penalty(),
            normalize_advantages=self.normalize_advantages,
            reward_clip_range=self.reward_clip_range,
        )

    def _finish_masked_output(self, output: dict, local_masked: torch.Tensor) -> None:
        # RLOO's loss takes the ratio against old_logps = (old_per_token_logps * completion_mask).sum(1): with the
        # masked rows' completion_mask zeroed, their old_logps is 0, so their ratio is 1 and their loss exactly 0.
        output["old_logps"] = output["old_logps"].masked_fill(local_masked, 0.0)
