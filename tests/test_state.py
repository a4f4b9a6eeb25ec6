"""``trl_zerostd/state.py``: the state built from the settings (a feature on exactly when its object exists), saved and
restored. Resuming: a run killed hard (SIGKILL) right after a checkpoint and resumed with ``resume_from_checkpoint``
is the run never interrupted, bit for bit on CPU: the same parameters, and the same logged metrics at every step
(prompts drawn and skipped, refill rounds, rewards, losses), with masking, dynamic sampling, prompt skipping and
``zero_std_kl="keep_failed"``, in 1 process and in 2, on a map-style and on a streaming dataset, and with the
success-rate predictor (``tests/resume_worker.py``). TRL's own trainer is the control.
"""

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from datasets import Dataset
from test_distributed import two_process_command

from trl_zerostd.config import ZeroStdArguments
from trl_zerostd.core import RowRole
from trl_zerostd.state import SKIP_STATE_FILE, STATE_FILE, build_state

WORKER = Path(__file__).parent / "resume_worker.py"
TIMEOUT_S = 300


def run_worker(model_dir, run_dir, mode, kind, processes, killed_run_dir=None):
    script = [str(WORKER), model_dir, str(run_dir), mode, kind, *([str(killed_run_dir)] if killed_run_dir else [])]
    command = two_process_command(*script) if processes == 2 else [sys.executable, *script]
    return subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT_S, check=False)


@pytest.mark.parametrize(
    ("kind", "processes"),
    [("ours", 1), ("ours", 2), ("ours-streaming", 1), ("ours-streaming", 2), ("ours-rate", 1), ("ours-rate", 2),
     ("base", 1)],
)  # fmt: skip
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
        assert all(step["dynamic_sampling/rounds"] >= 1 for step in after)
        assert sum(step["prompt_skip/skipped_frac"] for step in after) > 0


def test_a_resume_with_other_settings_is_refused_and_one_with_the_same_trains_on(make_trainer, tmp_path):
    """The checkpoint's trl_zerostd settings must be the run's: the prompt stream, skipper and stall monitor were built
    from the run's own, so a resume under others raises, naming each setting; the same settings resume."""
    run_dir = str(tmp_path / "run")
    settings = dict(output_dir=run_dir, save_strategy="steps", save_steps=1, max_steps=1, dynamic_sampling=True)
    make_trainer(**settings).train()
    checkpoint = f"{run_dir}/checkpoint-1"
    other = make_trainer(**{**settings, "max_steps": 2, "dynamic_sampling": False, "zero_std_kl": "keep_failed"})
    with pytest.raises(ValueError, match="dynamic_sampling: this run False, the checkpoint True") as refused:
        other.train(resume_from_checkpoint=checkpoint)
    assert "zero_std_kl: this run 'keep_failed', the checkpoint 'mask'" in str(refused.value)
    same = make_trainer(**{**settings, "max_steps": 2})
    same.train(resume_from_checkpoint=checkpoint)
    assert same.state.global_step == 2


def built(**settings):
    dataset = Dataset.from_dict({"prompt": ["1+1=", "2+3=", "4+4=", "3+5="], "level": [1, 1, 2, 2]})
    return build_state(ZeroStdArguments(**settings), SimpleNamespace(seed=0), "grpo", dataset, 2, 1, 0)


def test_build_state_makes_an_object_exactly_for_each_feature_on():
    assert built().refiller is None and built().skipper is None
    dynamic = built(dynamic_sampling=True)
    assert dynamic.refiller is not None and dynamic.skipper is None
    skipping = built(skip_zero_std_prompts=True, skip_predictor="success_rate", skip_prior_key="level")
    assert type(skipping.skipper.predictor).__name__ == "SuccessRatePredictor"
    with pytest.raises(ValueError, match="skip_prior_key='band' is not a column"):
        built(skip_zero_std_prompts=True, skip_prior_key="band")
    with pytest.raises(ValueError, match="zero_std_kl='keep_failed' applies to GRPO"):
        build_state(ZeroStdArguments(zero_std_kl="keep_failed"), SimpleNamespace(seed=0), "rloo", [], 2, 1, 0)


def test_state_saves_and_loads_every_part(tmp_path):
    state = built(skip_zero_std_prompts=True, skip_predictor="streak", dynamic_sampling=True)
    state.reward_range = (0.0, 1.0)
    state.stall_monitor.observe_step(0)
    state.refiller.informative_history = (1.5, 3.0)
    state.refiller.stream.draw(3, state.skipper.draw_prob)
    state.skipper.record([0, 1], torch.tensor([1, 0]))
    state.save(str(tmp_path))
    assert {STATE_FILE, SKIP_STATE_FILE} <= {path.name for path in tmp_path.iterdir()}
    restored = built(skip_zero_std_prompts=True, skip_predictor="streak", dynamic_sampling=True)
    restored.load(str(tmp_path))
    assert restored.state_dict() == state.state_dict()
    assert torch.equal(restored.skipper.history.streak, state.skipper.history.streak)
    assert restored.skipper.predictor.explore == state.skipper.predictor.explore
    with pytest.raises(ValueError, match="dynamic_sampling: this run False, the checkpoint True"):
        built(skip_zero_std_prompts=True, skip_predictor="streak").load(str(tmp_path))


def test_decide_plan_decides_each_batch_against_the_reward_range_of_the_run_so_far():
    """keep_failed keeps the KL term of the groups tied at the lowest task reward seen in training, so the range must
    carry over batches: a batch tied at 1 after one that saw 0 is all-correct, and a group tied at 0 failed."""
    state = built(zero_std_kl="keep_failed")
    no_flags = torch.zeros(4, dtype=torch.bool)

    def plan(rewards):
        rewards = torch.tensor(rewards)
        return state.decide_plan(rewards, rewards.view(-1, 1), no_flags, no_flags, num_generations=2)

    first = plan([0.0, 1.0, 1.0, 1.0])
    assert state.reward_range == (0.0, 1.0) and first.high_tied_groups.tolist() == [False, True]
    second = plan([1.0, 1.0, 1.0, 1.0])
    assert state.reward_range == (0.0, 1.0)
    assert second.low_tied_groups.tolist() == [False, False] and second.high_tied_groups.tolist() == [True, True]
    third = plan([0.0, 0.0, 1.0, 1.0])
    assert third.low_tied_groups.tolist() == [True, False]
    assert third.role.tolist() == [RowRole.KL_ONLY] * 2 + [RowRole.OUT] * 2
