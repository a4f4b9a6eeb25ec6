"""What a resume may change: a setting of an object that carries state is refused by name, one that decides only how
each batch trains is allowed with a notice, and TRL's own checkpoint resumes with our features starting fresh. (The
state itself: ``tests/trainer/test_state.py``; a killed run resumed: ``tests/launch/test_killed_and_resumed.py``.)"""

import json
from pathlib import Path

import pytest

from trl_zerostd.core.settings import REMOVED_FIELDS
from trl_zerostd.trainer.state import STATE_FILE


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
    changed = dict(zero_std_kl="keep_failed", zero_std_normalization="exclude", mask_zero_std_groups=False)
    resumed = make_trainer(**{**settings, **changed, "max_steps": 2})
    warnings = resume_warnings(resumed, f"{run_dir}/checkpoint-1", caplog)
    assert resumed.state.global_step == 2
    assert len(warnings) == 1
    for name, value in changed.items():
        assert f"{name}: the checkpoint" in warnings[0] and f"this run {value!r}" in warnings[0]


@pytest.mark.every_trl
def test_a_trl_checkpoint_resumes_with_skipping_and_dynamic_sampling_starting_fresh(make_trainer, tmp_path, caplog):
    """TRL's own checkpoint has no state of ours: the stream and the skip histories start fresh, said once."""
    run_dir = str(tmp_path / "run")
    make_trainer(ours=False, output_dir=run_dir, save_strategy="steps", save_steps=1, max_steps=1).train()
    resumed = make_trainer(max_steps=2, dynamic_sampling=True, skip_zero_std_prompts=True)
    warnings = resume_warnings(resumed, f"{run_dir}/checkpoint-1", caplog)
    assert resumed.state.global_step == 2
    assert len(warnings) == 1 and "dynamic_sampling and skip_zero_std_prompts start fresh" in warnings[0]


def with_saved_settings(checkpoint: str, **fields) -> None:
    """Write ``fields`` into the settings of the checkpoint's ``trl_zerostd.json``, as trl-zerostd 0.1 wrote them."""
    path = f"{checkpoint}/{STATE_FILE}"
    with open(path) as f:
        state = json.load(f)
    state["settings"].update(fields)
    with open(path, "w") as f:
        json.dump(state, f)


def test_a_checkpoint_of_a_removed_feature_is_refused_naming_it(make_trainer, tmp_path, caplog):
    """A 0.1 checkpoint wrote every field: one holding each removed field at the value now in force resumes
    silently; one that ran a feature now gone (per_prompt_budgets=True) is refused, naming that field only."""
    run_dir = str(tmp_path / "run")
    settings = dict(output_dir=run_dir, save_strategy="steps", save_steps=1, max_steps=1, skip_zero_std_prompts=True)
    make_trainer(**settings).train()
    checkpoint = f"{run_dir}/checkpoint-1"
    in_force = {name: value for name, (value, _) in REMOVED_FIELDS.items()}
    with_saved_settings(checkpoint, **{**in_force, "per_prompt_budgets": True})
    refused = make_trainer(**{**settings, "max_steps": 2})
    with pytest.raises(ValueError, match=r"trl_zerostd.json sets \['per_prompt_budgets'\], removed in") as error:
        refused.train(resume_from_checkpoint=checkpoint)
    assert "skip_refill" not in str(error.value)
    with_saved_settings(checkpoint, **in_force)
    resumed = make_trainer(**{**settings, "max_steps": 2})
    assert resume_warnings(resumed, checkpoint, caplog) == []
    assert resumed.state.global_step == 2


def prompts_per_step(trainer) -> list[list[str]]:
    """The prompts each optimizer step of ``trainer`` generates for (one generation a step here), as TRL hands them
    over: recorded around the trainer's own method, which runs unchanged."""
    steps: list[list[str]] = []
    generate_and_score = trainer._generate_and_score_completions

    def recorded(inputs):
        steps.append([row["prompt"] for row in inputs])
        return generate_and_score(inputs)

    trainer._generate_and_score_completions = recorded
    return steps


@pytest.mark.parametrize(
    ("kind", "ours", "workers"),
    [
        ("grpo", True, 0),
        ("rloo", True, 0),
        ("grpo", True, 2),
        pytest.param("grpo", False, 0, marks=pytest.mark.every_trl),
    ],
)
def test_a_run_resumed_inside_a_later_pass_draws_the_prompts_an_unbroken_run_draws(kind, ours, workers, make_trainer):
    """8 prompts, 2 a step: a pass is 4 steps. Resumed from step 6's checkpoint (inside the second pass), our trainer
    trains step 7 on the prompts of the unbroken run's step 7, with the dataloader's worker processes too (they read
    a pass to its end ahead of training). TRL's own trainer (the control) draws the first pass's order again there
    (its sampler's generator starts afresh), so it trains other prompts: what the package mends."""
    config = dict(max_steps=7, save_strategy="steps", save_steps=6, dataloader_num_workers=workers)
    unbroken = make_trainer(kind, ours=ours, **config)
    unbroken_steps = prompts_per_step(unbroken)
    unbroken.train()
    resumed = make_trainer(kind, ours=ours, **{**config, "output_dir": str(Path(unbroken.args.output_dir) / "again")})
    resumed_steps = prompts_per_step(resumed)
    resumed.train(resume_from_checkpoint=str(Path(unbroken.args.output_dir) / "checkpoint-6"))

    assert len(unbroken_steps) == 7 and len(resumed_steps) == 1
    assert sorted(sum(unbroken_steps[4:7], [])) != sorted(sum(unbroken_steps[:3], []))  # the passes' orders differ
    assert (resumed_steps[0] == unbroken_steps[6]) == ours


def test_a_checkpoint_saved_inside_a_generation_batch_says_so_on_resume(make_trainer, tmp_path, caplog):
    """Under num_iterations 2 a generation batch trains 2 steps and TRL keeps its completions in memory only: a
    checkpoint after step 1 resumes with a notice naming it, one after step 2 without."""
    trainer = make_trainer("grpo", num_iterations=2, max_steps=2, save_strategy="steps", save_steps=1)
    trainer.train()
    checkpoints = Path(trainer.args.output_dir)
    inside = resume_warnings(make_trainer("grpo", num_iterations=2, max_steps=2), checkpoints / "checkpoint-1", caplog)
    assert len(inside) == 1 and "saved 1 micro-batch(es) into a generation batch" in inside[0]
    caplog.clear()
    at_end = resume_warnings(make_trainer("grpo", num_iterations=2, max_steps=3), checkpoints / "checkpoint-2", caplog)
    assert at_end == []
