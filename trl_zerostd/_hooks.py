"""What the adapter (``_adapter.ZeroStdAdapter``) asks of a concrete trainer: where GRPO and RLOO differ (TRL 1.16)."""

from __future__ import annotations

from typing import Protocol

import torch

from . import core
from ._batch import GenerationBatch
from ._loss import LossCall


class TrainerHooks(Protocol):
    """Implemented by ``ZeroStdGRPOTrainer`` and ``ZeroStdRLOOTrainer``."""

    def _generated_rows(self, generated: tuple) -> tuple[list[list[int]], list, dict]:
        """``(completion_ids, completions, extra_fields)`` from what the trainer's ``_generate`` returned."""
        ...

    def _split_generated(self, generated: tuple) -> list[tuple]:
        """What the trainer's ``_generate`` returned, as one record per row (a refill regroups rows)."""
        ...

    def _join_generated(self, records: list[tuple]) -> tuple:
        """The inverse of ``_split_generated``: TRL's ``_generate`` layout for the given rows."""
        ...

    def _task_rewards(self, rewards_per_func: torch.Tensor) -> torch.Tensor:
        """``(N,)`` reward that decides zero variance."""
        ...

    def _advantage_options(self, batch: GenerationBatch) -> dict:
        """Keyword options of the trainer's advantage estimator (``estimators.py``)."""
        ...

    def _scoring_needed(self, plan: core.RowPlan) -> torch.Tensor:
        """``(N,)`` bool: rows whose scoring log-probs (old policy, reference) something reads."""
        ...

    def _rejection_mode(self) -> bool:
        """Whether a row can be rejected by the old-policy forward's importance ratio (GRPO under vLLM)."""
        ...

    def _rejected_rows(self, batch: GenerationBatch, old_logps: torch.Tensor, completion_mask: torch.Tensor):
        """``(N,)`` bool rows the old-policy forward's importance ratio rejects (gathered)."""
        ...

    def _loss_inputs(self, inputs: dict, call: LossCall, base_loss_mask: torch.Tensor) -> dict:
        """Trainer-specific inputs of TRL's loss for the rows it does not forward."""
        ...

    def _finish_output(self, output: dict, role: torch.Tensor) -> None:
        """Make trainer-specific outputs consistent with the rank's ``(B,)`` row roles."""
        ...
