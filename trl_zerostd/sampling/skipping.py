"""Prompt skipping: which prompts to draw, from what their earlier groups gave. ``PromptSkipper`` maps prompts to
history slots, turns a batch's rewards into outcomes and successes, and asks the success rates (``success_rate.py``)
how likely each prompt is to be drawn.

No trainer or TRL import. Prompts are dataset row indices, or with a streaming dataset 63-bit keys hashed from the
prompt (``history_key``); ``G = num_generations``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import torch

from ..core.groups import grouped, widen_reward_range, zero_std_groups
from .streams import stable_hash
from .success_rate import Outcome, SuccessRates, dense_ids

HASHED_SLOTS = 1 << 20  # a streaming run's history table: 37 bytes a slot (29 of success rates, an 8-byte key), 37 MiB


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
    """The skip state of a run: the success rates of every history slot (checkpointed), and the floor of a prompt's
    draw probability.

    Prompts are named by keys. Map-style data: dataset row indices; ``slots`` ``(num_rows,)`` maps each row to its
    history (None: one history per row), and rows that share a key (a difficulty label, or the prompt text) share a
    slot, so the outcomes of some predict the skip of the others. Streaming data: hashed keys in ``hashed`` slots, a
    key whose slot another holds counts as never seen (drawn).
    """

    rates: SuccessRates
    min_draw_prob: float
    slots: torch.Tensor | None = None
    hashed: HashedSlots | None = field(default=None)

    @classmethod
    def new(
        cls,
        num_rows: int,
        min_draw_prob: float,
        group_size: int,
        keys: list | None = None,
        prior_groups: list | None = None,
    ) -> PromptSkipper:
        """``keys``: one hashable value per dataset row; rows with equal keys share a history. ``prior_groups``: one
        hashable value per dataset row (one history per row only); rows with equal values form a prior's group.
        ``group_size``: the rows of a group (``num_generations``)."""
        if prior_groups is not None and keys is not None:
            raise ValueError("A prior's groups need one history per row: pass keys or prior_groups, not both.")
        slots, num_slots = (None, num_rows) if keys is None else dense_ids(keys)
        return cls(SuccessRates.new(group_size, num_slots, prior_groups), min_draw_prob, slots)

    @classmethod
    def streaming(cls, min_draw_prob: float, group_size: int, num_slots: int = HASHED_SLOTS) -> PromptSkipper:
        """Histories of prompts named by ``history_key``: ``num_slots`` slots, whatever the length of the stream."""
        return cls(SuccessRates.new(group_size, num_slots), min_draw_prob, hashed=HashedSlots.empty(num_slots))

    def _slots(self, keys: torch.Tensor) -> torch.Tensor:
        if self.hashed is not None:
            return self.hashed.slots(keys)
        return keys if self.slots is None else self.slots[keys]

    def draw_prob(self, keys: torch.Tensor) -> torch.Tensor:
        """``(k,)`` probability of drawing each of the ``(k,)`` long prompt keys."""
        probs = self.rates.draw_prob(self._slots(keys), self.min_draw_prob)
        return probs if self.hashed is None else torch.where(self.hashed.known(keys), probs, 1.0)

    def record(self, keys: list[int], outcomes: torch.Tensor, successes: torch.Tensor, rows: torch.Tensor) -> None:
        """The ``Outcome``, successes and valid rows (``group_successes``) of every group one generation batch
        generated, in draw order."""
        key_ids = torch.tensor(keys, dtype=torch.long)
        if self.hashed is not None:
            self.rates.clear(self.hashed.claim(key_ids))
        self.rates.record(self._slots(key_ids), outcomes, successes, rows)

    def record_batch(
        self,
        task_rewards: torch.Tensor,
        valid: torch.Tensor,
        keys: list[int],
        skipped: int,
        reward_range: tuple[float, float] | None,
        atol: float,
    ) -> dict[str, float]:
        """Every group one generation batch generated (``(rows,)`` task rewards and valid flags, neither truncated
        nor unscorable, of whole groups in draw order; ``keys``: one per group) into the history, the outcome of each
        decided against ``reward_range`` widened by the batch (task reward units). Returns the batch's metrics;
        ``skipped``: prompts skipped while drawing it."""
        group_size = self.rates.group_size
        low_high = widen_reward_range(reward_range, task_rewards, valid) or (0, 0)
        outcomes = group_outcomes(task_rewards, valid, group_size, atol, low_high)
        successes, rows = group_successes(task_rewards, valid, group_size, low_high)
        self.record(keys, outcomes, successes, rows)
        drawn = len(keys) + skipped
        metrics = {
            "prompts_drawn": drawn,
            "skipped_frac": skipped / drawn,
            "zero_std_group_frac": (outcomes != Outcome.INFORMATIVE).float().mean().item(),
        }
        if self.hashed is not None:
            metrics["hash_evictions"] = self.hashed.evictions
        return {f"prompt_skip/{name}": value for name, value in metrics.items()}

    def state_dict(self) -> dict:
        state = {"rates": self.rates.state_dict()}
        if self.hashed is not None:
            state["hashed"] = {"keys": self.hashed.keys, "evictions": self.hashed.evictions}
        return state

    def load_state_dict(self, state: dict) -> None:
        if "rates" not in state:
            raise ValueError(
                "The checkpoint's prompt-skip state was written by trl-zerostd 0.1, whose success rates lack the "
                "counts of one-sided ties that 0.2 reads (docs/CHANGELOG.md): resume it with trl-zerostd 0.1, or "
                "start a new run."
            )
        self.rates.load_state_dict(state["rates"])
        if self.hashed is not None:
            self.hashed = HashedSlots(state["hashed"]["keys"].to(torch.long), state["hashed"]["evictions"])
