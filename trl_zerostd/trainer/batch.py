"""The typed values of one training generation batch while TRL's method runs through the adapter's overrides."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

import torch

from .. import core

if TYPE_CHECKING:
    from .refill_passes import RefillPasses
    from .state import ZeroStdState


@dataclass(frozen=True)
class Generation:
    """What was generated for a batch's rows and how it scored: what TRL's ``_generate`` returns for this rank's
    rows, the gathered ``(N, K)`` rewards and ``(N,)`` truncation."""

    generated: tuple
    rewards_per_func: torch.Tensor
    truncated: torch.Tensor


class RowRecord(NamedTuple):
    """A refill round's row as the trainer keeps it: the prompt TRL prepared for it (images in the messages, its
    environment's observation appended) and its share of what ``_generate`` returned (``_split_generated``)."""

    prompt: Any
    generated: tuple


@dataclass
class GenerationBatch:
    """What one training generation batch carries between TRL's calls into our overrides.

    ``inputs``: this rank's dataset rows (the list TRL's method was given). ``generation``: set once the rows are
    generated and scored. ``plan``: the gathered batch's ``RowPlan``, decided once; ``scoring_rows``: each rank's
    rows of the scoring forwards. ``scoring_logps``: the ``(B, T)`` log-probs and completion masks of TRL's scoring
    forwards, in call order (RLOO's KL penalty reads them). ``refill``: with dynamic sampling or prompt skipping, the
    refill running through TRL's method (None once its rows that train get a pass of their own).
    """

    inputs: list[dict]
    generation: Generation | None = None
    plan: core.RowPlan | None = None
    scoring_rows: torch.Tensor | None = None
    scoring_logps: list[tuple[torch.Tensor, torch.Tensor]] = field(default_factory=list)
    refill: RefillPasses | None = None

    def decide_plan(
        self,
        state: ZeroStdState,
        task_reward: Callable[[torch.Tensor], torch.Tensor],
        rejected: torch.Tensor,
        group_size: int,
        world_size: int,
        rank: int,
    ) -> None:
        """The batch's ``RowPlan``, decided once on its scored generation (``task_reward``: the trainer's, from the
        ``(N, K)`` rewards; ``rejected``: ``(N,)``), and this rank's rows of the scoring forwards (those the loss
        reads)."""
        generation = self.generation
        assert generation is not None, "the plan is decided on the batch's generation, once it is scored"
        rewards = generation.rewards_per_func
        self.plan = state.decide_plan(task_reward(rewards), rewards, generation.truncated, rejected, group_size)
        self.scoring_rows = core.forward_rows(self.plan.forwarded.view(world_size, -1), rank)
