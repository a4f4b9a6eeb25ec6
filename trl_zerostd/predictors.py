"""Prompt skipping's predictors: the probability of drawing a prompt, from what its earlier groups gave. Two, behind
one interface (``SkipPredictor``):

- ``StreakPredictor`` (``skip_predictor="streak"``): the probability shrinks with each zero-variance outcome in a row
  (in the spirit of GRESO, arXiv 2506.02177), ``p`` per zero-variance kind steered toward a target share
  (``ExploreProbs``); optionally, for prompts never drawn, a prior from the prompts of their group (``GroupPrior``).
- ``SuccessRatePredictor`` (``"success_rate"``): a per-prompt success rate over its recent groups, Beta-distributed
  around its group's rate; the probability follows the chance that the prompt's next group is informative
  (beta-binomial, ``SuccessRates``).

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
SUCCESS_DECAY = 0.5  # success_rate: each new group of a prompt halves the weight of its earlier ones
RATE_PRIOR_ROWS = 4.0  # success_rate: the group's rate weighs as much as this many rows of the prompt's own
GROUP_RATE_PRIOR_ROWS = 2.0  # success_rate: a group's rate starts at 0.5 weighing this many rows (Laplace's rule)
RATE_CLAMP = 0.01  # a group's rate is kept in [RATE_CLAMP, 1 - RATE_CLAMP], so that both Beta parameters are > 0
DRAW_POWER = 2.0  # success_rate: draw prob = (P(informative) / a fresh prompt's of the best group) ** DRAW_POWER


class Outcome(IntEnum):
    """What one group of a prompt gave."""

    INFORMATIVE = 0
    ALL_LOW = 1  # zero-variance, tied nearer the lowest task reward seen in training (binary verifier: all wrong)
    ALL_HIGH = 2  # zero-variance, tied nearer the highest (binary verifier: all right)


ZERO_STD_OUTCOMES = (Outcome.ALL_LOW, Outcome.ALL_HIGH)


def informative_prob(successes: torch.Tensor, failures: torch.Tensor, group_size: int) -> torch.Tensor:
    """``(k,)`` probability that a group of ``group_size`` rows is informative (not all successes, not all failures)
    when each row succeeds with a rate ``q ~ Beta(successes, failures)`` (both > 0): the beta-binomial's
    ``1 - E[q ** G] - E[(1 - q) ** G]``."""
    a, b = successes.double(), failures.double()
    log_total = torch.lgamma(a + b) - torch.lgamma(a + b + group_size)
    all_successes = torch.exp(torch.lgamma(a + group_size) - torch.lgamma(a) + log_total)
    all_failures = torch.exp(torch.lgamma(b + group_size) - torch.lgamma(b) + log_total)
    return (1 - all_successes - all_failures).clamp(min=0)


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
    share_decay: float = SHARE_DECAY  # 0: steered by each batch's own share (the controller before issue 18)
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


@dataclass
class SuccessRates:
    """The ``"success_rate"`` predictor. Per history slot: the successes and valid rows of its groups, each new group
    of the prompt halving the weight of its earlier ones (``SUCCESS_DECAY``); per group of slots (a ``skip_prior_key``
    value; one group without it): the same over about the last 10 generation batches (``PRIOR_DECAY``), from 0.5
    weighing ``GROUP_RATE_PRIOR_ROWS`` rows. A prompt's success rate is ``Beta``: its group's rate weighing
    ``RATE_PRIOR_ROWS`` rows, plus its own counts; it is drawn with probability ``(P(informative) / P_best) **
    DRAW_POWER``, ``P_best`` a never-drawn prompt's of the best group, never below ``min_draw_prob``. Unlike the
    streak it tells 4 right of 8 from 7 of 8, and it needs no target share. 8 bytes a slot."""

    group_size: int
    successes: torch.Tensor  # (num_slots,) float32
    rows: torch.Tensor  # (num_slots,) float32
    groups: torch.Tensor  # (num_slots,) long
    group_counts: torch.Tensor  # (num_groups, 2) float64: decayed successes and valid rows

    @classmethod
    def new(cls, group_size: int, num_slots: int, group_values: list | None = None) -> SuccessRates:
        """``group_values``: one hashable value per slot (None: one group)."""
        if group_values is None:
            groups, num_groups = torch.zeros(num_slots, dtype=torch.long), 1
        else:
            groups, num_groups = dense_ids(group_values)
        counts = torch.zeros(num_slots, dtype=torch.float32)
        return cls(group_size, counts, counts.clone(), groups, torch.zeros(num_groups, 2, dtype=torch.float64))

    def record(self, slots: torch.Tensor, successes: torch.Tensor, rows: torch.Tensor) -> None:
        """One generation batch's groups, in draw order (a slot drawn twice counts twice); a group with no valid row
        changes nothing."""
        self.group_counts *= PRIOR_DECAY
        counted = rows > 0
        slots, successes, rows = slots[counted], successes[counted], rows[counted]
        for slot, success, row_count in zip(slots.tolist(), successes.tolist(), rows.tolist(), strict=True):
            self.successes[slot] = SUCCESS_DECAY * self.successes[slot] + success
            self.rows[slot] = SUCCESS_DECAY * self.rows[slot] + row_count
        self.group_counts.index_add_(0, self.groups[slots], torch.stack([successes, rows], dim=1).double())

    def group_rates(self) -> torch.Tensor:
        """``(num_groups,)`` each group's success rate, ``(successes + 1) / (rows + 2)`` over its decayed counts
        (``GROUP_RATE_PRIOR_ROWS``), in ``[RATE_CLAMP, 1 - RATE_CLAMP]``. Why not the ratio alone: a group judged from
        a group or two of rows (all wrong, say) is drawn at the floor, so its counts only decay and a ratio would stay
        where it was for the rest of the run; with the prior, its rate returns toward 0.5 as its evidence ages, and it
        is measured again (a level of the real-model study was starved by the ratio: docs/studies/real_model.md)."""
        successes, rows = self.group_counts.unbind(1)
        rates = (successes + GROUP_RATE_PRIOR_ROWS / 2) / (rows + GROUP_RATE_PRIOR_ROWS)
        return rates.clamp(RATE_CLAMP, 1 - RATE_CLAMP)

    def informative_prob(self, slots: torch.Tensor) -> torch.Tensor:
        """``(k,)`` predicted probability that the next group of each slot's prompt is informative."""
        prior = RATE_PRIOR_ROWS * self.group_rates()[self.groups[slots]]
        successes, rows = self.successes[slots].double(), self.rows[slots].double()
        failures = (rows - successes).clamp(min=0)
        return informative_prob(prior + successes, RATE_PRIOR_ROWS - prior + failures, self.group_size)

    def draw_prob(self, slots: torch.Tensor, min_draw_prob: float) -> torch.Tensor:
        """``(k,)`` probability of drawing each slot's prompt."""
        rates = self.group_rates()
        best = informative_prob(RATE_PRIOR_ROWS * rates, RATE_PRIOR_ROWS * (1 - rates), self.group_size).max()
        return ((self.informative_prob(slots) / best) ** DRAW_POWER).clamp(min_draw_prob, 1.0)

    def clear(self, slots: torch.Tensor) -> None:
        self.successes[slots], self.rows[slots] = 0.0, 0.0

    def state_dict(self) -> dict:
        return {"successes": self.successes, "rows": self.rows, "group_counts": self.group_counts}

    def load_state_dict(self, state: dict) -> None:
        self.successes, self.rows = state["successes"].float(), state["rows"].float()
        self.group_counts = state["group_counts"].double()


