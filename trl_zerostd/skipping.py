"""Prompt skipping: which prompts to draw, from what their earlier groups gave. ``PromptSkipper`` maps prompts to
history slots, keeps each slot's outcome record, turns a batch's rewards into outcomes, and asks its predictor
(``predictors.py``: the streak; ``success_rate.py``: the success rate) how likely each prompt is to be drawn.

No trainer or TRL import. Prompts are dataset row indices, or with a streaming dataset 63-bit keys hashed from the
prompt (``history_key``); ``G = num_generations``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import torch

from .core import grouped, widen_reward_range, zero_std_groups
from .predictors import ExploreProbs, GroupPrior, Outcome, PromptHistory, SkipPredictor, StreakPredictor, dense_ids
from .sampling import stable_hash
from .success_rate import SuccessRatePredictor, SuccessRates

HASHED_SLOTS = 1 << 20  # a streaming run's history table: 10 bytes a slot (kind, streak, 8-byte key), 10 MiB


@dataclass(frozen=True)
class GroupsOfOneSize:
    """Groups generated in one batch with ``group_size`` rows each, in draw order: ``(rows,)`` task rewards and valid
    flags (neither truncated nor unscorable), one skip-history key per group."""

    task_rewards: torch.Tensor
    valid: torch.Tensor
    group_size: int
    keys: list[int]


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


def group_successes(
    rewards: torch.Tensor, valid_rows: torch.Tensor, num_generations: int, reward_range: tuple[float, float]
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(N // G,)`` float64 successes and valid rows of each group. A valid row's task reward rescaled to [0, 1] over
    ``reward_range`` counts as that much of a success (binary verifier: 1 right, 0 wrong); with an empty range
    (``high <= low``) every row counts as a failure, as ``group_outcomes`` counts a tie as all-low."""
    low, high = reward_range
    valid = valid_rows & ~torch.isnan(rewards)
    level = ((rewards - low) / (high - low)).clamp(0, 1) if high > low else torch.zeros_like(rewards)
    successes = grouped(level.masked_fill(~valid, 0.0), num_generations).sum(dim=1)
    return successes.double().cpu(), grouped(valid, num_generations).sum(dim=1).double().cpu()


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

    def claim(self, keys: torch.Tensor) -> torch.Tensor:
        """Give each key its slot; return the slots that another key held (their histories are to be cleared)."""
        taken = []
        for key, slot in zip(keys.tolist(), self.slots(keys).tolist(), strict=True):
            held = int(self.keys[slot])
            if held != key:
                self.evictions += held != 0
                self.keys[slot] = key
                taken.append(slot)
        return torch.tensor(taken, dtype=torch.long)


