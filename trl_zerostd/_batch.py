"""The typed values of one training generation batch while TRL's method runs through the adapter's overrides."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from . import core


@dataclass
class GenerationBatch:
    """What one training generation batch carries between TRL's calls into our overrides.

    ``inputs``: this rank's dataset rows (TRL's list). ``generated``: what TRL's ``_generate`` returned (with dynamic
    sampling or prompt skipping, set before TRL's ``_generate_and_score_completions`` runs). ``preparing``: TRL's
    method is running only to prepare prompts (``_prepared_prompts``).
    ``rewards_per_func`` ``(N, K)``, ``truncated`` and ``empty`` (the slots of skipped prompts, ``skip_refill=False``)
    ``(N,)`` are gathered. ``scoring_logps``: the ``(B, T)`` log-probs and completion masks of TRL's scoring forwards,
    in call order (RLOO's KL penalty reads them).
    """

    inputs: list[dict]
    generated: tuple | None = None
    preparing: bool = False
    rewards_per_func: torch.Tensor | None = None
    truncated: torch.Tensor | None = None
    empty: torch.Tensor | None = None
    plan: core.RowPlan | None = None
    scoring_rows: torch.Tensor | None = None
    whole_old_forward: bool = False
    scoring_logps: list[tuple[torch.Tensor, torch.Tensor]] = field(default_factory=list)


class PreparedPrompts(Exception):  # noqa: N818 - not an error: carries TRL's prepared prompts out of its method
    """Raised by ``_generate`` while ``_prepared_prompts`` runs TRL's method only up to its ``_generate`` call."""

    def __init__(self, prompts: list):
        super().__init__()
        self.prompts = prompts


def merge_extra_fields(inputs: list[dict], extra_fields: dict) -> None:
    """Merge a rollout_func's ``extra_fields`` into ``inputs`` in place, as GRPOTrainer does (TRL 1.16) just before
    ``_calculate_rewards``: a list gives row ``i`` its ``i``-th value, anything else goes to every row."""
    for i, example in enumerate(inputs):
        for key, values in extra_fields.items():
            if not isinstance(values, list):
                example[key] = values
            elif i < len(values):
                example[key] = values[i]
