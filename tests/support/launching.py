"""How the multi-process tests start their workers: as modules (``accelerate launch ... -m tests.launch.dp_worker``,
``python -m tests.launch.resume_worker``), run from the repository root, or a script by path (``accelerate launch
... scripts/train_grpo.py``, as a user runs it). ``python -m`` puts the directory it starts in first on ``sys.path``,
so every process of a launch imports ``tests.support`` and this checkout's ``trl_zerostd``; ``scripts/`` (the demo
tasks and the tiny model the workers build) is put on ``PYTHONPATH``, as pytest's ``pythonpath`` does in process."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DP_WORKER = "tests.launch.dp_worker"
RESUME_WORKER = "tests.launch.resume_worker"
VLLM_WORKER = "tests.launch.vllm_worker"


def free_port() -> str:
    """A port no other launch holds (a fixed one can still be in use by the previous launch's rendezvous)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return str(probe.getsockname()[1])


def one_process_command(module: str, *args: str) -> list[str]:
    """``python -m module args``: one process, no launcher; a ``module`` ending in ``.py`` is a script run by path."""
    return [sys.executable, *([module] if module.endswith(".py") else ["-m", module]), *args]


def two_process_command(module: str, *args: str, config_file: Path | None = None) -> list[str]:
    """``accelerate launch -m module args`` over 2 CPU processes (gloo), on a free port, data-parallel or as
    ``config_file`` says (FSDP2, ZeRO-3); a ``module`` ending in ``.py`` is a script launched by path."""
    target = [module] if module.endswith(".py") else ["-m", module]
    layout = ["--config_file", str(config_file)] if config_file else ["--multi_gpu"]
    return [
        sys.executable, "-m", "accelerate.commands.launch", *layout, "--num_processes", "2",
        "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", free_port(),
        *target, *args,
    ]  # fmt: skip


def scripts_on_path(env: dict | None = None) -> dict:
    """``env`` (default: this process's) with ``scripts/`` first on ``PYTHONPATH``."""
    env = dict(os.environ if env is None else env)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "scripts"), env.get("PYTHONPATH")]))
    return env


def run_from_root(command: list[str], timeout: float, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run ``command`` from the repository root (where its ``-m`` module resolves), its output captured."""
    return subprocess.run(
        command, cwd=ROOT, capture_output=True, text=True, timeout=timeout, check=False, env=scripts_on_path(env)
    )


def train_each(train_one, model_dir: str, out_root: str, runs: tuple[str, ...]):
    """In a worker: ``train_one(model_dir, out_root/run, *run.split("-"))`` for each run in turn, each in a folder of
    its own; returns the last one's accelerator (the process's state, which the runs share)."""
    for run in runs:
        out_dir = os.path.join(out_root, run)
        os.makedirs(out_dir, exist_ok=True)
        accelerator = train_one(model_dir, out_dir, *run.split("-"))
    return accelerator


def launch_runs(
    command: list[str], out_root: Path, runs: list[str], num_processes: int, timeout: float, env: dict | None = None
) -> dict[str, list[dict]]:
    """Run ``command``, a worker launched once for every run of ``runs`` (it writes ``out_root/run/rank{r}.json``),
    and return each run's per-rank results. A launch's cost is mostly its processes importing torch, transformers
    and TRL, a dozen seconds each on 2 cores: many runs to a launch, not one."""
    done = run_from_root(command, timeout=timeout, env=env)
    assert done.returncode == 0, done.stderr[-4000:]
    results = {
        run: [json.loads((out_root / run / f"rank{rank}.json").read_text()) for rank in range(num_processes)]
        for run in runs
    }
    for run, ranks in results.items():
        assert [rank["world_size"] for rank in ranks] == [num_processes] * num_processes, run
        assert len({rank["checksum"] for rank in ranks}) == 1, run  # the replicas stayed in sync
    return results


def by_row(results):
    """Every rank's trained rows, ``(prompt, completion, advantage, tokens)``, sorted: the batch whatever the split."""
    return sorted((r["prompt"], r["completion"], r["advantage"], r["tokens"]) for res in results for r in res["rows"])
