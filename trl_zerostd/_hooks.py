"""What the adapter (``_adapter.ZeroStdAdapter``) asks of a concrete trainer: where GRPO and RLOO differ (TRL 1.16).

Abstract: a trainer that lacks one of these cannot be built (Python's ``abc`` refuses it at construction).
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch

from ._batch import GenerationBatch
from ._loss import LossCall


class TrainerHooks(ABC):
    """Implemented by ``ZeroStdGRPOTrainer`` and ``ZeroStdRLOOTrainer``."""

    @abstractmethod
    def _generated_rows(self, generated: tuple) -> tuple[list[list[int]], list, dict]:
        """``(completion_ids, completions, extra_fields)`` from what the trainer's ``_generate`` returned."""

    @abstractmethod
    def _split_generated(self, generated: tuple) -> list[tuple]:
        """What the trainer's ``_generate`` returned, as one record per row (a refill regroups rows)."""

    @abstractmethod
    def _join_generated(self, records: list[tuple]) -> tuple:
        """The inverse of ``_split_generated``: TRL's ``_generate`` layout for the given rows."""

    @abstractmethod
    def _task_rewards(self, rewards_per_func: torch.Tensor) -> torch.Tensor:
        """``(N,)`` reward that decides zero variance."""

    @abstractmethod
    def _advantages(self, batch: GenerationBatch) -> torch.Tensor:
        """``(N,)`` gathered advantages of the batch under its plan (``estimators.py``), before masked rows are
        zeroed."""

    @abstractmethod
    def _rejection_mode(self) -> bool:
        """Whether a row can be rejected by the old-policy forward's importance ratio (GRPO under vLLM)."""

    @abstractmethod
    def _rejected_rows(self, batch: GenerationBatch, old_logps: torch.Tensor, completion_mask: torch.Tensor):
        """``(N,)`` bool rows the old-policy forward's importance ratio rejects (gathered)."""

    @abstractmethod
    def _loss_inputs(self, inputs: dict, call: LossCall, base_loss_mask: torch.Tensor) -> dict:
        """Trainer-specific inputs of TRL's loss for the rows it does not forward."""

    @abstractmethod
    def _finish_output(self, output: dict, role: torch.Tensor) -> None:
        """Make trainer-specific outputs consistent with the rank's ``(B,)`` row roles."""
