"""Where a refill's prompts come from (pure): a seeded stream over a map-style dataset's indices (``PromptStream``)
or a streaming dataset's rows (``RowStream``), each skipping a prompt with the probability prompt skipping gives it,
with the state a checkpoint stores.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch

STREAM_SEED_OFFSET = 0x5EED  # the refill stream must not replay the dataloader's own permutation of the same seed
SKIP_SEED_OFFSET = 0x5C1B  # the uniforms of skip decisions, per pass
UNIFORM_CHUNK = 4096  # a stream's skip uniforms are drawn per chunk of this many places (random access on resume)


@dataclass
class PromptStream:
    """Dataset row indices in seeded passes: each pass is a fresh permutation of ``range(num_rows)``.

    Every rank holds the same stream (same seed, same draws), so no rank needs to tell another which prompts to
    generate. ``epoch`` and ``position`` are the whole state: a checkpoint stores them and resuming continues.
    """

    num_rows: int
    seed: int
    epoch: int = 0
    position: int = 0
    _cached_epoch: int | None = field(default=None, init=False, repr=False, compare=False)
    _cached: tuple = field(default=(), init=False, repr=False, compare=False)

    def __post_init__(self):
        if self.num_rows < 1:
            raise ValueError(
                "dynamic_sampling and skip_zero_std_prompts need a non-empty train_dataset to draw prompts from."
            )

    def _pass(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The current pass: its order of row indices and a seeded uniform per place (for skip decisions)."""
        if self._cached_epoch != self.epoch:
            order = torch.Generator().manual_seed(self.seed + STREAM_SEED_OFFSET + self.epoch)
            uniform = torch.Generator().manual_seed(self.seed + SKIP_SEED_OFFSET + self.epoch)
            self._cached = (
                torch.randperm(self.num_rows, generator=order),
                torch.rand(self.num_rows, generator=uniform),
            )
            self._cached_epoch = self.epoch
        return self._cached

    def take(self, count: int) -> list[int]:
        """The next ``count`` row indices, crossing into new passes as needed."""
        return self.draw(count)[0]

    def draw(
        self, count: int, draw_prob: Callable[[torch.Tensor], torch.Tensor] | None = None
    ) -> tuple[list[int], int]:
        """The next ``count`` row indices drawn, and how many were skipped on the way. With ``draw_prob`` (``(k,)``
        row indices -> ``(k,)`` probabilities) a candidate is drawn when the seeded uniform of its place in the pass is
        below its probability, else skipped (consumed for this pass); the same state gives the same draws."""
        taken: list[int] = []
        skipped = 0
        while len(taken) < count:
            if self.position == self.num_rows:
                self.epoch, self.position = self.epoch + 1, 0
            order, uniform = self._pass()
            candidates = order[self.position :]
            drawn = torch.ones_like(candidates, dtype=torch.bool)
            if draw_prob is not None:
                drawn = uniform[self.position :].double() < draw_prob(candidates)
            places = drawn.nonzero().view(-1)[: count - len(taken)]
            seen = int(places[-1]) + 1 if len(places) == count - len(taken) else len(candidates)
            taken += candidates[places].tolist()
            skipped += seen - len(places)
            self.position += seen
        return taken, skipped

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.position = state["epoch"], state["position"]


def stable_hash(text: str) -> int:
    """A 63-bit hash of ``text`` (BLAKE2b), the same in every process and run (unlike Python's ``hash``)."""
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little") & (2**63 - 1)


def seeded_int(*parts: int) -> int:
    """A 63-bit seed from integers, stable across processes and runs."""
    return stable_hash(repr(parts))


@dataclass
class RowStream:
    """The rows of a streaming dataset in passes, for refills and prompt skipping: ``open_pass(epoch)`` iterates one
    pass (the same rows in the same order on every rank); ``key(row)`` is the row's 63-bit skip-history key.

    ``epoch`` and ``position`` (rows consumed in the pass) are the whole state: resuming reopens the pass and reads
    past ``position`` rows, so a resumed run draws what the uninterrupted one would have.
    """

    open_pass: Callable[[int], Iterator[dict]]
    key: Callable[[dict], int]
    seed: int
    epoch: int = 0
    position: int = 0
    _rows: Iterator[dict] | None = field(default=None, init=False, repr=False)
    _uniform: tuple[int, int, torch.Tensor] | None = field(default=None, init=False, repr=False)

    def _next_row(self) -> dict:
        if self._rows is None:
            self._rows = self.open_pass(self.epoch)
            for _ in range(self.position):
                next(self._rows)
        row = next(self._rows, None)
        if row is None:
            if self.position == 0:
                raise ValueError("dynamic_sampling and skip_zero_std_prompts: the streaming train_dataset is empty.")
            self.epoch, self.position, self._rows = self.epoch + 1, 0, None
            return self._next_row()
        return row

    def _place_uniform(self) -> float:
        """The seeded uniform of the current place of the pass (drawn per chunk of ``UNIFORM_CHUNK`` places)."""
        chunk = self.position // UNIFORM_CHUNK
        if self._uniform is None or self._uniform[:2] != (self.epoch, chunk):
            generator = torch.Generator().manual_seed(seeded_int(self.seed, SKIP_SEED_OFFSET, self.epoch, chunk))
            self._uniform = (self.epoch, chunk, torch.rand(UNIFORM_CHUNK, generator=generator, dtype=torch.float64))
        return float(self._uniform[2][self.position % UNIFORM_CHUNK])

    def draw(
        self, count: int, draw_prob: Callable[[torch.Tensor], torch.Tensor] | None = None
    ) -> tuple[list[dict], list[int], int]:
        """The next ``count`` rows drawn, their keys, and how many rows were skipped on the way; with ``draw_prob``
        (``(k,)`` keys -> ``(k,)`` probabilities) as ``PromptStream.draw``."""
        rows: list[dict] = []
        keys: list[int] = []
        skipped = 0
        while len(rows) < count:
            row = self._next_row()
            key = self.key(row)
            drawn = draw_prob is None or self._place_uniform() < float(draw_prob(torch.tensor([key]))[0])
            self.position += 1
            if drawn:
                rows.append(row)
                keys.append(key)
            else:
                skipped += 1
        return rows, keys, skipped

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.position, self._rows = state["epoch"], state["position"], None