class SkipPredictor(Protocol):
    """What ``PromptSkipper`` asks of a predictor. ``slots``: ``(k,)`` long history slots; ``history``: the outcome
    record the skipper keeps for every slot."""

    def draw_prob(self, slots: torch.Tensor, history: PromptHistory) -> torch.Tensor:
        """``(k,)`` probability of drawing each slot's prompt, in ``[min_draw_prob, 1]``."""
        ...

    def record(self, slots: torch.Tensor, outcomes: torch.Tensor, successes: torch.Tensor, rows: torch.Tensor) -> None:
        """One generation batch's groups, in draw order: ``Outcome``, successes and valid rows (``(k,)`` each)."""
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

    def record(self, slots: torch.Tensor, outcomes: torch.Tensor, successes: torch.Tensor, rows: torch.Tensor) -> None:
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


@dataclass
class SuccessRatePredictor:
    """Draws by each slot's success rate (``SuccessRates.draw_prob``), never below ``min_draw_prob``."""

    rates: SuccessRates
    min_draw_prob: float

    def draw_prob(self, slots: torch.Tensor, history: PromptHistory) -> torch.Tensor:
        return self.rates.draw_prob(slots, self.min_draw_prob)

    def record(self, slots: torch.Tensor, outcomes: torch.Tensor, successes: torch.Tensor, rows: torch.Tensor) -> None:
        self.rates.record(slots, successes, rows)

    def clear(self, slots: torch.Tensor) -> None:
        self.rates.clear(slots)

    def metrics(self) -> dict[str, float]:
        return {}

    def state_dict(self) -> dict:
        return {"kind": "success_rate", "rates": self.rates.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        counts = state["rates"]["group_counts"] if state.get("kind") == "success_rate" else None
        if counts is None or counts.shape != self.rates.group_counts.shape:
            raise ValueError(MISMATCH_RATES)
        self.rates.load_state_dict(state["rates"])


MISMATCH_RATES = (
    "The checkpoint's prompt-skip success rates do not match this run's: skip_predictor, skip_prior_key, or the "
    "number of its values in the train_dataset, differs from the checkpointed run's."
)