@dataclass
class PromptSkipper:
    """The skip state of a run: the outcome history of every slot and the predictor (checkpointed together).

    Prompts are named by keys. Map-style data: dataset row indices; ``slots`` ``(num_rows,)`` maps each row to its
    history (None: one history per row), and rows that share a key (a difficulty label, or the prompt text) share a
    slot, so the outcomes of some predict the skip of the others. Streaming data: hashed keys in ``hashed`` slots, a
    key whose slot another holds counts as never seen (drawn).
    """

    history: PromptHistory
    predictor: SkipPredictor
    slots: torch.Tensor | None = None
    hashed: HashedSlots | None = field(default=None)

    @classmethod
    def new(
        cls,
        num_rows: int,
        target: float,
        min_draw_prob: float,
        keys: list | None = None,
        prior_groups: list | None = None,
        predictor: str = "streak",
        group_size: int | None = None,
    ) -> PromptSkipper:
        """``keys``: one hashable value per dataset row; rows with equal keys share a history. ``prior_groups``: one
        hashable value per dataset row (one history per row only); rows with equal values form a prior's group.
        ``predictor``: a ``skip_predictor`` value; ``group_size``: the rows of a group (``num_generations``), which
        the rate predictors need."""
        if prior_groups is not None and keys is not None:
            raise ValueError("A prior's groups need one history per row: pass keys or prior_groups, not both.")
        slots, num_slots = (None, num_rows) if keys is None else dense_ids(keys)
        chosen = new_predictor(predictor, num_slots, target, min_draw_prob, prior_groups, group_size)
        return cls(PromptHistory.empty(num_slots), chosen, slots)

    @classmethod
    def streaming(
        cls,
        target: float,
        min_draw_prob: float,
        num_slots: int = HASHED_SLOTS,
        predictor: str = "streak",
        group_size: int | None = None,
    ) -> PromptSkipper:
        """Histories of prompts named by ``history_key``: ``num_slots`` slots, whatever the length of the stream."""
        chosen = new_predictor(predictor, num_slots, target, min_draw_prob, None, group_size)
        return cls(PromptHistory.empty(num_slots), chosen, hashed=HashedSlots.empty(num_slots))

    def _slots(self, keys: torch.Tensor) -> torch.Tensor:
        if self.hashed is not None:
            return self.hashed.slots(keys)
        return keys if self.slots is None else self.slots[keys]

    def draw_prob(self, keys: torch.Tensor) -> torch.Tensor:
        """``(k,)`` probability of drawing each of the ``(k,)`` long prompt keys."""
        probs = self.predictor.draw_prob(self._slots(keys), self.history)
        return probs if self.hashed is None else torch.where(self.hashed.known(keys), probs, 1.0)

    def success_prior(self, keys: list[int]) -> tuple[torch.Tensor, torch.Tensor] | None:
        """``(k,)`` ``Beta`` parameters of each prompt's success rate as the ``"success_rate"`` predictor holds them
        before its next group (per-prompt budgets read them); None under the streak, which holds no rate."""
        if not isinstance(self.predictor, SuccessRatePredictor):
            return None
        key_ids = torch.tensor(keys, dtype=torch.long)
        own = self.hashed.known(key_ids) if self.hashed is not None else True
        return self.predictor.rates.beta(self._slots(key_ids), own)

    def record(
        self,
        keys: list[int],
        outcomes: torch.Tensor,
        successes: torch.Tensor | None = None,
        rows: torch.Tensor | None = None,
    ) -> None:
        """The ``Outcome`` of every group one generation batch generated, in draw order (for the success-rate
        predictor also each group's ``successes`` and valid ``rows``, ``group_successes``)."""
        if not isinstance(self.predictor, StreakPredictor) and (successes is None or rows is None):
            raise ValueError("A rate predictor needs each group's successes and rows with its outcome.")
        key_ids = torch.tensor(keys, dtype=torch.long)
        if self.hashed is not None:
            taken = self.hashed.claim(key_ids)
            self.history.kind[taken], self.history.streak[taken] = 0, 0
            self.predictor.clear(taken)
        slots = self._slots(key_ids)
        self.history.record(slots.tolist(), outcomes)
        self.predictor.record(slots, outcomes, successes, rows)

    def record_batch(
        self,
        parts: list[GroupsOfOneSize],
        unfinished_keys: list[int],
        skipped: int,
        reward_range: tuple[float, float] | None,
        atol: float,
    ) -> dict[str, float]:
        """Every group one generation batch generated (``parts``; ``unfinished_keys``: prompts whose screen differed
        but whose group was never completed, counted informative with no success) into the history, the outcome of
        each decided against ``reward_range`` widened by the batch (task reward units). Returns the batch's metrics;
        ``skipped``: prompts skipped while drawing it."""
        rewards = torch.cat([part.task_rewards for part in parts])
        valid = torch.cat([part.valid for part in parts])
        low_high = widen_reward_range(reward_range, rewards, valid) or (0, 0)
        keys: list[int] = []
        part_outcomes: list[torch.Tensor] = []
        part_successes: list[torch.Tensor] = []
        part_rows: list[torch.Tensor] = []
        for part in parts:
            part_outcomes.append(group_outcomes(part.task_rewards, part.valid, part.group_size, atol, low_high))
            successes, rows = group_successes(part.task_rewards, part.valid, part.group_size, low_high)
            part_successes.append(successes)
            part_rows.append(rows)
            keys += part.keys
        keys += unfinished_keys
        unfinished = len(unfinished_keys)
        outcomes = torch.cat([*part_outcomes, torch.full((unfinished,), int(Outcome.INFORMATIVE), dtype=torch.long)])
        successes = torch.cat([*part_successes, torch.zeros(unfinished, dtype=torch.float64)])
        rows = torch.cat([*part_rows, torch.zeros(unfinished, dtype=torch.float64)])
        self.record(keys, outcomes, successes, rows)
        drawn = len(keys) + skipped
        metrics = {
            "prompts_drawn": drawn,
            "skipped_frac": skipped / drawn,
            "zero_std_group_frac": (outcomes != Outcome.INFORMATIVE).float().mean().item(),
            **self.predictor.metrics(),
        }
        if self.hashed is not None:
            metrics["hash_evictions"] = self.hashed.evictions
        return {f"prompt_skip/{name}": value for name, value in metrics.items()}

    def state_dict(self) -> dict:
        state = {"history": self.history.state_dict(), "predictor": self.predictor.state_dict()}
        if self.hashed is not None:
            state["hashed"] = {"keys": self.hashed.keys, "evictions": self.hashed.evictions}
        return state

    def load_state_dict(self, state: dict) -> None:
        saved, ours = len(state["history"]["kind"]), len(self.history.kind)
        if saved != ours:
            raise ValueError(
                f"The checkpoint's prompt-skip history has {saved} slots, this run's {ours}: the train_dataset or "
                "skip_history_key differs from the checkpointed run's."
            )
        self.predictor.load_state_dict(state["predictor"])
        self.history.load_state_dict(state["history"])
        if self.hashed is not None:
            self.hashed = HashedSlots(state["hashed"]["keys"].to(torch.long), state["hashed"]["evictions"])


def new_predictor(
    predictor: str,
    num_slots: int,
    target: float,
    min_draw_prob: float,
    prior_groups: list | None,
    group_size: int | None,
) -> SkipPredictor:
    """The ``skip_predictor`` named: the streak (with a prior over ``prior_groups`` when given), or a rate predictor
    over groups of ``group_size`` rows (its groups of slots: ``prior_groups``, or one)."""
    if predictor == "streak":
        prior = GroupPrior.new(prior_groups) if prior_groups is not None else None
        return StreakPredictor(ExploreProbs(target, min_draw_prob), prior)
    if group_size is None:
        raise ValueError(f"skip_predictor={predictor!r} needs the rows of a group (num_generations).")
    if predictor == "success_rate":
        return SuccessRatePredictor(SuccessRates.new(group_size, num_slots, prior_groups), min_draw_prob)
    raise ValueError(f"Unknown skip_predictor {predictor!r}: 'streak' or 'success_rate'.")
