"""Config fields: defaults, validation that names the field, CLI parsing, and the supported TRL range."""

import re
from pathlib import Path

import pytest
from trl import GRPOConfig, TrlParser

from trl_zerostd import ZeroStdGRPOConfig, ZeroStdRLOOConfig
from trl_zerostd.core.settings import REMOVED_FIELDS, allowed_values, masking_settings, refuse_removed_flags
from trl_zerostd.trainer.compat import SUPPORTED_TRL_TEXT, check_trl_version

CPU = {
    "report_to": "none",
    "use_cpu": True,
    "bf16": False,
}  # fp32 on CPU, as every test trainer (one Accelerator state)


@pytest.mark.parametrize("config_cls", [ZeroStdGRPOConfig, ZeroStdRLOOConfig])
def test_defaults(config_cls, tmp_path):
    config = config_cls(output_dir=str(tmp_path), **CPU)
    assert (config.mask_zero_std_groups, config.zero_std_atol, config.zero_std_normalization) == (True, 1e-6, "keep")
    assert (config.zero_std_kl, config.dynamic_sampling, config.skip_zero_std_prompts) == ("mask", False, False)


@pytest.mark.parametrize(
    ("field", "value"),
    [("zero_std_normalization", "drop"), ("zero_std_kl", "sometimes"), ("zero_std_atol", -1.0),
     ("zero_std_atol", float("nan")), ("dynamic_sampling_max_rounds", 0), ("zero_std_reward_funcs", "accuracy"),
     ("tied_group_entropy_scale", -0.1), ("tied_group_entropy_scale", float("nan")),
     ("tied_group_entropy_scale", float("inf"))],
)  # fmt: skip
def test_bad_values_name_the_field(field, value, tmp_path):
    with pytest.raises(ValueError, match=field):
        ZeroStdGRPOConfig(output_dir=str(tmp_path), **CPU, **{field: value})


def test_allowed_values_are_the_literal_types():
    assert allowed_values() == {
        "zero_std_normalization": ("keep", "exclude"),
        "zero_std_kl": ("mask", "keep_failed", "keep"),
    }


@pytest.mark.parametrize(("field", "value", "feature"), [
    ("dynamic_sampling_max_rounds", 3, "dynamic_sampling"), ("skip_min_draw_prob", 0.2, "skip_zero_std_prompts"),
    ("skip_history_key", "level", "skip_zero_std_prompts"), ("skip_prior_key", "level", "skip_zero_std_prompts"),
])  # fmt: skip
def test_a_field_that_needs_a_feature_that_is_off_is_refused(field, value, feature, tmp_path):
    with pytest.raises(ValueError, match=f"{field}={value!r} .*, which is off: set {feature}=True"):
        ZeroStdGRPOConfig(output_dir=str(tmp_path), **CPU, **{field: value})
    ZeroStdGRPOConfig(output_dir=str(tmp_path), **CPU, **{field: value, feature: True})  # with it on: accepted


def test_plain_trl_config_gets_defaults_and_is_validated(tmp_path):
    settings = masking_settings(GRPOConfig(output_dir=str(tmp_path), **CPU))
    assert settings.zero_std_normalization == "keep" and settings.mask_zero_std_groups
    config = GRPOConfig(output_dir=str(tmp_path), **CPU)
    config.zero_std_atol = -0.5
    with pytest.raises(ValueError, match="zero_std_atol"):
        masking_settings(config)


