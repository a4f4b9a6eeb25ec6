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

    With ``skip_masked_rows`` the masked rows outside the statistics (all masked rows by default) are not forwarded
    while scoring (``_scoring``), so TRL sees their KL as 0. Only two of its logs change: ``kl`` (their tokens stay in
    its denominator) and ``frac_reward_zero_std`` (computed on the KL-penalised reward: a skipped tied group now
    counts as zero-std).
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._init_row_masking()

    def _generation_outputs(self, generated: tuple) -> tuple[list[list[int]], list, dict]:
        # RLOOTrainer._generate (TRL 1.16) returns (prompt_ids, completion_ids, completions); no extra fields
        return generated[1], generated[2], {}

    def _scoring_skippable(self, masks: core.RowMasks) -> torch.Tensor:
        # A row's KL enters the reward, hence the baselines, of the rows it shares statistics with (stat_rows)
        return masks.masked & ~masks.stat_rows

    def _kl_penalty(self) -> torch.Tensor | None:
        """Gathered ``(N,)`` ``beta * KL`` of TRL 1.16's RLOO: ``KL = sum over completion tokens of old - ref``."""
        if self.beta == 0.0:
            return None
        if self._recorded_logps is None or len(self._recorded_logps) != 2:
            raise RuntimeError(
                "Expected RLOOTrainer._generate_and_score_completions to compute the policy then the reference "
                f"log-probs (TRL 1.16) within _scoring, recorded {len(self._recorded_logps or [])} call(s)."
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
