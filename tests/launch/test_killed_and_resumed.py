"""Resuming: a run killed hard (SIGKILL) right after a checkpoint and resumed with ``resume_from_checkpoint`` is the
run never interrupted, bit for bit on CPU: the same parameters, and the same logged metrics at every step (prompts
drawn and skipped, refill rounds, rewards, losses). With masking, dynamic sampling, prompt skipping and
``zero_std_kl="keep_failed"`` in 1 process and in 2; in 2 processes (each rank's state and the state they share) on
a streaming dataset, with the success rates' prior by prompt, with prompt skipping alone, and with tied groups
training on their entropy-shaped advantages (``tests/launch/resume_worker.py``). TRL's own trainer, in 1 process, is
the control. Each case is killed in a launch of its own; the uninterrupted runs share one launch per process count,
and so do the resumed ones.
"""

import json
import signal
from dataclasses import dataclass
from pathlib import Path
from subprocess import CompletedProcess

import pytest

from tests.launch.resume_worker import SETTINGS
from tests.support.launching import RESUME_WORKER, one_process_command, run_from_root, two_process_command

TIMEOUT_S = 600
CASES = [
    ("ours", 1),
    ("ours", 2),
    ("ours-streaming", 2),
    ("ours-prior", 2),
    pytest.param("ours-skipping", 2, marks=pytest.mark.every_trl),
    ("ours-entropy", 2),
    pytest.param("base", 1, marks=pytest.mark.every_trl),  # TRL's own trainer, the control
]


@dataclass
class Launches:
    """A case's three runs under ``root/MODE/KIND``: its own killed launch, and the launches of the uninterrupted and
    the resumed runs that it shares with every case of its process count."""

    root: Path
    killed: CompletedProcess
    full: CompletedProcess
    resumed: CompletedProcess


def run_worker(model_dir, out_root, processes, mode, *kinds):
    command = (two_process_command if processes == 2 else one_process_command)(
        RESUME_WORKER, model_dir, str(out_root), mode, *kinds
    )
    return run_from_root(command, timeout=TIMEOUT_S)


@pytest.fixture(scope="module")
def launches(request, tiny_model_dir, tmp_path_factory) -> dict[tuple[str, int], Launches]:
    """Every case the session selected, by process count: each killed in a launch of its own (the kill ends the
    process), then all the uninterrupted runs in one launch and all the resumed ones in another, in the other order
    (a launch's cost is mostly its imports)."""
    selected = dict.fromkeys(
        (item.callspec.params["kind"], item.callspec.params["processes"])
        for item in request.session.items
        if item.module is request.module
        and getattr(item, "originalname", None) == "test_a_killed_and_resumed_run_equals_the_uninterrupted_one"
    )
    launched = {}
    for processes in sorted({processes for _, processes in selected}):
        kinds = [kind for kind, p in selected if p == processes]
        root = tmp_path_factory.mktemp(f"resume-{processes}")
        killed = {kind: run_worker(tiny_model_dir, root, processes, "kill", kind) for kind in kinds}
        full = run_worker(tiny_model_dir, root, processes, "full", *kinds)
        # the other order: a state one run left in the process would show as a difference
        resumable = [kind for kind in reversed(kinds) if (root / "kill" / kind / "checkpoint-3").is_dir()]
        resumed = run_worker(tiny_model_dir, root, processes, "resume", *resumable)
        launched.update({(kind, processes): Launches(root, killed[kind], full, resumed) for kind in kinds})
    return launched


@pytest.mark.parametrize(("kind", "processes"), CASES)
def test_a_killed_and_resumed_run_equals_the_uninterrupted_one(launches, kind, processes):
    run = launches[kind, processes]
    assert run.full.returncode == 0, run.full.stderr[-4000:]
    killed_dir = run.root / "kill" / kind
    killed_output = run.killed.stderr[-4000:]
    assert (killed_dir / "checkpoint-3").is_dir() and not (killed_dir / "result.json").exists(), killed_output
    # it died at the checkpoint, as a crashed job would: SIGKILL (one process; a launch reports its ranks' failure)
    assert run.killed.returncode == (-signal.SIGKILL if processes == 1 else 1), killed_output
    assert run.resumed.returncode == 0, run.resumed.stderr[-4000:]

    expected = json.loads((run.root / "full" / kind / "result.json").read_text())
    actual = json.loads((run.root / "resume" / kind / "result.json").read_text())
    assert [step["step"] for step in expected["steps"]] == [1, 2, 3, 4, 5, 6]
    assert actual["steps"] == expected["steps"]  # steps 1-3 from the checkpoint, 4-6 trained again
    assert actual["parameters"] == expected["parameters"]
    if kind != "base":  # the features whose state the checkpoint carries were at work after it
        after = expected["steps"][3:]
        if SETTINGS[kind].get("dynamic_sampling"):
            assert all(step["dynamic_sampling/rounds"] >= 1 for step in after)
        if SETTINGS[kind].get("skip_zero_std_prompts"):
            assert sum(step["prompt_skip/skipped_frac"] for step in after) > 0
        if SETTINGS[kind].get("tied_group_entropy_scale"):  # tied groups trained after the checkpoint
            assert sum(step["zero_std/tied_trained_group_frac"] for step in after) > 0
