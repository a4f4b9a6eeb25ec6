"""Prompt skipping, the pure part: a per-prompt record of zero-variance outcomes, and the probability of drawing a
prompt again, which shrinks with each zero-variance outcome in a row (in the spirit of GRESO, arXiv 2506.02177).

No trainer or TRL import. Prompts are dataset row indices; ``G = num_generations``.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

import torch

from .core import grouped, zero_std_groups

MAX_STREAK = 255  # outcomes in a row are counted up to this (uint8); p ** 255 is far below any floor
EXPLORE_PROB_INIT = 0.5  # p of each kind at the start: a prompt zero-variance once is drawn again with probability p
EXPLORE_STEP = 0.01  # per generation batch, p moves by this toward the target zero-variance share


class Outcome(IntEnum):
    """What one group of a prompt gave."""

    INFORMATIVE = 0
    ALL_LOW = 1  # zero-variance, tied nearer the lowest task reward seen in training (binary verifier: all wrong)
    ALL_HIGH = 2  # zero-variance, tied nearer the highest (binary verifier: all right)


ZERO_STD_OUTCOMES = (Outcome.ALL_LOW, Outcome.ALL_HIGH)


def group_outcomes(
    rewards: torch.Tensor,
    valid_rows: torch.Tensor,
    num_generations: int,
    atol: float,
    reward_range: tuple[float, float],
) -> torch.Tensor:
    """``(N // G,)`` ``Outcome`` of each group: informative unless ``zero_std_groups`` says so, else all-low or
    all-high by which end of ``reward_range`` (task reward units, the batch's own rewards included) the mean of its
    valid rows is nearer; a tie, or a group with no valid row, counts as all-low."""
    zero_std = zero_std_groups(rewards, valid_rows, num_generations, atol)
    valid = grouped(valid_rows & ~torch.isnan(rewards), num_generations)
    level = grouped(rewards, num_generations).masked_fill(~valid, float("nan")).nanmean(dim=1)
    low, high = reward_range
    nearer_high = (level - low) > (high - level)  # NaN compares False
    kinds = torch.where(nearer_high, int(Outcome.ALL_HIGH), int(Outcome.ALL_LOW))
    return torch.where(zero_std, kinds, int(Outcome.INFORMATIVE)).cpu()


@dataclass
class PromptHistory:
    """Per dataset row: the ``Outcome`` of its latest group and how many of its groups in a row had it (capped at
    ``MAX_STREAK``; 0: never drawn). Two bytes a row, so a dataset of millions of rows costs a few MB."""

    kind: torch.Tensor  # (num_rows,) uint8
    streak: torch.Tensor  # (num_rows,) uint8

    @classmethod
    def empty(cls, num_rows: int) -> PromptHistory:
        return cls(torch.zeros(num_rows, dtype=torch.uint8), torch.zeros(num_rows, dtype=torch.uint8))

    def record(self, rows: list[int], outcomes: torch.Tensor) -> None:
        """Add one outcome per drawn group, in draw order (a prompt drawn twice in a batch counts twice)."""
        for row, outcome in zip(rows, outcomes.tolist(), strict=True):
            same = int(self.kind[row]) == outcome
            self.streak[row] = min(int(self.streak[row]) + 1, MAX_STREAK) if same else 1
            self.kind[row] = outcome

    def state_dict(self) -> dict:
        return {"kind": self.kind, "streak": self.streak}

    def load_state_dict(self, state: dict) -> None:
        self.kind, self.streak = state["kind"].to(torch.uint8), state["streak"].to(torch.uint8)


@dataclass
class ExploreProbs:
    """The exploration probability ``p`` of each zero-variance kind, adapted toward a target share of zero-variance
    groups among those generated (``target`` in all, half for each kind), never below ``min_draw_prob``."""

    target: float
    min_draw_prob: float
    all_low: float = EXPLORE_PROB_INIT
    all_high: float = EXPLORE_PROB_INIT

    def adapt(self, outcomes: torch.Tensor) -> None:
        """One step per generation batch from the ``Outcome`` of every group it generated: a kind above its share
        of the target is skipped more (``p`` down), one at or below it less (``p`` up)."""
        for kind in ZERO_STD_OUTCOMES:
            share = (outcomes == kind).float().mean().item()
            name = kind.name.lower()
            p = getattr(self, name) + (EXPLORE_STEP if share <= self.target / 2 else -EXPLORE_STEP)
            setattr(self, name, min(max(p, self.min_draw_prob), 1.0))

    def draw_prob(self, history: PromptHistory, rows: torch.Tensor) -> torch.Tensor:
        """``(k,)`` probability of drawing each of the ``rows``: ``p_kind ** streak`` after zero-variance outcomes in
        a row, 1 after an informative one or none, never below ``min_draw_prob``."""
        base = torch.tensor([1.0, self.all_low, self.all_high], dtype=torch.float64)
        probs = base[history.kind[rows].long()] ** history.streak[rows].double()
        return probs.clamp(min=self.min_draw_prob)

    def state_dict(self) -> dict:
        return {"all_low": self.all_low, "all_high": self.all_high}

    def load_state_dict(self, state: dict) -> None:
        self.all_low, self.all_high = state["all_low"], state["all_high"]


@dataclass
class PromptSkipper:
    """The skip state of a run: the outcome histories and the exploration probabilities (checkpointed together).

    ``slots`` ``(num_rows,)`` maps each dataset row to its history (None: one history per row). Rows that share a key
    (a difficulty label, or the prompt text) share a slot: the outcomes of some predict the skip of the others.
    """

    history: PromptHistory
    explore: ExploreProbs
    slots: torch.Tensor | None = None

    @classmethod
    def new(cls, num_rows: int, target: float, min_draw_prob: float, keys: list | None = None) -> PromptSkipper:
        """``keys``: one hashable value per dataset row; rows with equal keys share a history."""
        if keys is None:
            return cls(PromptHistory.empty(num_rows), ExploreProbs(target, min_draw_prob))
        index: dict = {}
        slots = torch.tensor([index.setdefault(key, len(index)) for key in keys], dtype=torch.long)
        return cls(PromptHistory.empty(len(index)), ExploreProbs(target, min_draw_prob), slots)

    def _slots(self, rows: torch.Tensor) -> torch.Tensor:
        return rows if self.slots is None else self.slots[rows]

    def draw_prob(self, rows: torch.Tensor) -> torch.Tensor:
        return self.explore.draw_prob(self.history, self._slots(rows))

    def record(self, rows: list[int], outcomes: torch.Tensor) -> None:
        """The outcomes of every group one generation batch generated, in draw order; then one step of ``p``."""
        self.history.record(self._slots(torch.tensor(rows, dtype=torch.long)).tolist(), outcomes)
        self.explore.adapt(outcomes)

    def state_dict(self) -> dict:
        return {"history": self.history.state_dict(), "explore": self.explore.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.history.load_state_dict(state["history"])
        self.explore.load_state_dict(state["explore"])
