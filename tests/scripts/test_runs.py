"""The studies' process pool (``studies.runs.run_all``): results in the order of the jobs, and a run killed from
outside stops the study with an error naming what to do, instead of leaving it waiting for that run; the draws a
trainer's generation is counted by (``timing_generation``), refill rounds included."""

import json
import os
import signal
import threading
from types import SimpleNamespace

import pytest
from transformers.trainer_callback import CallbackHandler

from studies.runs import (
    COUNTERS,
    STUDY_STATE,
    check_same_job,
    last_checkpoint,
    load_study_state,
    run_all,
    run_one,
    timing_generation,
)
from tests.support import trainers
from trl_zerostd import ZeroStdGRPOConfig, ZeroStdGRPOTrainer


def echo_seed(job: tuple) -> dict:
    """A worker that reports which job it ran and in which process."""
    return {"seed": job[0], "pid": os.getpid()}


def killed_on_seed_1(job: tuple) -> dict:
    """A worker that the kernel kills (as its out-of-memory killer does) on seed 1."""
    if job[0] == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    return echo_seed(job)


def test_results_come_in_the_order_of_the_jobs_each_from_a_fresh_process(tmp_path):
    jobs = [(seed, str(tmp_path / "runs" / f"seed{seed}.json")) for seed in range(3)]
    results = run_all(jobs, processes=2, worker=echo_seed)
    assert [result["seed"] for result in results] == [0, 1, 2]
    assert len({result["pid"] for result in results}) == 3
    assert (tmp_path / "runs").is_dir()


def test_a_run_killed_from_outside_stops_the_study_with_a_clear_error(tmp_path):
    """In a thread, so that a pool that waits forever fails the test after a minute instead of hanging the suite."""
    jobs = [(seed, str(tmp_path / f"seed{seed}.json")) for seed in range(3)]
    raised = []

    def study():
        try:
            run_all(jobs, processes=2, worker=killed_on_seed_1)
        except RuntimeError as error:
            raised.append(str(error))

    thread = threading.Thread(target=study, daemon=True)
    thread.start()
    thread.join(timeout=60)
    assert not thread.is_alive(), "the study still waits for the killed run"
    assert len(raised) == 1 and "lower --jobs and run the same command again" in raised[0]


def test_every_completion_a_refill_generates_is_a_draw(make_trainer, monkeypatch):
    """The tiny model's own generation under dynamic sampling (every group tied all wrong: the rounds run to the
    cap): each prompt's draws at the step are the completions every round generated for it, as the refill counts
    them (``dynamic_sampling/generated_groups``), not the last round's alone."""
    timed = (timing_generation(ZeroStdGRPOTrainer), ZeroStdGRPOConfig)
    monkeypatch.setitem(trainers.OUR_CLASSES, "grpo", timed)
    trainer = make_trainer("grpo", dynamic_sampling=True, dynamic_sampling_max_rounds=3, max_completion_length=4)
    trainer.train()
    (logged,) = [entry for entry in trainer.state.log_history if "dynamic_sampling/generated_groups" in entry]
    generated_groups = logged["dynamic_sampling/generated_groups"]
    assert logged["dynamic_sampling/rounds"] > 1 and generated_groups > 2
    draws = trainer.prompt_tally.draws[0]
    assert sum(draws.values()) == generated_groups * trainer.num_generations
    assert set(draws.values()) <= {trainer.num_generations, 2 * trainer.num_generations}
    rewards = trainer.prompt_tally.rewards[0]  # every round's scored rows, under their prompts
    assert {text: len(values) for text, values in rewards.items()} == dict(draws)


class Killed(Exception):
    """The process dying right after a checkpoint is written."""


