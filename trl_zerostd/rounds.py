"""One round of a refill across ranks: this rank's rows of every part generated in one decode pass, scored, and
gathered back part-major, so that every rank holds the same rows and takes the same decisions.

The typed values a refill passes around: ``GatheredRows`` (one part of a round), ``GeneratedPool`` (every group of
the batch so far), ``RefilledBatch`` (what the trainer gets back).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import torch
from accelerate.utils import gather_object

from . import core
from .sampling import part_major_order, rank_rows


class RefillHost(Protocol):
    """What a refill calls on the trainer: TRL's own prompt preparation and scoring, run through its overrides."""

    def _prepared_prompts(self, rows: list[dict]) -> list:
        """TRL's prompts for this rank's ``rows`` (images, environments, tool dicts), as its method prepares them."""
        ...

    def _score_generation(self, rows: list[dict], prompts: list, generated: tuple) -> tuple[torch.Tensor, ...]:
        """Gathered ``(N, K)`` rewards and ``(N,)`` truncation of what TRL's ``_generate`` returned for ``rows``."""
        ...

    def _split_generated(self, generated: tuple) -> list[tuple]:
        """What TRL's ``_generate`` returned, as one record per row."""
        ...

    def _join_generated(self, records: list[tuple]) -> tuple:
        """The inverse of ``_split_generated``."""
        ...

    def _take_logged_columns(self, rows: int) -> list[dict]:
        """Per row just scored, the columns reward functions logged for it, taken out of TRL's pending logs."""
        ...

    def _task_rewards(self, rewards_per_func: torch.Tensor) -> torch.Tensor:
        """``(N,)`` reward that decides zero variance."""
        ...


@dataclass(frozen=True)
class GatheredRows:
    """Rows generated in one round for one part, gathered from every rank in their part-major order (a prompt's rows
    consecutive): dataset rows, the trainer's per-row generation records, rewards ``(rows, K)``, truncation
    ``(rows,)``, and the columns reward functions logged for each row (``log_extra``)."""

    rows: list[dict]
    records: list[tuple]
    rewards_per_func: torch.Tensor
    truncated: torch.Tensor
    logged: list[dict]

    def take(self, start: int, stop: int) -> GatheredRows:
        rows = slice(start, stop)
        return GatheredRows(
            self.rows[rows], self.records[rows], self.rewards_per_func[rows], self.truncated[rows], self.logged[rows]
        )

    def valid(self) -> torch.Tensor:
        """``(rows,)`` bool: neither truncated nor unscorable."""
        return ~(self.truncated | core.unscorable_rows(self.rewards_per_func))

    @staticmethod
    def concat(parts: list[GatheredRows]) -> GatheredRows:
        return GatheredRows(
            [row for part in parts for row in part.rows],
            [record for part in parts for record in part.records],
            torch.cat([part.rewards_per_func for part in parts]),
            torch.cat([part.truncated for part in parts]),
            [logged for part in parts for logged in part.logged],
        )


@dataclass(frozen=True)
class Screened:
    """A prompt whose screen rows differ in task reward, waiting for the rest of its group."""

    row: dict  # the dataset row, as drawn
    key: int  # its skip-history key
    screen: GatheredRows


@dataclass
class GeneratedPool:
    """Every whole group generated for one batch so far, in gathered order (every rank holds all of it), their
    ``(groups,)`` informative flags and, with prompt skipping, skip-history keys (every part comes from the stream),
    and the prompts skipped. With screening, the screens that were tied (``tied_screens``, with their keys) and the
    keys of passed screens never completed (``unfinished_keys``). Under ``skip_refill=False``, ``slots`` ``(batch
    groups,)``: the generated group that fills each place of the batch, -1 for a skipped prompt's empty slot."""

    groups: list[GatheredRows] = field(default_factory=list)
    informative: list[torch.Tensor] = field(default_factory=list)
    keys: list[int] = field(default_factory=list)
    skipped: int = 0
    tied_screens: list[GatheredRows] = field(default_factory=list)
    tied_screen_keys: list[int] = field(default_factory=list)
    unfinished_keys: list[int] = field(default_factory=list)
    slots: torch.Tensor | None = None

    def add(self, groups: GatheredRows, informative: torch.Tensor, keys: list[int]) -> None:
        self.groups.append(groups)
        self.informative.append(informative)
        self.keys += keys

    def counts(self) -> tuple[int, int]:
        """``(informative, generated)`` group counts: whole groups, then screens tied or never completed."""
        flags = torch.cat(self.informative) if self.informative else torch.zeros(0, dtype=torch.bool)
        return int(flags.sum()), len(flags) + len(self.tied_screen_keys) + len(self.unfinished_keys)


@dataclass(frozen=True)
class RefilledBatch:
    """This rank's rows of the groups that train, what TRL's ``_generate`` gives for them and the columns reward
    functions logged for them, the gathered ``(N, K)`` rewards, ``(N,)`` truncation and empty slots
    (``skip_refill=False``: a copy of a generated group, reward NaN) of the batch, and the refill's train metrics."""

    rows: list[dict]
    generated: tuple
    logged: list[dict]
    rewards_per_func: torch.Tensor
    truncated: torch.Tensor
    empty: torch.Tensor
    metrics: dict[str, float]


def local_rows(rows: list[dict], per_prompt: int, world_size: int, rank: int) -> list[dict]:
    """This rank's rows of ``per_prompt`` copies of each of ``rows`` (gathered rows split evenly over ranks)."""
    repeated = [dict(row) for row in rows for _ in range(per_prompt)]
    return repeated[rank_rows(len(repeated), world_size, rank)]


def generate_round(
    parts: list[list[dict]], host: RefillHost, generate: Callable[[list], tuple], world_size: int
) -> list[GatheredRows]:
    """One decode pass (``generate``: TRL's ``_generate``) over this rank's rows of every part; each part's rows come
    back gathered, a prompt's rows consecutive."""
    rows = [row for part in parts for row in part]
    prompts = host._prepared_prompts(rows)
    generated = generate(prompts)
    rewards_per_func, truncated = host._score_generation(rows, prompts, generated)
    logged = host._take_logged_columns(len(rows))
    sizes = [len(part) for part in parts]
    order = part_major_order(sizes, world_size)
    rewards_per_func = rewards_per_func[order.to(rewards_per_func.device)]
    truncated = truncated[order.to(truncated.device)]
    gathered_rows, records = gather_object(rows), gather_object(host._split_generated(generated))
    logged = gather_object(logged)
    order = order.tolist()
    gathered_rows, records, logged = ([values[i] for i in order] for values in (gathered_rows, records, logged))
    gathered = GatheredRows(gathered_rows, records, rewards_per_func, truncated, logged)
    start, result = 0, []
    for size in sizes:
        result.append(gathered.take(start, start + size * world_size))
        start += size * world_size
    return result
