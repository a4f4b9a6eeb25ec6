"""What the adapter (``adapter.ZeroStdAdapter``) asks of a concrete trainer: where GRPO and RLOO differ.

Abstract: a trainer that lacks one of these cannot be built (Python's ``abc`` refuses it at construction).
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch

from .batch import GenerationBatch
from .loss import LossCall


class TrainerHooks(ABC):
    """Implemented by ``ZeroStdGRPOTrainer`` and ``ZeroStdRLOOTrainer``."""

    @abstractmethod
    def _generated_rows(self, generated: tuple) -> tuple[list[list[int]], list, dict]:
        """``(completion_ids, completions, extra_fields)`` from what the trainer's ``_generate`` returned."""

    @abstractmethod
    def _split_generated(self, generated: tuple, rows: list[dict]) -> list[tuple]:
        """What the trainer's ``_generate`` returned for ``rows`` (this rank's dataset rows), as one record per row (a
        refill regroups rows)."""

    @abstractmethod
    def _join_generated(self, records: list[tuple]) -> tuple:
        """The inverse of ``_split_generated``: TRL's ``_generate`` layout for the given rows."""

    @abstractmethod
    def _hands_over_in_place(self, last_round_rows: list[dict], rows_that_train: list[dict]) -> bool:
        """Whether the pass of TRL's method over ``last_round_rows`` (this rank's) can go on with ``rows_that_train``
        in their place: what it reads after ``_generate`` comes from its ``inputs`` and ``prompts`` lists and from
        what ``_generate`` returns, and nothing it computed before the call from the round's rows (images) differs."""

    @abstractmethod
    def _task_rewards(self, rewards_per_func: torch.Tensor) -> torch.Tensor:
        """``(N,)`` reward that decides zero variance."""

    @abstractmethod
    def _advantages(self, batch: GenerationBatch) -> torch.Tensor:
        """``(N,)`` gathered advantages of the batch under its plan (``core/advantages.py``), before masked rows are
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
