"""Every runnable script of ``scripts/`` starts when run by path from any folder, as TRL's example scripts do
(``python scripts/train_grpo.py``, ``accelerate launch scripts/train_grpo.py``; the launch itself:
``tests/launch/test_example_launch.py``): its imports resolve with no ``PYTHONPATH`` set and ``--help`` prints its
usage."""

from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RUNNABLE = sorted(path for path in (ROOT / "scripts").rglob("*.py") if '__name__ == "__main__"' in path.read_text())


def run_help(path: Path, cwd: Path) -> tuple[Path, subprocess.CompletedProcess]:
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    done = subprocess.run([sys.executable, str(path), "--help"], cwd=cwd, env=env, capture_output=True, text=True)
    return path, done


def test_every_runnable_script_starts_by_path(tmp_path):
    names = {str(path.relative_to(ROOT)) for path in RUNNABLE}
    assert {"scripts/train_grpo.py", "scripts/train_rloo.py", "scripts/studies/time_to_accuracy.py"} <= names
    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(lambda path: run_help(path, tmp_path), RUNNABLE))
    failed = {str(path.relative_to(ROOT)): done.stderr[-1500:] for path, done in results if done.returncode != 0}
    assert not failed, failed
    assert all("usage" in done.stdout.lower() for _, done in results)
