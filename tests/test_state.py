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

from trl_zerostd import config
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


def resume_warnings(trainer, checkpoint, caplog) -> list[str]:
    with caplog.at_level("WARNING", logger="trl_zerostd"):
        trainer.train(resume_from_checkpoint=checkpoint)
    return [r.getMessage() for r in caplog.records if r.name == "trl_zerostd"]


def test_a_resume_refuses_a_changed_setting_of_an_object_with_state_naming_it(make_trainer, tmp_path, caplog):
    """The prompt stream of dynamic sampling carries state across steps: a resume without it is refused, naming it
    (and only it: zero_std_kl, changed too, decides only how each batch trains); the same settings resume silently."""
    run_dir = str(tmp_path / "run")
    settings = dict(output_dir=run_dir, save_strategy="steps", save_steps=1, max_steps=1, dynamic_sampling=True)
    make_trainer(**settings).train()
    checkpoint = f"{run_dir}/checkpoint-1"
    other = make_trainer(**{**settings, "max_steps": 2, "dynamic_sampling": False, "zero_std_kl": "keep_failed"})
    with pytest.raises(ValueError, match="dynamic_sampling: this run False, the checkpoint True") as refused:
        other.train(resume_from_checkpoint=checkpoint)
    assert "zero_std_kl: this run" not in str(refused.value)
    same = make_trainer(**{**settings, "max_steps": 2})
    assert resume_warnings(same, checkpoint, caplog) == []
    assert same.state.global_step == 2


def test_a_resume_may_change_how_each_batch_trains_and_says_so_once(make_trainer, tmp_path, caplog):
    """The stall advice's remedy (zero_std_kl='keep_failed') and the other settings that hold no state may change on
    resume, with dynamic sampling and prompt skipping on; one warning names each change."""
    run_dir = str(tmp_path / "run")
    settings = dict(output_dir=run_dir, save_strategy="steps", save_steps=1, max_steps=1, dynamic_sampling=True,
                    skip_zero_std_prompts=True)  # fmt: skip
    make_trainer(**settings).train()
    changed = dict(zero_std_kl="keep_failed", zero_std_normalization="exclude", skip_masked_rows=False)
    resumed = make_trainer(**{**settings, **changed, "max_steps": 2})
    warnings = resume_warnings(resumed, f"{run_dir}/checkpoint-1", caplog)
    assert resumed.state.global_step == 2
    assert len(warnings) == 1
    for name, value in changed.items():
        assert f"{name}: the checkpoint" in warnings[0] and f"this run {value!r}" in warnings[0]


def test_a_trl_checkpoint_resumes_with_skipping_and_dynamic_sampling_starting_fresh(make_trainer, tmp_path, caplog):
    """TRL's own checkpoint has no state of ours: the stream and the skip histories start fresh, said once."""
    run_dir = str(tmp_path / "run")
    make_trainer(ours=False, output_dir=run_dir, save_strategy="steps", save_steps=1, max_steps=1).train()
    resumed = make_trainer(max_steps=2, dynamic_sampling=True, skip_zero_std_prompts=True)
    warnings = resume_warnings(resumed, f"{run_dir}/checkpoint-1", caplog)
    assert resumed.state.global_step == 2
    assert len(warnings) == 1 and "dynamic_sampling and skip_zero_std_prompts start fresh" in warnings[0]


def test_every_setting_either_may_change_on_resume_or_is_refused_by_name(tmp_path):
    """Each field is classified: a per-batch one loads with a notice naming it, any other is refused naming it."""
    base = dict(dynamic_sampling=True, skip_zero_std_prompts=True, skip_predictor="streak")
    other_values = {
        "mask_zero_std_groups": False, "zero_std_atol": 0.5, "zero_std_normalization": "exclude",
        "exclude_masked_from_baseline": False, "skip_masked_rows": False, "zero_std_kl": "keep_failed",
        "dynamic_sampling": False, "dynamic_sampling_max_rounds": 3, "dynamic_sampling_on_cap": "error",
        "dynamic_sampling_screen": 2, "skip_zero_std_prompts": False, "skip_refill": False,
        "skip_predictor": "success_rate", "skip_target_zero_std_frac": 0.5, "skip_min_draw_prob": 0.1,
        "skip_history_key": "level", "skip_prior_key": "level",
    }  # fmt: skip
    assert set(other_values) == set(config.ZERO_STD_FIELDS)
    built(**base).save(str(tmp_path))
    for name, value in other_values.items():
        state = built(**{**base, name: value})
        if name in config.PER_BATCH_FIELDS:
            (notice,) = state.load(str(tmp_path))
            assert notice.count(": the checkpoint") == 1 and f"{name}: the checkpoint" in notice
        else:
            with pytest.raises(ValueError, match=f"settings of objects that carry state.*{name}: this run"):
                state.load(str(tmp_path))
    assert set(config.PER_BATCH_FIELDS) == {
        "mask_zero_std_groups", "zero_std_atol", "zero_std_normalization", "exclude_masked_from_baseline",
        "skip_masked_rows", "zero_std_kl",
    }  # fmt: skip


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
