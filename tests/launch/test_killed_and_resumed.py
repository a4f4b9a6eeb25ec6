"""Resuming: a run killed hard (SIGKILL) right after a checkpoint and resumed with ``resume_from_checkpoint`` is the
run never interrupted, bit for bit on CPU: the same parameters, and the same logged metrics at every step (prompts
drawn and skipped, refill rounds, rewards, losses). With masking, dynamic sampling, prompt skipping and
``zero_std_kl="keep_failed"`` in 1 process and in 2; in 2 processes (each rank's state and the state they share) on
a streaming dataset, with the success rates' prior by prompt, with prompt skipping alone, and with tied groups
training on their entropy-shaped advantages (``tests/launch/resume_worker.py``). TRL's own trainer, in 1 process, is
the control.
"""

import json

import pytest

from tests.launch.resume_worker import SETTINGS
from tests.support.launching import RESUME_WORKER, one_process_command, run_from_root, two_process_command

TIMEOUT_S = 300


def run_worker(model_dir, run_dir, mode, kind, processes, killed_run_dir=None):
    args = [model_dir, str(run_dir), mode, kind, *([str(killed_run_dir)] if killed_run_dir else [])]
    command = (two_process_command if processes == 2 else one_process_command)(RESUME_WORKER, *args)
    return run_from_root(command, timeout=TIMEOUT_S)


@pytest.mark.parametrize(
    ("kind", "processes"),
    [
        ("ours", 1),
        ("ours", 2),
        ("ours-streaming", 2),
        ("ours-prior", 2),
        pytest.param("ours-skipping", 2, marks=pytest.mark.every_trl),
        ("ours-entropy", 2),
        ("base", 1),
    ],
)
def test_a_killed_and_resumed_run_equals_the_uninterrupted_one(tiny_model_dir, tmp_path, kind, processes):
    full = run_worker(tiny_model_dir, tmp_path / "full", "full", kind, processes)
    assert full.returncode == 0, full.stderr[-4000:]
    killed = run_worker(tiny_model_dir, tmp_path / "killed", "kill", kind, processes)
    assert killed.returncode != 0  # it died at the checkpoint, as a crashed job would
    assert (tmp_path / "killed" / "checkpoint-3").is_dir() and not (tmp_path / "killed" / "result.json").exists()
    resumed = run_worker(tiny_model_dir, tmp_path / "resumed", "resume", kind, processes, tmp_path / "killed")
    assert resumed.returncode == 0, resumed.stderr[-4000:]

    expected = json.loads((tmp_path / "full" / "result.json").read_text())
    actual = json.loads((tmp_path / "resumed" / "result.json").read_text())
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
