"""The launch every data-parallel test reads: every run of ``dp_worker.DDP_RUNS`` in one 2-process launch."""

from __future__ import annotations

import pytest

from tests.launch.dp_worker import DDP_RUNS
from tests.support.launching import DP_WORKER, launch_runs, two_process_command

TIMEOUT_S = 600


@pytest.fixture(scope="session")
def ddp_runs(tiny_model_dir, tmp_path_factory) -> dict[str, list[dict]]:
    """``{run: per-rank results}`` of one data-parallel launch over 2 processes (gloo) running every run in turn
    (``launch_runs`` checks each run's world size and that its replicas stayed in sync)."""
    out_root = tmp_path_factory.mktemp("ddp")
    command = two_process_command(DP_WORKER, tiny_model_dir, str(out_root), *DDP_RUNS)
    return launch_runs(command, out_root, DDP_RUNS, num_processes=2, timeout=TIMEOUT_S)