@pytest.mark.parametrize("killed_at", [4, 6])  # a pass is 4 steps: killed at a pass's end, and inside the next
@pytest.mark.parametrize(
    ("arm", "arm_flags"),
    [
        pytest.param("trl", [], marks=pytest.mark.every_trl),
        ("keep_failed", ["--zero_std_kl", "keep_failed"]),
        ("skip-rate-kf", ["--skip_zero_std_prompts", "true", "--zero_std_kl", "keep_failed"]),
    ],
)
def test_a_run_killed_after_a_checkpoint_goes_on_from_it_to_the_record_of_a_run_never_killed(
    arm, arm_flags, killed_at, tmp_path, monkeypatch
):
    """``run_one`` over 8 prompts, 2 a step, with checkpoints every 2 steps and the train prompts probed (TRL's
    trainer, the package's with ``keep_failed`` and with prompt skipping): killed once a checkpoint is on disk, then
    run again, it resumes there and writes the unbroken run's record (every logged value, token count, draw, skip,
    reward and probe), but for wall times and ``resumed_at``; the checkpoints go once the record is written. Resumed
    in the second pass over the prompts, it draws that pass's order, not the first pass's again."""
    flags = [
        "--warm_start_steps", "20", "--num_prompts", "8", "--per_device_train_batch_size", "16", *arm_flags,
        "--eval_by_sampling", "true", "--eval_strategy", "steps", "--eval_steps", "2", "--num_eval_prompts", "8",
        "--eval_train_groups", "true", "--save_strategy", "steps", "--save_steps", "2", "--save_total_limit", "2",
    ]  # fmt: skip
    never_saved = flags[: flags.index("--save_strategy")]  # the unbroken run saves nothing: saving changes nothing
    whole = run_one((arm, never_saved, 1e-3, 0, 7, str(tmp_path / "whole.json")))

    save = CallbackHandler.on_save

    def killed_after_saving(self, args, state, control):
        control = save(self, args, state, control)
        if state.global_step == killed_at:
            raise Killed
        return control

    monkeypatch.setattr(CallbackHandler, "on_save", killed_after_saving)
    job = (arm, flags, 1e-3, 0, 7, str(tmp_path / "resumed.json"))
    with pytest.raises(Killed):
        run_one(job)
    assert str(tmp_path / "resumed" / f"checkpoint-{killed_at}") == last_checkpoint(tmp_path / "resumed")
    monkeypatch.undo()
    resumed = run_one(job)

    assert resumed.pop("resumed_at") == [killed_at] and whole.pop("resumed_at") == []
    for record in (whole, resumed):
        for wall_time in ("generation_s", "step_time", "host"):
            record.pop(wall_time)
    assert len(whole["reward"]) == 7 and len(whole["train_groups"]) == 3
    assert (sum(map(len, whole["prompt_skips"])) > 0) == arm.startswith("skip")
    assert json.dumps(resumed) == json.dumps(whole)
    assert not list((tmp_path / "resumed").glob("checkpoint-*"))


def test_the_checkpoint_resumed_is_the_newest_a_save_finished_and_of_the_same_job(tmp_path):
    """A save killed before the study's state was written leaves a checkpoint that is passed over; checkpoints of
    another job (a flag changed) are refused, naming the folder to delete."""
    for step, finished in ((2, True), (4, False)):
        (tmp_path / f"checkpoint-{step}").mkdir()
        if finished:
            (tmp_path / f"checkpoint-{step}" / STUDY_STATE).write_text("{}")
    assert last_checkpoint(tmp_path) == str(tmp_path / "checkpoint-2")
    assert last_checkpoint(tmp_path / "none") is None
    job = ["trl", ["--beta", "0.04"], 1e-3, 0, 40]
    with pytest.raises(ValueError, match="are of another job"):  # checkpoints, and no job noted
        check_same_job(tmp_path, job)
    (tmp_path / "study_job.json").write_text(json.dumps(job))
    check_same_job(tmp_path, job)
    with pytest.raises(ValueError, match=f"delete {tmp_path} to run it from the start"):
        check_same_job(tmp_path, [*job[:4], 20])


def test_a_checkpoint_inside_a_generation_batch_is_refused_but_at_the_last_step(tmp_path):
    """A generation batch in progress (TRL's count of micro-batches into it, saved with the checkpoint): its
    completions are not checkpointed, so a resume there is refused, but at the run's last step (nothing left to
    train); a checkpoint that ends a generation batch resumes."""
    args = SimpleNamespace(max_steps=7)
    trainer = SimpleNamespace(args=args, callback_handler=SimpleNamespace(callbacks=[]), resumed_at=[],
                              **{name: {} for name in COUNTERS})  # fmt: skip
    for step, phase in ((4, 0), (5, 1), (7, 1)):
        checkpoint = tmp_path / f"checkpoint-{step}"
        checkpoint.mkdir()
        state = {name: {} for name in COUNTERS} | {"resumed_at": [], "generation_phase": phase}
        (checkpoint / STUDY_STATE).write_text(json.dumps(state))
        (checkpoint / "trainer_state.json").write_text(json.dumps({"global_step": step, "epoch": step / 4}))
    load_study_state(trainer, tmp_path / "checkpoint-4")
    assert trainer.resumed_at == [4] and trainer.resumed_pass == 1
    with pytest.raises(ValueError, match=r"falls inside a generation batch \(1 micro-batches into it\)"):
        load_study_state(trainer, tmp_path / "checkpoint-5")
    load_study_state(trainer, tmp_path / "checkpoint-7")
    assert trainer.resumed_at == [7] and trainer.resumed_pass == 1
