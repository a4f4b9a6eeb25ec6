"""TRL's own vLLM code over the stand-in engine (``tests/support/fake_vllm.py``) in two processes
(``tests/launch/vllm_worker.py``): every row is its own prompt's, and the rows, advantages and parameters equal one
process's, with prompt skipping and with tied groups training on their entropy-shaped advantages."""

from __future__ import annotations

import json

import pytest

from tests.support.launching import VLLM_WORKER, by_row, one_process_command, run_from_root, two_process_command
from tests.support.vllm_cases import GLOBAL_BATCH


@pytest.mark.parametrize(
    "kind,mode,feature",
    [
        ("grpo", "server", "dynamic"),
        ("grpo", "colocate", "dynamic_skipping"),
        ("rloo", "server", "dynamic"),
        ("grpo", "server", "skipping"),
        ("grpo", "server", "entropy"),
    ],
)
def test_two_processes_generate_and_train_as_one(tiny_model_dir, tmp_path, kind, mode, feature):
    """Two ranks over gloo (server: rank 0 asks the engine for every rank's rows and each takes its slice; colocate:
    an engine per rank): every row is its own prompt's, the calls stay within TRL's sizes, and the rows, advantages
    and parameters equal one process's."""
    ranks = launch_vllm(tiny_model_dir, tmp_path / "dp", kind, mode, feature)
    single = launch_vllm(tiny_model_dir, tmp_path / "single", kind, mode, feature, num_processes=1)
    for result in ranks + single:
        assert result["scored_rows"] == 0 or not result["foreign"], result["foreign"][:3]
        per_rank = GLOBAL_BATCH // result["world_size"]
        assert all(prompts * n <= per_rank * (2 if mode == "server" else 1) and current
                   for prompts, n, current in result["calls"])  # fmt: skip
    assert sum(result["scored_rows"] for result in ranks) > 0
    rows, single_rows = by_row(ranks), by_row(single)
    assert [row[:2] + row[3:] for row in rows] == [row[:2] + row[3:] for row in single_rows]
    assert [row[2] for row in rows] == pytest.approx([row[2] for row in single_rows], abs=1e-6)  # RLOO's KL: sums
    assert ranks[0]["checksum"] == pytest.approx(single[0]["checksum"], rel=1e-6)
    if feature == "entropy":  # "1+1=" always right: its tied rows train, their advantages shaped at the loss
        assert any(prompt == "1+1=" and tokens > 0 for prompt, _, _, tokens in rows)


def launch_vllm(model_dir, out_dir, kind, mode, feature, num_processes=2):
    out_dir.mkdir()
    args = [model_dir, str(out_dir), kind, mode, feature]
    command = (one_process_command if num_processes == 1 else two_process_command)(VLLM_WORKER, *args)
    done = run_from_root(command, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    results = [json.loads((out_dir / f"rank{rank}.json").read_text()) for rank in range(num_processes)]
    assert len({result["checksum"] for result in results}) == 1  # the replicas stayed in sync
    return results
