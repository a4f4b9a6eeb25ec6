"""The typed values of one training generation batch while TRL's method runs through the adapter's overrides."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

import torch

from . import core


class Phase(Enum):
    """Where a generation batch is in TRL's ``_generate_and_score_completions`` (docs/flow.md)."""

    PREPARE = "prepare"  # TRL's method runs only up to its _generate call, which hands the prepared prompts back
    GENERATE = "generate"  # TRL's _generate generates the batch's rows (or gives back the refill's)
    SCORE = "score"  # generated and scored: TRL runs its scoring forwards (the plan decides which rows)


@dataclass(frozen=True)
class Generation:
    """What was generated for a batch's rows and how it scored: what TRL's ``_generate`` returns for this rank's
    rows, the gathered ``(N, K)`` rewards and ``(N,)`` truncation."""

    generated: tuple
    rewards_per_func: torch.Tensor
    truncated: torch.Tensor


@dataclass
class GenerationBatch:
    """What one training generation batch carries between TRL's calls into our overrides.

    ``inputs``: this rank's dataset rows (TRL's list, or the refill's). ``generation``: set once the rows are
    generated and scored (by the refill before TRL's method runs, or in ``_generate``). ``plan``: the gathered batch's
    ``RowPlan``, decided once; ``scoring_rows``: each rank's rows of the scoring forwards. ``scoring_logps``: the
    ``(B, T)`` log-probs and completion masks of TRL's scoring forwards, in call order (RLOO's KL penalty reads them).
    """

    inputs: list[dict]
    phase: Phase = Phase.GENERATE
    generation: Generation | None = None
    plan: core.RowPlan | None = None
    scoring_rows: torch.Tensor | None = None
    scoring_logps: list[tuple[torch.Tensor, torch.Tensor]] = field(default_factory=list)
