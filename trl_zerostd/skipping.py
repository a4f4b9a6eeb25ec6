"""Prompt skipping, the pure part: a per-prompt record of zero-variance outcomes, and the probability of drawing a
prompt again, which shrinks with each zero-variance outcome in a row (in the spirit of GRESO, arXiv 2506.02177);
optionally, for prompts never drawn, a prior from the prompts of their group (a difficulty label, a source).

No trainer or TRL import. Prompts are dataset row indices, or with a streaming dataset 63-bit keys hashed from the
prompt (``history_key``); ``G = num_generations``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from enum import IntEnum

import torch

from .core import grouped, zero_std_groups
from .sampling import stable_hash

MAX_STREAK = 255  # outcomes in a row are counted up to this (uint8); p ** 255 is far below any floor
EXPLORE_PROB_INIT = 0.5  # p of each kind at the start: a prompt zero-variance once is drawn again with probability p
EXPLORE_STEP = 0.01  # per generation batch, p moves by this toward the target zero-variance share
SHARE_DECAY = 0.9  # p is steered by each kind's share over about the last 10 generation batches
PRIOR_DECAY = 0.9  # per generation batch: a group's informative rate looks back ~10 batches
PRIOR_MIN_OUTCOMES = 4.0  # decayed outcomes of a group before its rate is trusted (its prompts are drawn till then)
HASHED_SLOTS = 1 << 20  # a streaming run's history table: 10 bytes a slot (kind, streak, 8-byte key), 10 MiB


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


def history_key(value) -> int:
    """A nonzero 63-bit key of a prompt (or any JSON value), the same in every process and run."""
    try:
        text = json.dumps(value, sort_keys=True, ensure_ascii=False)
    except TypeError as error:
        raise ValueError(
            f"Prompt skipping on a streaming dataset keys its history by a hash of the prompt, or of the "
            f"skip_history_key column, whose values must be JSON data (text, numbers, lists, dicts): {error}."
        ) from error
    return stable_hash(text) or 1


@dataclass
class HashedSlots:
    """A bounded table of histories for prompts known only by their key: slot ``key % num_slots``. Each slot keeps
    the key it holds; a prompt whose slot holds another key counts as never seen (it is drawn), and recording it takes
    the slot over (``evictions`` counts those collisions: the other prompt's history is lost, never misapplied)."""

    keys: torch.Tensor  # (num_slots,) int64, 0: empty
    evictions: int = 0

    @classmethod
    def empty(cls, num_slots: int) -> HashedSlots:
        return cls(torch.zeros(num_slots, dtype=torch.long))

    def slots(self, keys: torch.Tensor) -> torch.Tensor:
        return keys % len(self.keys)

    def known(self, keys: torch.Tensor) -> torch.Tensor:
        return self.keys[self.slots(keys)] == keys

    def claim(self, keys: torch.Tensor, history: PromptHistory) -> None:
        """Give each key its slot, clearing the history of a slot that another key held."""
        for key, slot in zip(keys.tolist(), self.slots(keys).tolist(), strict=True):
            held = int(self.keys[slot])
            if held != key:
                self.evictions += held != 0
                self.keys[slot] = key
                history.kind[slot], history.streak[slot] = 0, 0


@dataclass
class PromptSkipper:
    """The skip state of a run: the outcome histories and the exploration probabilities (checkpointed together).

    Prompts are named by keys. Map-style data: dataset row indices; ``slots`` ``(num_rows,)`` maps each row to its
    history (None: one history per row), and rows that share a key (a difficulty label, or the prompt text) share a
    slot, so the outcomes of some predict the skip of the others. Streaming data: hashed keys in ``hashed`` slots.
    With a ``prior``, a prompt whose slot was never drawn is drawn as its group's informative rate says.
    """

    history: PromptHistory
    explore: ExploreProbs
    slots: torch.Tensor | None = None
    hashed: HashedSlots | None = field(default=None)
    prior: GroupPrior | None = None

    @classmethod
    def new(
        cls,
        num_rows: int,
        target: float,
        min_draw_prob: float,
        keys: list | None = None,
        prior_groups: list | None = None,
    ) -> PromptSkipper:
        """``keys``: one hashable value per dataset row; rows with equal keys share a history. ``prior_groups``: one
        hashable value per dataset row (one history per row only); rows with equal values form a prior's group."""
        if prior_groups is not None:
            if keys is not None:
                raise ValueError("A prior's groups need one history per row: pass keys or prior_groups, not both.")
            prior = GroupPrior.new(prior_groups)
            return cls(PromptHistory.empty(num_rows), ExploreProbs(target, min_draw_prob), prior=prior)
        if keys is None:
            return cls(PromptHistory.empty(num_rows), ExploreProbs(target, min_draw_prob))
        slots, num_slots = dense_ids(keys)
        return cls(PromptHistory.empty(num_slots), ExploreProbs(target, min_draw_prob), slots)

    @classmethod
    def streaming(cls, target: float, min_draw_prob: float, num_slots: int = HASHED_SLOTS) -> PromptSkipper:
        """Histories of prompts named by ``history_key``: ``num_slots`` slots, whatever the length of the stream."""
        history, explore = PromptHistory.empty(num_slots), ExploreProbs(target, min_draw_prob)
        return cls(history, explore, hashed=HashedSlots.empty(num_slots))

    def _slots(self, keys: torch.Tensor) -> torch.Tensor:
        if self.hashed is not None:
            return self.hashed.slots(keys)
        return keys if self.slots is None else self.slots[keys]

    def draw_prob(self, keys: torch.Tensor) -> torch.Tensor:
        slots = self._slots(keys)
        probs = self.explore.draw_prob(self.history, slots)
        if self.prior is not None:
            never_drawn = self.history.streak[slots] == 0
            probs = torch.where(never_drawn, self.prior.draw_prob(slots, self.explore.min_draw_prob), probs)
        return probs if self.hashed is None else torch.where(self.hashed.known(keys), probs, 1.0)

    def record(self, keys: list[int], outcomes: torch.Tensor) -> None:
        """The outcomes of every group one generation batch generated, in draw order; then one step of ``p``."""
        keys = torch.tensor(keys, dtype=torch.long)
        if self.hashed is not None:
            self.hashed.claim(keys, self.history)
        slots = self._slots(keys)
        self.history.record(slots.tolist(), outcomes)
        if self.prior is not None:
            self.prior.record(slots, outcomes)
        self.explore.adapt(outcomes)

    def state_dict(self) -> dict:
        state = {"history": self.history.state_dict(), "explore": self.explore.state_dict()}
        if self.hashed is not None:
            state["hashed"] = {"keys": self.hashed.keys, "evictions": self.hashed.evictions}
        if self.prior is not None:
            state["prior"] = self.prior.state_dict()
        return state

    def load_state_dict(self, state: dict) -> None:
        saved, ours = len(state["history"]["kind"]), len(self.history.kind)
        if saved != ours:
            raise ValueError(
                f"The checkpoint's prompt-skip history has {saved} slots, this run's {ours}: the train_dataset or "
                "skip_history_key differs from the checkpointed run's."
            )
        if (self.prior is None) != ("prior" not in state) or (
            self.prior is not None and state["prior"]["counts"].shape != self.prior.counts.shape
        ):
            raise ValueError(
                "The checkpoint's prompt-skip prior does not match this run's: skip_prior_key, or the number of its "
                "values in the train_dataset, differs from the checkpointed run's."
            )
        self.history.load_state_dict(state["history"])
        self.explore.load_state_dict(state["explore"])
        if self.prior is not None:
            self.prior.counts = state["prior"]["counts"].to(torch.float64)
        if self.hashed is not None:
            self.hashed = HashedSlots(state["hashed"]["keys"].to(torch.long), state["hashed"]["evictions"])
