"""Tests of ``trl_zerostd/sampling/streams.py``: the refill prompt streams (map-style and streaming), their skips
and their state."""

import pytest
import torch

from trl_zerostd.sampling.streams import PromptStream, RowStream


def test_stream_walks_whole_passes_and_reshuffles_each():
    stream = PromptStream(5, seed=0)
    first, second = stream.take(5), stream.take(5)
    assert sorted(first) == sorted(second) == list(range(5))
    assert first != second  # each pass is a fresh permutation (seeded)
    assert (stream.epoch, stream.position) == (1, 5)


def test_stream_is_reproducible_and_resumes_from_its_state():
    draws = PromptStream(7, seed=3).take(10)
    assert PromptStream(7, seed=3).take(10) == draws
    assert PromptStream(7, seed=4).take(10) != draws
    stream = PromptStream(7, seed=3)
    stream.take(4)
    resumed = PromptStream(7, seed=3)
    resumed.load_state_dict(stream.state_dict())
    assert resumed.take(6) == draws[4:]


def test_stream_does_not_replay_the_dataloader_permutation():
    """TRL's RepeatSampler permutes with torch.randperm seeded by the run's seed: refills draw another order."""
    dataloader_order = torch.randperm(50, generator=torch.Generator().manual_seed(0)).tolist()
    assert PromptStream(50, seed=0).take(50) != dataloader_order


def test_empty_dataset_is_refused():
    with pytest.raises(ValueError, match="train_dataset"):
        PromptStream(0, seed=0)


def test_draw_skips_by_probability_and_counts_the_skipped():
    never = PromptStream(10, seed=0)
    assert never.draw(4, lambda rows: torch.ones(len(rows), dtype=torch.float64)) == (PromptStream(10, 0).take(4), 0)
    odd_only = PromptStream(10, seed=0)
    rows, skipped = odd_only.draw(7, lambda rows: (rows % 2).double())
    assert all(row % 2 for row in rows) and len(rows) == 7
    assert sorted(rows[:5]) == [1, 3, 5, 7, 9] and skipped >= 5  # each pass: the 5 even rows skipped
    assert (odd_only.epoch, odd_only.position) > (1, 0)


def test_draw_is_reproducible_and_resumes_from_its_state():
    half = lambda rows: torch.full((len(rows),), 0.5, dtype=torch.float64)  # noqa: E731
    draws = PromptStream(20, seed=1).draw(30, half)
    assert PromptStream(20, seed=1).draw(30, half) == draws
    assert 0 < draws[1] < 60  # about one skipped per draw at p = 0.5
    stream = PromptStream(20, seed=1)
    first = stream.draw(12, half)
    resumed = PromptStream(20, seed=1)
    resumed.load_state_dict(stream.state_dict())
    assert first[0] + resumed.draw(18, half)[0] == draws[0]


# RowStream: a streaming dataset's rows


def row_stream(num_rows: int, seed: int = 0, opened: list | None = None) -> RowStream:
    """A stream of ``{"prompt": "p<i>"}`` rows, reversed on odd passes (a reshuffle); ``opened`` logs the passes."""

    def open_pass(epoch: int):
        if opened is not None:
            opened.append(epoch)
        order = range(num_rows) if epoch % 2 == 0 else reversed(range(num_rows))
        return iter([{"prompt": f"p{i}"} for i in order])

    return RowStream(open_pass, key=lambda row: int(row["prompt"][1:]) + 1, seed=seed)


def test_row_stream_walks_the_rows_in_order_and_crosses_passes():
    stream = row_stream(4)
    rows, keys, skipped = stream.draw(6)
    assert [row["prompt"] for row in rows] == ["p0", "p1", "p2", "p3", "p3", "p2"] and skipped == 0
    assert keys == [1, 2, 3, 4, 4, 3] and stream.state_dict() == {"epoch": 1, "position": 2}


def test_row_stream_skips_by_probability_and_resumes_exactly():
    """Skip decisions read seeded uniforms per place; a stream rebuilt from the state of one that drew the first
    part draws what the uninterrupted one drew next (the pass is reopened and read past its position)."""
    odd_keys = lambda keys: (keys % 2).double()  # noqa: E731  keys 1, 3, ... drawn; 2, 4, ... always skipped
    half = lambda keys: torch.full((len(keys),), 0.5, dtype=torch.float64)  # noqa: E731
    rows, keys, skipped = row_stream(10).draw(7, odd_keys)
    assert all(key % 2 for key in keys) and skipped >= 5
    whole = row_stream(25, seed=3).draw(40, half)
    assert 10 < whole[2] < 80 and whole == row_stream(25, seed=3).draw(40, half)
    first = row_stream(25, seed=3)
    part = first.draw(17, half)
    opened = []
    resumed = row_stream(25, seed=3, opened=opened)
    resumed.load_state_dict(first.state_dict())
    rest = resumed.draw(23, half)
    assert part[1] + rest[1] == whole[1] and part[2] + rest[2] == whole[2]
    assert opened[0] == first.state_dict()["epoch"]


def test_row_stream_refuses_an_empty_stream():
    with pytest.raises(ValueError, match="streaming train_dataset is empty"):
        row_stream(0).draw(1)
