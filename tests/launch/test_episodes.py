"""A refill with a stateful environment in two processes (``tests/launch/episode_worker.py``), on HF generate and on
TRL's vLLM code over the stand-in engine: one reset per rollout on every rank, every rollout scored from its own
episode, and TRL's completions log pairs each completion with its own prompt."""

from __future__ import annotations

import json

import pytest

from tests.support.launching import one_process_command, run_from_root, two_process_command
from tests.trainer.test_refill_inputs import assert_episodes_kept

EPISODE_WORKER = "tests.launch.episode_worker"


@pytest.mark.parametrize(
    "engine,feature,processes",
    [
        ("hf", "dynamic_skipping", 2),
        pytest.param("server", "dynamic", 2, marks=pytest.mark.every_trl),
        ("colocate", "skipping", 2),
        ("colocate", "dynamic", 1),
    ],
)
def test_each_rollout_keeps_its_episode(tiny_tool_model_dir, tmp_path, engine, feature, processes):
    command = (one_process_command if processes == 1 else two_process_command)(
        EPISODE_WORKER, tiny_tool_model_dir, str(tmp_path), engine, feature
    )
    done = run_from_root(command, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    results = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in range(processes)]
    assert all(result["world_size"] == processes for result in results)
    assert_episodes_kept(results)
