"""The ``trl-zerostd`` command: TRL's own ``trl grpo`` / ``trl rloo`` scripts, with this package's config flags and
trainer (a checkpoint carries the package's state file only when our trainer ran)."""

import json
import subprocess
import sys

import pytest

from trl_zerostd import cli
from trl_zerostd.core.settings import REMOVED_FIELDS


def test_help_lists_trls_flags_and_ours(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["grpo", "--help"])
    assert exit_info.value.code == 0
    shown = capsys.readouterr().out
    flags = ("--reward_funcs", "--dataset_name", "--model_name_or_path", "--zero_std_kl", "--skip_zero_std_prompts")
    assert all(flag in shown for flag in flags)
    assert not [name for name in REMOVED_FIELDS if f"--{name}" in shown]  # only what is left


@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_help_without_a_command_exits_0_and_lists_the_commands(capsys, flag):
    with pytest.raises(SystemExit) as exit_info:
        cli.main([flag])
    assert exit_info.value.code == 0
    shown = capsys.readouterr().out
    assert "usage: trl-zerostd" in shown and all(f"  {command} " in shown for command in ("grpo", "rloo"))


def test_an_unknown_command_is_refused_with_the_usage():
    with pytest.raises(SystemExit, match="one of \\['grpo', 'rloo'\\]"):
        cli.main(["ppo"])


@pytest.mark.every_trl
@pytest.mark.parametrize("command", ["grpo", "rloo"])
def test_a_local_model_and_dataset_train_with_our_trainer(command, tiny_model_dir, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    rows = [{"prompt": f"{a}+{b}=", "answer": a + b} for a in range(4) for b in range(4)]
    (data / "train.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    cli.main([
        command, "--model_name_or_path", tiny_model_dir, "--dataset_name", str(data),
        "--reward_funcs", "demo.addition_task.correct_sum_reward", "--output_dir", str(tmp_path / "out"),
        "--max_steps", "1", "--num_generations", "4", "--per_device_train_batch_size", "8",
        "--max_completion_length", "4", "--use_cpu", "true", "--bf16", "false", "--report_to", "none",
        "--logging_steps", "1", "--save_strategy", "steps", "--save_steps", "1", "--beta", "0.04",
        "--zero_std_normalization", "exclude",
    ])  # fmt: skip
    checkpoint = tmp_path / "out" / "checkpoint-1"
    state = json.loads((checkpoint / "trl_zerostd.json").read_text())  # written by our trainer's checkpoint only
    assert state["settings"]["zero_std_normalization"] == "exclude"
    history = json.loads((checkpoint / "trainer_state.json").read_text())["log_history"]
    assert any("zero_std/masked_group_frac" in entry for entry in history)
    assert (tmp_path / "out" / "config.json").is_file()  # TRL's script saved the model


def test_a_removed_flag_exits_with_the_error_naming_it(tmp_path):
    """A flag of a removed field (trl-zerostd 0.1's streak predictor) is refused by name before TRL's parser would
    report it as unknown; in a YAML config file too."""
    command = ["-m", "trl_zerostd.cli", "grpo", "--output_dir", str(tmp_path), "--skip_predictor", "streak"]
    run = subprocess.run([sys.executable, *command], capture_output=True, text=True, timeout=300)
    assert run.returncode == 1 and "Traceback" not in run.stderr
    assert "trl-zerostd: The command line sets ['skip_predictor'], removed in trl-zerostd 0.2" in run.stderr
    with pytest.raises(SystemExit, match=r"The command line sets \['skip_predictor'\]"):
        cli.main(["grpo", "--output_dir", str(tmp_path), "--skip_predictor=streak"])
    config = tmp_path / "config.yaml"
    config.write_text("skip_zero_std_prompts: true\nskip_refill: false\n")
    with pytest.raises(SystemExit, match=r"config.yaml sets \['skip_refill'\]"):
        cli.main(["grpo", "--config", str(config), "--output_dir", str(tmp_path)])
