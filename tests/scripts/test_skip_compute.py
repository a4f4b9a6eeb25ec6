"""The benchmark's exact counts (no timing is asserted: timings belong to scripts/bench.py, not to tests)."""

import json

import pytest

from studies.skip_compute import BenchArguments, format_table, run_benchmark, zero_variance_batch

REQUIRED_KEYS = {
    "f",
    "update_time_ratio",
    "step_time_ratio",
    "rows_forwarded_ours",
    "rows_forwarded_base",
    "peak_mem_ratio",
}


def test_zero_variance_batch_has_the_asked_fraction_of_tied_groups():
    rows, completions = zero_variance_batch(0.5, num_groups=4, num_generations=4, length=6, seed=0)
    rewards = [c.startswith("y") for c in completions]
    groups = [rewards[i : i + 4] for i in range(0, 16, 4)]
    assert [len(set(g)) == 1 for g in groups] == [True, True, False, False]
    assert all(len(c) == 5 for c in completions) and rows[4]["prompt"] != rows[3]["prompt"]


@pytest.mark.every_trl  # counts TRL's own forwards on the same batch
def test_masked_rows_are_not_forwarded(tmp_path):
    args = BenchArguments(
        fractions=[0.0, 0.5, 1.0], repeats=1, warmup=0, num_groups=2, num_generations=4, completion_length=6,
        hidden_size=32, num_layers=1, json=str(tmp_path / "bench.json"), plot=str(tmp_path / "bench.png"),
    )  # fmt: skip
    table = run_benchmark(args)
    assert json.loads((tmp_path / "bench.json").read_text()) == table
    assert (tmp_path / "bench.png").stat().st_size > 0
    assert all(REQUIRED_KEYS <= row.keys() for row in table)
    assert [row["rows_forwarded_base"] for row in table] == [8, 8, 8]
    assert [row["rows_forwarded_ours"] for row in table] == [8, 4, 1]  # all masked: one row at zero weight
    assert [row["tokens_forwarded_ours"] * 2 == row["tokens_forwarded_base"] for row in table][1]
    assert table[1]["peak_mem_ratio"] < 0.75
    assert "| 0.50 |" in format_table(table)
