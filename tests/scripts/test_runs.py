"""The studies' process pool (``studies.runs.run_all``): results in the order of the jobs, and a run killed from
outside stops the study with an error naming what to do, instead of leaving it waiting for that run."""

import os
import signal
import threading

from studies.runs import run_all


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
