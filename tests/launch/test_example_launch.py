"""The main job's script launched as a user launches it, over 2 CPU processes."""

import json

from tests.support.launching import run_from_root, two_process_command

TINY_RUN = [
    "--max_steps", "2", "--num_prompts", "32", "--per_device_train_batch_size", "16", "--warm_start_steps", "0",
]  # fmt: skip


def test_two_process_launch_of_the_example_exits_cleanly(tmp_path):
    """A user's ``accelerate launch --multi_gpu --num_processes 2 scripts/train_grpo.py`` (gloo on CPU) ends with exit
    code 0 and no C++ abort: the script destroys the process group (``train_cli.main``). Without that, torch's gloo
    threads can abort the exit after training finished (``python -m tests.tools.stress_launches`` counts it)."""
    command = two_process_command("scripts/train_grpo.py", "--output_dir", str(tmp_path), *TINY_RUN, "--plot", "false")
    done = run_from_root(command, timeout=300)
    assert done.returncode == 0 and "terminate called" not in done.stderr, done.stderr[-4000:]
    history = json.loads((tmp_path / "metrics.json").read_text())
    assert [entry["step"] for entry in history if "reward" in entry] == [1, 2]
