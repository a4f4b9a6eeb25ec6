"""Tests of ``trl_zerostd/sampling/sizes.py``: the refill sizes, the choice of groups and the rows of each rank."""

import pytest
import torch

from trl_zerostd.sampling.sizes import choose_groups, first_round_extra, part_major_order, rank_rows, refill_groups


@pytest.mark.parametrize(
    ("missing", "informative", "generated", "world", "expected"),
    [
        (4, 4, 8, 1, 8),  # rate 1/2: twice the missing groups
        (1, 6, 8, 1, 2),  # rate 3/4: ceil(1 / 0.75)
        (8, 0, 8, 1, 16),  # no informative group yet: two whole batches, never more
        (3, 1, 8, 1, 16),  # 3 / (1/8) capped at two batches
        (6, 2, 8, 1, 16),  # rate 1/4: 24 groups, capped
        (1, 8, 8, 1, 1),
        (1, 8, 8, 3, 3),  # 1 group of G=4 rows over 3 ranks: rounded up to 3 groups (12 rows)
        (1, 8, 8, 2, 1),  # 4 rows split over 2 ranks already
    ],
)
def test_refill_groups(missing, informative, generated, world, expected):
    assert refill_groups(missing, informative, generated, batch_groups=8, world_size=world, G=4) == expected


def test_choose_groups_takes_the_first_informative_then_the_first_others():
    informative = torch.tensor([False, True, False, True, True])
    assert choose_groups(informative, 2).tolist() == [1, 3]  # the surplus informative group 4 is dropped
    assert choose_groups(informative, 4).tolist() == [1, 3, 4, 0]  # at the cap: completed by masked groups


def test_rank_rows():
    assert [rank_rows(8, 2, rank) for rank in (0, 1)] == [slice(0, 4), slice(4, 8)]


def test_first_round_extra_follows_the_rate_seen():
    assert first_round_extra(8, 0.0, 0.0, world_size=1, G=4) == 0  # nothing seen yet
    assert first_round_extra(8, 8.0, 8.0, world_size=1, G=4) == 0  # every group informative
    assert first_round_extra(8, 4.0, 8.0, world_size=1, G=4) == 8  # rate 1/2: twice the batch
    assert first_round_extra(8, 7.0, 8.0, world_size=1, G=4) == 2  # rate 7/8: ceil(8 / 0.875) = 10


def test_part_major_order_keeps_each_part_in_its_gathered_layout():
    """2 ranks, each generated [2 dataloader rows, 1 extra row]: gathered d0 d0 e0 d1 d1 e1 -> d0 d0 d1 d1 e0 e1."""
    assert part_major_order([2, 1], world_size=2).tolist() == [0, 1, 3, 4, 2, 5]
    assert part_major_order([3], world_size=2).tolist() == [0, 1, 2, 3, 4, 5]
