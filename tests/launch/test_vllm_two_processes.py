"""TRL's own vLLM code over the stand-in engine (``tests/support/fake_vllm.py``) in two processes
(``tests/launch/vllm_worker.py``): every row is its own prompt's, and the rows, advantages and parameters equal one
process's, with prompt skipping and with tied groups training on their entropy-shaped advantages."""

from __future__ import annotations

import pytest

from tests.support.launching import VLLM_WORKER, by_row, launch_runs, one_process_command, two_process_command
from tests.support.vllm_cases import GLOBAL_BATCH

CASES = [
    ("grpo", "server", "dynamic"),
    pytest.param("grpo", "colocate", "dynamic_skipping", marks=pytest.mark.every_trl),
    ("rloo", "server", "dynamic"),
    ("grpo", "server", "skipping"),
    pytest.param("grpo", "server", "entropy", marks=pytest.mark.every_trl),
]
RUNS = ["-".join(case.values if hasattr(case, "values") else case) for case in CASES]
TIMEOUT_S = 600


@pytest.fixture(scope="module")
def vllm_runs(tiny_model_dir, tmp_path_factory):
    """``{processes: {run: per-rank results}}``: every case in one launch over 2 processes and in one process
    (``launch_runs`` checks each run's world size and that its replicas stayed in sync)."""
    runs = {}
    for processes, command in ((2, two_process_command), (1, one_process_command)):
        out_root = tmp_path_factory.mktemp(f"vllm-{processes}")
        launch = command(VLLM_WORKER, tiny_model_dir, str(out_root), *RUNS)
        runs[processes] = launch_runs(launch, out_root, RUNS, num_processes=processes, timeout=TIMEOUT_S)
    return runs


@pytest.mark.parametrize("kind,mode,feature", CASES)
def test_two_processes_generate_and_train_as_one(vllm_runs, kind, mode, feature):
    """Two ranks over gloo (server: rank 0 asks the engine for every rank's rows and each takes its slice; colocate:
    an engine per rank): every row is its own prompt's, the calls stay within TRL's sizes, and the rows, advantages
    and parameters equal one process's."""
    run = f"{kind}-{mode}-{feature}"
    ranks, single = vllm_runs[2][run], vllm_runs[1][run]
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
