"""How many groups a refill round generates, which groups train, and how gathered rows are ordered and split over
ranks (pure). Groups are counted over the gathered batch (all ranks); ``G = num_generations``.
"""

from __future__ import annotations

import math

import torch

MAX_ROUND_BATCHES = 2  # a refill round generates at most this many generation batches (bounded generation memory)


def refill_groups(
    missing: int, informative: float, generated: float, batch_groups: int, world_size: int, G: int
) -> int:
    """Groups a refill round generates: the ``missing`` informative groups divided by the informative rate seen so
    far (``informative / generated``, at least ``1 / batch_groups``), at most ``MAX_ROUND_BATCHES`` batches, rounded up
    so that the round's ``groups * G`` rows split evenly over ``world_size`` ranks. Each round costs a whole
    sequential decode, so fewer, larger rounds beat many small ones (scripts/studies/dynamic_sampling.py)."""
    rate = max(informative / generated if generated else 0.0, 1.0 / batch_groups)
    groups = min(math.ceil(missing / rate), MAX_ROUND_BATCHES * batch_groups)
    return splittable(groups, G, world_size)


def splittable(prompts: int, rows_per_prompt: int, world_size: int) -> int:
    """``prompts`` rounded up so that their ``prompts * rows_per_prompt`` rows split evenly over ``world_size``."""
    step = world_size // math.gcd(rows_per_prompt, world_size)
    return math.ceil(prompts / step) * step


def first_round_extra(needed: int, seen_informative: float, seen_generated: float, world_size: int, G: int) -> int:
    """Groups to generate beside the ``needed`` ones of the dataloader in the first round, so that at the informative
    rate seen in earlier batches one decode pass usually fills the batch (0 before any batch was seen)."""
    if seen_generated == 0:
        return 0
    return refill_groups(needed, seen_informative, seen_generated, needed, world_size, G) - needed


def part_major_order(part_sizes: list[int], world_size: int) -> torch.Tensor:
    """Gathered rows are rank-major: each rank's rows, of each part in turn. The indices that put them part-major,
    each part rank-major (its rows in their gathered layout), so that a part's groups stay whole."""
    per_rank = sum(part_sizes)
    offsets = [sum(part_sizes[:p]) for p in range(len(part_sizes))]
    return torch.tensor(
        [rank * per_rank + offset + i for offset, size in zip(offsets, part_sizes)
         for rank in range(world_size) for i in range(size)]
    )  # fmt: skip


def choose_groups(informative: torch.Tensor, needed: int) -> torch.Tensor:
    """Indices of the ``needed`` groups that train, from the ``(M,)`` bool ``informative`` flags of every group
    generated (in generation order): the first informative ones; at the cap, then the first others (they train
    masked). Surplus informative groups are dropped, never kept for a later update (they would be off-policy)."""
    order = torch.cat([informative.nonzero().view(-1), (~informative).nonzero().view(-1)])
    return order[:needed]


def rank_rows(rows: int, world_size: int, rank: int) -> slice:
    """This rank's rows of ``rows`` gathered rows split evenly over ranks, rank-major (TRL's layout)."""
    per_rank = rows // world_size
    return slice(rank * per_rank, (rank + 1) * per_rank)
