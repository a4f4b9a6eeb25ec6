"""The typed values of a refill (pure): what a round asks for (``RoundRequest`` of ``RoundPart``), what comes back
(one ``GatheredRows`` per part: every rank's rows, gathered part-major so that a prompt's rows are consecutive and
every rank takes the same decisions), every group of the batch so far (``GeneratedPool``) and what the trainer gets
(``RefilledBatch``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..core.groups import unscorable_rows
from .sizes import rank_rows


@dataclass(frozen=True)
class RoundPart:
    """Rows a round generates for one purpose: ``copies[i]`` completions of each of ``prompts`` (dataset rows, the
    same on every rank; ``keys``: their skip-history keys), or, for TRL's own batch, ``rank_rows``: this rank's rows
    as the dataloader gave them. A round's parts are generated in one decode pass."""

    prompts: list[dict]
    copies: tuple[int, ...]
    keys: list[int]
    rank_rows: list[dict] | None = None

    @staticmethod
    def whole(prompts: list[dict], copies: int, keys: list[int]) -> RoundPart:
        """``copies`` completions of every prompt."""
        return RoundPart(prompts, (copies,) * len(prompts), keys)

    @staticmethod
    def rank_rows_of(rows: list[dict]) -> RoundPart:
        return RoundPart([], (), [], rank_rows=list(rows))

    def local_rows(self, world_size: int, rank: int) -> list[dict]:
        """This rank's rows of the part: each prompt repeated its ``copies``, the whole split evenly over ranks."""
        if self.rank_rows is not None:
            return self.rank_rows
        repeated = [dict(row) for row, copies in zip(self.prompts, self.copies, strict=True) for _ in range(copies)]
        return repeated[rank_rows(len(repeated), world_size, rank)]


@dataclass(frozen=True)
class RoundRequest:
    """What one round generates, in one decode pass: its parts, in order."""

    parts: list[RoundPart]


@dataclass(frozen=True)
class GatheredRows:
    """Rows generated in one round for one part, gathered from every rank in their part-major order (a prompt's rows
    consecutive): dataset rows, the trainer's per-row generation records, rewards ``(rows, K)``, truncation
    ``(rows,)``, the task reward that decides zero variance ``(rows,)``, and the columns reward functions logged for
    each row (``log_extra``)."""

    rows: list[dict]
    records: list[tuple]
    rewards_per_func: torch.Tensor
    truncated: torch.Tensor
    task_rewards: torch.Tensor
    logged: list[dict]

    def take(self, start: int, stop: int) -> GatheredRows:
        rows = slice(start, stop)
        return GatheredRows(
            self.rows[rows], self.records[rows], self.rewards_per_func[rows], self.truncated[rows],
            self.task_rewards[rows], self.logged[rows],
        )  # fmt: skip

    def valid(self) -> torch.Tensor:
        """``(rows,)`` bool: neither truncated nor unscorable."""
        return ~(self.truncated | unscorable_rows(self.rewards_per_func))

    @staticmethod
    def concat(parts: list[GatheredRows]) -> GatheredRows:
        return GatheredRows(
            [row for part in parts for row in part.rows],
            [record for part in parts for record in part.records],
            torch.cat([part.rewards_per_func for part in parts]),
            torch.cat([part.truncated for part in parts]),
            torch.cat([part.task_rewards for part in parts]),
            [logged for part in parts for logged in part.logged],
        )

    @staticmethod
    def split(rows: GatheredRows, part_sizes: list[int]) -> list[GatheredRows]:
        """``rows`` (every part of a round, part-major) as one ``GatheredRows`` per part of ``part_sizes`` rows."""
        starts = [sum(part_sizes[:p]) for p in range(len(part_sizes))]
        return [rows.take(start, start + size) for start, size in zip(starts, part_sizes)]


@dataclass
class GeneratedPool:
    """Every whole group generated for one batch so far, in gathered order (every rank holds all of it), their
    ``(groups,)`` informative flags and, with prompt skipping, skip-history keys (every part comes from the stream),
    and the prompts skipped."""

    groups: list[GatheredRows] = field(default_factory=list)
    informative: list[torch.Tensor] = field(default_factory=list)
    keys: list[int] = field(default_factory=list)
    skipped: int = 0

    def add(self, groups: GatheredRows, informative: torch.Tensor, keys: list[int]) -> None:
        """``groups``: whole groups of ``num_generations`` rows."""
        self.groups.append(groups)
        self.informative.append(informative)
        self.keys += keys

    def counts(self) -> tuple[int, int]:
        """``(informative, generated)`` group counts."""
        flags = torch.cat(self.informative) if self.informative else torch.zeros(0, dtype=torch.bool)
        return int(flags.sum()), len(flags)


@dataclass(frozen=True)
class RefilledBatch:
    """This rank's rows of the groups that train, their generation records (the trainer joins them into what TRL's
    ``_generate`` returns) and the columns reward functions logged for them, the gathered ``(N, K)`` rewards and
    ``(N,)`` truncation of the batch, and the refill's train metrics."""

    rows: list[dict]
    records: list[tuple]
    logged: list[dict]
    rewards_per_func: torch.Tensor
    truncated: torch.Tensor
    metrics: dict[str, float]
