import pytest

from studies.step_cost import StepCostArguments, main


@pytest.mark.parametrize(("arms", "steps"), [(["trl", "trl-g4"], [3]), (["trl"], [0]), (["trl", "trl"], [3, 3])])
def test_bad_arms_or_step_counts_fail_before_training(arms, steps):
    with pytest.raises(ValueError, match="--steps|--arms"):
        main(StepCostArguments(arms=arms, steps=steps))


def test_cpu_threads_reach_every_run_and_the_table(monkeypatch, tmp_path):
    launched = []

    def fake_run_all(jobs, processes, worker):
        launched.extend(jobs)
        return [[2.0, 1.0, 3.0] for _ in jobs]

    monkeypatch.setattr("studies.step_cost.run_all", fake_run_all)
    table = tmp_path / "table.md"
    main(StepCostArguments(arms=["trl", "trl-g4"], steps=[3, 6], table=str(table), cpu_threads=2))
    assert [job[1][-2:] for job in launched] == [["--cpu_threads", "2"]] * 2  # after the study's "--cpu_threads 1"
    assert "--steps 3 6 --cpu_threads 2`" in table.read_text()
    assert "| trl | 3 | 2.0 | 2.0, 1.0, 3.0 |" in table.read_text()
