"""Config fields: defaults, validation that names the field, CLI parsing, and the supported TRL range."""

import pytest
from trl import GRPOConfig, TrlParser

from trl_zerostd import ZeroStdGRPOConfig, ZeroStdRLOOConfig
from trl_zerostd._compat import check_trl_version
from trl_zerostd.config import allowed_values, masking_settings

CPU = {
    "report_to": "none",
    "use_cpu": True,
    "bf16": False,
}  # fp32 on CPU, as every test trainer (one Accelerator state)


@pytest.mark.parametrize("config_cls", [ZeroStdGRPOConfig, ZeroStdRLOOConfig])
def test_defaults(config_cls, tmp_path):
    config = config_cls(output_dir=str(tmp_path), **CPU)
    assert (config.mask_zero_std_groups, config.zero_std_atol, config.zero_std_normalization) == (True, 1e-6, "keep")
    assert config.exclude_masked_from_baseline and config.skip_masked_rows


@pytest.mark.parametrize(
    ("field", "value"),
    [("zero_std_normalization", "drop"), ("zero_std_kl", "sometimes"), ("dynamic_sampling_on_cap", "never"),
     ("skip_predictor", "oracle"), ("zero_std_atol", -1.0), ("zero_std_atol", float("nan"))],
)  # fmt: skip
def test_bad_values_name_the_field(field, value, tmp_path):
    with pytest.raises(ValueError, match=field):
        ZeroStdGRPOConfig(output_dir=str(tmp_path), **CPU, **{field: value})


def test_a_streak_target_under_another_predictor_is_refused(tmp_path):
    """skip_target_zero_std_frac steers only the streak: set under the default predictor it would do nothing."""
    config = {"output_dir": str(tmp_path), **CPU, "skip_zero_std_prompts": True, "skip_target_zero_std_frac": 0.1}
    with pytest.raises(ValueError, match="skip_target_zero_std_frac=0.1 is the target of skip_predictor='streak'"):
        ZeroStdGRPOConfig(**config)
    assert ZeroStdGRPOConfig(**config, skip_predictor="streak").skip_target_zero_std_frac == 0.1


def test_empty_slots_are_refused_under_dynamic_sampling(tmp_path):
    """Dynamic sampling refills every batch, so skip_refill=False could never leave a slot empty."""
    config = {"output_dir": str(tmp_path), **CPU, "skip_zero_std_prompts": True, "skip_refill": False}
    with pytest.raises(ValueError, match="skip_refill=False with dynamic_sampling=True"):
        ZeroStdGRPOConfig(**config, dynamic_sampling=True)
    assert not ZeroStdGRPOConfig(**config).skip_refill


def test_allowed_values_are_the_literal_types():
    assert allowed_values() == {
        "zero_std_normalization": ("keep", "exclude"),
        "zero_std_kl": ("mask", "keep_failed", "keep"),
        "dynamic_sampling_on_cap": ("mask", "error"),
        "budget_stop_rule": ("chance", "yield"),
        "skip_predictor": ("streak", "success_rate"),
    }


@pytest.mark.parametrize(("field", "value", "feature"), [
    ("dynamic_sampling_screen", 2, "dynamic_sampling"), ("skip_predictor", "streak", "skip_zero_std_prompts"),
    ("skip_history_key", "level", "skip_zero_std_prompts"), ("skip_prior_key", "level", "skip_zero_std_prompts"),
    ("skip_refill", False, "skip_zero_std_prompts"), ("budget_stop_rule", "yield", "per_prompt_budgets"),
])  # fmt: skip
def test_a_field_that_needs_a_feature_that_is_off_is_refused(field, value, feature, tmp_path):
    with pytest.raises(ValueError, match=f"{field}={value!r} .*, which (is|are) off: set {feature}=True"):
        ZeroStdGRPOConfig(output_dir=str(tmp_path), **CPU, **{field: value})
    ZeroStdGRPOConfig(output_dir=str(tmp_path), **CPU, **{field: value, feature: True})  # with it on: accepted


def test_plain_trl_config_gets_defaults_and_is_validated(tmp_path):
    settings = masking_settings(GRPOConfig(output_dir=str(tmp_path), **CPU))
    assert settings.zero_std_normalization == "keep" and settings.mask_zero_std_groups
    config = GRPOConfig(output_dir=str(tmp_path), **CPU)
    config.zero_std_atol = -0.5
    with pytest.raises(ValueError, match="zero_std_atol"):
        masking_settings(config)


def test_every_field_is_a_cli_flag(tmp_path):
    (config,) = TrlParser((ZeroStdGRPOConfig,)).parse_args_into_dataclasses(
        [
            "--output_dir", str(tmp_path), "--report_to", "none", "--use_cpu", "true",
            "--mask_zero_std_groups", "false", "--zero_std_atol", "0.5",
            "--zero_std_normalization", "exclude", "--exclude_masked_from_baseline", "false",
            "--skip_masked_rows", "false",
        ]
    )  # fmt: skip
    assert not config.mask_zero_std_groups and config.zero_std_atol == 0.5
    assert config.zero_std_normalization == "exclude"
    assert not config.exclude_masked_from_baseline and not config.skip_masked_rows
    with pytest.raises(SystemExit):
        TrlParser((ZeroStdGRPOConfig,)).parse_args_into_dataclasses(
            ["--output_dir", str(tmp_path), "--use_cpu", "true", "--zero_std_normalization", "drop"]
        )


def test_num_generations_below_two_is_refused(tmp_path):
    with pytest.raises(ValueError, match="num_generations"):
        ZeroStdGRPOConfig(output_dir=str(tmp_path), **CPU, num_generations=1)


@pytest.mark.parametrize("version", ["1.15.0", "1.17.0", "0.29.1"])
def test_unsupported_trl_is_refused_with_the_range(version):
    with pytest.raises(ImportError, match=r"trl>=1\.16\.0,<1\.17\.0"):
        check_trl_version(version)


def test_supported_trl_is_accepted():
    check_trl_version("1.16.0")
    check_trl_version("1.16.3")
