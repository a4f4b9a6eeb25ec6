"""The arms of the time-to-accuracy studies: only the package's current settings, and groups sized as the study's."""

from types import SimpleNamespace

import pytest

from studies.time_to_accuracy import TimeToAccuracyArguments
from studies.time_to_accuracy_arms import ARMS, arm_flags, groups_per_step
from studies.time_to_accuracy_real import ARMS_REAL, PLOT_ARMS, REPORT_ARMS_REAL
from trl_zerostd.core.settings import ZERO_STD_FIELDS


def test_every_default_arm_exists():
    study = TimeToAccuracyArguments()
    assert set(study.arms + study.plot_arms + ARMS_REAL + REPORT_ARMS_REAL + PLOT_ARMS) <= set(ARMS)


STUDY = SimpleNamespace(completions_per_step=128, num_generations=8, difficulty_column="band")
TRL_FLAGS = ("--per_device_train_batch_size", "--num_generations", "--num_iterations")


def test_no_arm_sets_a_field_the_package_lacks():
    ours = [arm for arm, spec in ARMS.items() if not spec.trl and not arm.startswith("cgrpo")]  # the peer: its own
    flags = {(arm, flag) for arm in ours for flag in arm_flags(arm, STUDY)[::2]}  # ours are --flag value pairs
    assert not {
        (arm, flag) for arm, flag in flags if flag.lstrip("-") not in ZERO_STD_FIELDS and flag not in TRL_FLAGS
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


def test_the_estimate_arms_skip_nothing():
    """A draw floor of 1 draws every prompt (draw probabilities are clamped to [floor, 1]): skipping's success-rate
    estimate is kept for the calibrated rule, nothing is skipped."""
    flags = arm_flags("estimate-prior-cal1", STUDY)
    assert flags[flags.index("--skip_min_draw_prob") + 1] == "1"
    assert flags[flags.index("--tied_group_signal") + 1] == "calibrated"
    assert groups_per_step("estimate-prior-cal1-g4", STUDY) == groups_per_step("trl", STUDY)