@pytest.mark.every_trl
def test_every_field_is_a_cli_flag(tmp_path):
    (config,) = TrlParser((ZeroStdGRPOConfig,)).parse_args_into_dataclasses(
        [
            "--output_dir", str(tmp_path), "--report_to", "none", "--use_cpu", "true",
            "--mask_zero_std_groups", "false", "--zero_std_atol", "0.5",
            "--zero_std_normalization", "exclude", "--zero_std_kl", "keep_failed", "--beta", "0.1",
            "--dynamic_sampling", "true", "--dynamic_sampling_max_rounds", "3", "--skip_zero_std_prompts", "true",
            "--skip_min_draw_prob", "0.2", "--skip_prior_key", "level", "--zero_std_reward_funcs", "a", "b",
        ]
    )  # fmt: skip
    assert not config.mask_zero_std_groups and config.zero_std_atol == 0.5
    assert (config.zero_std_normalization, config.zero_std_kl) == ("exclude", "keep_failed")
    assert config.dynamic_sampling and config.dynamic_sampling_max_rounds == 3 and config.skip_zero_std_prompts
    assert (config.skip_min_draw_prob, config.skip_prior_key, config.zero_std_reward_funcs) == (
        0.2,
        "level",
        ["a", "b"],
    )
    with pytest.raises(SystemExit):
        TrlParser((ZeroStdGRPOConfig,)).parse_args_into_dataclasses(
            ["--output_dir", str(tmp_path), "--use_cpu", "true", "--zero_std_normalization", "drop"]
        )


def test_num_generations_below_two_is_refused(tmp_path):
    with pytest.raises(ValueError, match="num_generations"):
        ZeroStdGRPOConfig(output_dir=str(tmp_path), **CPU, num_generations=1)


@pytest.mark.every_trl
@pytest.mark.parametrize("version", ["1.14.0", "1.17.0", "0.29.1"])
def test_unsupported_trl_is_refused_naming_the_installed_release_and_the_range(version):
    with pytest.raises(ImportError, match=rf"trl>=1\.14\.1,<1\.17\.0 .* but trl=={re.escape(version)} is installed"):
        check_trl_version(version)


@pytest.mark.every_trl
@pytest.mark.parametrize("version", ["1.14.1", "1.15.0", "1.16.0", "1.16.3"])
def test_every_release_of_the_range_is_accepted(version):
    check_trl_version(version)


def test_the_range_is_the_one_pyproject_states():
    """pip and the import check refuse the same releases."""
    pyproject = (Path(__file__).resolve().parents[2] / "pyproject.toml").read_text()
    assert f'"{SUPPORTED_TRL_TEXT}",' in pyproject


@pytest.mark.parametrize("field", sorted(REMOVED_FIELDS))
def test_a_removed_field_is_refused_by_name_with_what_to_use_instead(field, tmp_path):
    """In a config's constructor, on the command line (both spellings) and in a YAML config file."""
    value, advice = REMOVED_FIELDS[field]
    message = rf"\['{field}'\], removed in trl-zerostd 0.2 .*{field}: {advice[:20]}"
    with pytest.raises(ValueError, match=message):
        ZeroStdGRPOConfig(output_dir=str(tmp_path), **CPU, **{field: value})
    with pytest.raises(ValueError, match=message):
        ZeroStdRLOOConfig(output_dir=str(tmp_path), **CPU, **{field: value})
    for argv in (["--max_steps", "2", f"--{field}", str(value)], [f"--{field}={value}"]):
        with pytest.raises(ValueError, match=rf"The command line sets \['{field}'\]"):
            refuse_removed_flags(argv)
    config_file = tmp_path / "config.yaml"
    config_file.write_text(f"learning_rate: 1.0e-5\n{field}: {value}\n")
    with pytest.raises(ValueError, match=rf"The config file {config_file} sets \['{field}'\]"):
        refuse_removed_flags(["--config", str(config_file)])


def test_flags_and_config_files_of_kept_fields_pass():
    refuse_removed_flags(["--skip_zero_std_prompts", "true", "--skip_min_draw_prob=0.1", "--max_steps", "3"])


def test_tied_group_entropy_scale_is_off_at_zero_and_tied_groups_need_masking(tmp_path):
    with pytest.raises(ValueError, match=r"scale must be finite and >= 0 \(0 leaves tied groups masked\)"):
        ZeroStdGRPOConfig(output_dir=str(tmp_path), **CPU, tied_group_entropy_scale=-0.2)
    with pytest.raises(ValueError, match="set mask_zero_std_groups=True"):
        ZeroStdGRPOConfig(output_dir=str(tmp_path), **CPU, tied_group_entropy_scale=0.2, mask_zero_std_groups=False)
    ZeroStdGRPOConfig(output_dir=str(tmp_path), **CPU, tied_group_entropy_scale=0.0, mask_zero_std_groups=False)
