"""Prompt skipping's predictors: the probability of drawing a prompt, from what its earlier groups gave. The
interface (``SkipPredictor``), the record every predictor reads (``PromptHistory``), and the streak:

- ``StreakPredictor`` (``skip_predictor="streak"``): the probability shrinks with each zero-variance outcome in a row
  (in the spirit of GRESO, arXiv 2506.02177), ``p`` per zero-variance kind steered toward a target share
  (``ExploreProbs``); optionally, for prompts never drawn, a prior from the prompts of their group (``GroupPrior``).
- ``SuccessRatePredictor`` (``"success_rate"``) is in ``success_rate.py``.

No trainer or TRL import. Predictors see history slots (``PromptSkipper`` maps prompts to them); ``G =
num_generations``.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from typing import Protocol

import torch

MAX_STREAK = 255  # outcomes in a row are counted up to this (uint8); p ** 255 is far below any floor
EXPLORE_PROB_INIT = 0.5  # p of each kind at the start: a prompt zero-variance once is drawn again with probability p
EXPLORE_STEP = 0.01  # per generation batch, p moves by this toward the target zero-variance share
SHARE_DECAY = 0.9  # p is steered by each kind's share over about the last 10 generation batches
PRIOR_DECAY = 0.9  # per generation batch: a group's informative rate looks back ~10 batches
PRIOR_MIN_OUTCOMES = 4.0  # decayed outcomes of a group before its rate is trusted (its prompts are drawn till then)


class Outcome(IntEnum):
    """What one group of a prompt gave."""

    INFORMATIVE = 0
    ALL_LOW = 1  # zero-variance, tied nearer the lowest task reward seen in training (binary verifier: all wrong)
    ALL_HIGH = 2  # zero-variance, tied nearer the highest (binary verifier: all right)


ZERO_STD_OUTCOMES = (Outcome.ALL_LOW, Outcome.ALL_HIGH)


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
    groups among those generated (``target`` in all, half for each kind), never below ``min_draw_prob``. Each kind's
    share is decayed over generation batches (``SHARE_DECAY``): one small batch's share is 0 or at least 1/groups, and
    steering ``p`` by it drifts ``p`` up (benchmarks/explore_controller.py)."""

    target: float
    min_draw_prob: float
    all_low: float = EXPLORE_PROB_INIT
    all_high: float = EXPLORE_PROB_INIT
    share_decay: float = SHARE_DECAY  # 0: steered by each batch's own share alone
    share_all_low: float | None = None  # decayed share of the kind among the groups generated; None: no batch yet
    share_all_high: float | None = None

    def adapt(self, outcomes: torch.Tensor) -> None:
        """One step per generation batch from the ``Outcome`` of every group it generated: a kind whose decayed
        share is above its half of the target is skipped more (``p`` down), one at or below it less (``p`` up)."""
        for kind in ZERO_STD_OUTCOMES:
            name = kind.name.lower()
            share = (outcomes == kind).float().mean().item()
            previous = getattr(self, f"share_{name}")
            share = share if previous is None else self.share_decay * previous + (1 - self.share_decay) * share
            setattr(self, f"share_{name}", share)
            p = getattr(self, name) + (EXPLORE_STEP if share <= self.target / 2 else -EXPLORE_STEP)
            setattr(self, name, min(max(p, self.min_draw_prob), 1.0))

    def draw_prob(self, history: PromptHistory, rows: torch.Tensor) -> torch.Tensor:
        """``(k,)`` probability of drawing each of the ``rows``: ``p_kind ** streak`` after zero-variance outcomes in
        a row, 1 after an informative one or none, never below ``min_draw_prob``."""
        base = torch.tensor([1.0, self.all_low, self.all_high], dtype=torch.float64)
        probs = base[history.kind[rows].long()] ** history.streak[rows].double()
        return probs.clamp(min=self.min_draw_prob)

    def state_dict(self) -> dict:
        return {key: getattr(self, key) for key in ("all_low", "all_high", "share_all_low", "share_all_high")}

    def load_state_dict(self, state: dict) -> None:
        self.all_low, self.all_high = state["all_low"], state["all_high"]
        self.share_all_low, self.share_all_high = state.get("share_all_low"), state.get("share_all_high")


def dense_ids(values: list) -> tuple[torch.Tensor, int]:
    """``(len(values),)`` long: each value's index among the distinct values in order of first appearance; and how
    many distinct values there are."""
    index: dict = {}
    ids = torch.tensor([index.setdefault(value, len(index)) for value in values], dtype=torch.long)
    return ids, len(index)


