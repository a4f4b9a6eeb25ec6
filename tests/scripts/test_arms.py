"""The arms of the time-to-accuracy studies: only the package's current settings (an arm whose setting left the package
is read, not run), and groups sized as the study's."""

from types import SimpleNamespace

import pytest

from studies.runs import train_job
from studies.time_to_accuracy import TimeToAccuracyArguments, jobs
from studies.time_to_accuracy_arms import ARMS, FADE_COMMIT, arm_flags, groups_per_step
from studies.time_to_accuracy_real import ARMS_REAL, PLOT_ARMS, REPORT_ARMS_REAL
from trl_zerostd.core.settings import ZERO_STD_FIELDS, allowed_values


def test_every_default_arm_exists():
    study = TimeToAccuracyArguments()
    assert set(study.arms + study.plot_arms + ARMS_REAL + REPORT_ARMS_REAL + PLOT_ARMS) <= set(ARMS)


STUDY = SimpleNamespace(completions_per_step=128, num_generations=8, difficulty_column="band")
TRL_FLAGS = ("--per_device_train_batch_size", "--num_generations", "--num_iterations", "--beta")


def fields_the_package_lacks(name: str) -> set[str]:
    """The flags of arm ``name`` (``--flag value`` pairs) that are neither the package's fields nor TRL's flags the
    studies set; none for base TRL's arms and the peer's (their own flags)."""
    if ARMS[name].trl or name.startswith("cgrpo"):
        return set()
    return {flag for flag in arm_flags(name, STUDY)[::2] if flag.lstrip("-") not in ZERO_STD_FIELDS} - set(TRL_FLAGS)


def test_no_arm_sets_a_field_the_package_lacks():
    """Unless retired: a retired arm sets the fields of the commit that trains it."""
    assert not {
        (name, flag) for name, arm in ARMS.items() if not arm.retired_at for flag in fields_the_package_lacks(name)
    }


def test_the_rate_arms_set_no_predictor():
    assert arm_flags("skip-rate", STUDY) == ["--skip_zero_std_prompts", "true"]
    assert arm_flags("skip-rate-prior-f02", STUDY) == [
        "--skip_zero_std_prompts",
        "true",
        "--skip_prior_key",
        "band",
        "--skip_min_draw_prob",
        "0.02",
    ]


@pytest.mark.parametrize(("arm", "batch"), [("trl-g4", "16"), ("trl-g2", "8"), ("keep_failed-g4", "16")])
def test_smaller_groups_keep_the_study_s_prompts_a_step(arm, batch):
    study = SimpleNamespace(completions_per_step=32, num_generations=8, difficulty_column="level")
    assert groups_per_step(arm, study) == groups_per_step("trl", study) == 4
    assert arm_flags(arm, study)[-2:] == ["--per_device_train_batch_size", batch]


def test_a_retired_arm_is_read_not_run(tmp_path):
    """An arm whose setting left the package is refused where a record is missing, naming the commit that trains it,
    before any run starts and where a run is trained; with its records there, its jobs are the records to read."""
    study = TimeToAccuracyArguments(arms=["trl", "estimate-prior-cal1"], seeds=[0, 1], runs_dir=str(tmp_path))
    (tmp_path / "estimate-prior-cal1-seed0.json").write_text("{}")
    refused = (
        r"'estimate-prior-cal1' trains a setting or a predictor this package no longer has: train it at commit 92928d9"
    )
    with pytest.raises(ValueError, match=refused):
        jobs(study)
    with pytest.raises(ValueError, match=refused):
        train_job(("estimate-prior-cal1", [], 1e-3, 0, 1, str(tmp_path / "run.json")))
    (tmp_path / "estimate-prior-cal1-seed1.json").write_text("{}")
    expected = [f"{arm}-seed{seed}.json" for seed in (0, 1) for arm in ("trl", "estimate-prior-cal1")]
    assert [job[-1] for job in jobs(study)] == [str(tmp_path / name) for name in expected]


def test_every_arm_s_values_are_the_package_s_unless_retired():
    """An arm that sets a value the package refuses, or a field it no longer has, is marked retired (its setting left
    the package); the arms retired with the predictor whose evidence faded set only the package's values."""
    allowed = allowed_values()
    assert [name for name, arm in ARMS.items() if arm.retired_at == FADE_COMMIT] == [
        "skip-fade-prior-kf",
        "skip-fade-kf",
    ]
    for name, arm in ARMS.items():
        flags = arm_flags(name, STUDY)
        values = {flag.lstrip("-"): value for flag, value in zip(flags[::2], flags[1::2], strict=False)}
        lacked = {flag.lstrip("-") for flag in fields_the_package_lacks(name)}
        refused = lacked | {field for field, value in values.items() if value not in allowed.get(field, (value,))}
        assert bool(refused) == bool(arm.retired_at and arm.retired_at != FADE_COMMIT), (name, refused)


def test_a_run_of_one_arm_is_reported_beside_base_trl_s_records_of_its_seeds(tmp_path, monkeypatch, capsys):
    """``--arms zvp-a02 --seeds 4`` runs that arm alone and reports it against TRL's cached run of seed 4 (every figure
    is against it), as ``--report_only`` does; with no TRL record of the seeds it says so instead of failing inside the
    tables."""
    import shutil

    import studies.time_to_accuracy as study
    from studies.time_to_accuracy_real import RealTimeToAccuracyArguments

    for name in ("trl-seed4.json", "zvp-a02-seed4.json"):
        shutil.copy(f"docs/results/time_to_accuracy_real/runs/{name}", tmp_path / name)
    ran, reported = [], []
    monkeypatch.setattr(study, "run_all", lambda jobs, processes: ran.extend(job[0] for job in jobs))  # both cached
    monkeypatch.setattr(study, "report", lambda records, args, summarise, plot: reported.append(records))
    where = dict(seeds=[4], runs_dir=str(tmp_path))
    study.main(RealTimeToAccuracyArguments(arms=["zvp-a02"], **where))
    study.main(RealTimeToAccuracyArguments(report_only=True, report_arms=["zvp-a02"], **where))
    assert ran == ["zvp-a02"]
    assert [[(r["arm"], r["seed"]) for r in records] for records in reported] == [[("trl", 4), ("zvp-a02", 4)]] * 2
    (tmp_path / "trl-seed4.json").unlink()
    study.main(RealTimeToAccuracyArguments(arms=["zvp-a02"], **where))
    assert len(reported) == 2
    assert "has no base TRL record of seeds [4] (run them with --arms trl)" in capsys.readouterr().out