@dataclass
class GroupPrior:
    """How likely a prompt with no history of its own is to be drawn, from the prompts that share its group (a
    column's value: a difficulty label, a source): its group's informative rate over about the last 10 generation
    batches (``PRIOR_DECAY``), relative to the best group's. On data with a difficulty spread this skips most
    prompts of a level the model cannot solve yet, or always solves, already on the first pass, where no prompt has
    a history. A group with too few outcomes (``PRIOR_MIN_OUTCOMES``) counts as informative every time (it is drawn,
    and the others are drawn at their own rate); while no group has given an informative group, every one is drawn."""

    groups: torch.Tensor  # (num_slots,) long: the group of each history slot
    counts: torch.Tensor  # (num_groups, 2) float64: decayed informative and total outcomes

    @classmethod
    def new(cls, values: list) -> GroupPrior:
        """``values``: one hashable value per history slot; slots with equal values form one group."""
        groups, num_groups = dense_ids(values)
        return cls(groups, torch.zeros(num_groups, 2, dtype=torch.float64))

    def record(self, slots: torch.Tensor, outcomes: torch.Tensor) -> None:
        """One generation batch: decay the counts, then add an outcome per group generated."""
        self.counts *= PRIOR_DECAY
        groups = self.groups[slots]
        self.counts[:, 0].index_add_(0, groups, (outcomes == Outcome.INFORMATIVE).double())
        self.counts[:, 1].index_add_(0, groups, torch.ones(len(groups), dtype=torch.float64))

    def draw_prob(self, slots: torch.Tensor, min_draw_prob: float) -> torch.Tensor:
        """``(k,)`` probability of drawing each of ``slots`` were it never drawn: its group's rate over the best
        group's, never below ``min_draw_prob``."""
        informative, total = self.counts.unbind(1)
        rate = torch.where(total >= PRIOR_MIN_OUTCOMES, informative / total.clamp(min=PRIOR_MIN_OUTCOMES), 1.0)
        best = rate.max()
        relative = rate / best if best > 0 else torch.ones_like(rate)
        return relative.clamp(min=min_draw_prob)[self.groups[slots]]

    def state_dict(self) -> dict:
        return {"counts": self.counts}


class SkipPredictor(Protocol):
    """What ``PromptSkipper`` asks of a predictor. ``slots``: ``(k,)`` long history slots; ``history``: the outcome
    record the skipper keeps for every slot."""

    def draw_prob(self, slots: torch.Tensor, history: PromptHistory) -> torch.Tensor:
        """``(k,)`` probability of drawing each slot's prompt, in ``[min_draw_prob, 1]``."""
        ...

    def record(
        self, slots: torch.Tensor, outcomes: torch.Tensor, successes: torch.Tensor | None, rows: torch.Tensor | None
    ) -> None:
        """One generation batch's groups, in draw order: ``Outcome``, successes and valid rows (``(k,)`` each; None
        only for the streak predictor, which reads outcomes alone)."""
        ...

    def clear(self, slots: torch.Tensor) -> None:
        """Forget what the given slots' prompts gave (a hashed slot taken over by another prompt)."""
        ...

    def metrics(self) -> dict[str, float]:
        """Its train metrics after a batch, under ``prompt_skip/``."""
        ...

    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict) -> None: ...


@dataclass
class StreakPredictor:
    """``p_kind ** streak`` after zero-variance outcomes in a row (``ExploreProbs``); a never-drawn prompt by its
    group's informative rate when there is a ``prior``."""

    explore: ExploreProbs
    prior: GroupPrior | None = None

    def draw_prob(self, slots: torch.Tensor, history: PromptHistory) -> torch.Tensor:
        probs = self.explore.draw_prob(history, slots)
        if self.prior is None:
            return probs
        never_drawn = history.streak[slots] == 0
        return torch.where(never_drawn, self.prior.draw_prob(slots, self.explore.min_draw_prob), probs)

    def record(
        self, slots: torch.Tensor, outcomes: torch.Tensor, successes: torch.Tensor | None, rows: torch.Tensor | None
    ) -> None:
        if self.prior is not None:
            self.prior.record(slots, outcomes)
        self.explore.adapt(outcomes)

    def clear(self, slots: torch.Tensor) -> None:
        """Nothing per slot beyond the skipper's history."""

    def metrics(self) -> dict[str, float]:
        return {"explore_prob_all_low": self.explore.all_low, "explore_prob_all_high": self.explore.all_high}

    def state_dict(self) -> dict:
        state = {"kind": "streak", "explore": self.explore.state_dict()}
        if self.prior is not None:
            state["prior"] = self.prior.state_dict()
        return state

    def load_state_dict(self, state: dict) -> None:
        if state.get("kind") != "streak":
            raise ValueError(MISMATCH_RATES)
        if (self.prior is None) != ("prior" not in state) or (
            self.prior is not None and state["prior"]["counts"].shape != self.prior.counts.shape
        ):
            raise ValueError(
                "The checkpoint's prompt-skip prior does not match this run's: skip_prior_key, or the number of its "
                "values in the train_dataset, differs from the checkpointed run's."
            )
        self.explore.load_state_dict(state["explore"])
        if self.prior is not None:
            self.prior.counts = state["prior"]["counts"].to(torch.float64)


MISMATCH_RATES = (
    "The checkpoint's prompt-skip success rates do not match this run's: skip_predictor, skip_prior_key, or the "
    "number of its values in the train_dataset, differs from the checkpointed run's."
)
