"""The shared CLI: a short end-to-end run writes model, metrics and plot; bad settings fail early and by name."""

import json

import pytest

from demo.train_cli import ScriptArguments, load_train_dataset, reward_summary, run
from tests.support.trainers import OUR_CLASSES
from trl_zerostd import ZeroStdGRPOConfig, ZeroStdGRPOTrainer

TINY_RUN = [
    "--max_steps",
    "2",
    "--warm_start_steps",
    "20",
    "--num_prompts",
    "32",
    "--per_device_train_batch_size",
    "16",
]


@pytest.mark.parametrize("kind", ["grpo", "rloo"])
def test_short_run_writes_model_metrics_and_plot(kind, tmp_path, capsys):
    trainer_cls, config_cls = OUR_CLASSES[kind]
    trainer = run(trainer_cls, config_cls, ["--output_dir", str(tmp_path), *TINY_RUN])

    assert trainer.state.global_step == 2
    assert (tmp_path / "model.safetensors").is_file() and (tmp_path / "warm_start" / "model.safetensors").is_file()
    assert (tmp_path / "metrics.png").stat().st_size > 0
    history = json.loads((tmp_path / "metrics.json").read_text())
    fractions = [entry["zero_std/masked_group_frac"] for entry in history if "zero_std/masked_group_frac" in entry]
    assert len(fractions) == 2 and all(0.0 <= f <= 1.0 for f in fractions)
    assert "Mean reward:" in capsys.readouterr().out


def test_bad_normalization_names_the_flag(tmp_path, capsys):
    with pytest.raises(SystemExit):
        run(ZeroStdGRPOTrainer, ZeroStdGRPOConfig, ["--output_dir", str(tmp_path), "--zero_std_normalization", "drop"])
    assert "--zero_std_normalization" in capsys.readouterr().err


def test_bad_atol_names_the_setting(tmp_path):
    with pytest.raises(ValueError, match="zero_std_atol"):
        run(ZeroStdGRPOTrainer, ZeroStdGRPOConfig, ["--output_dir", str(tmp_path), "--zero_std_atol", "-1"])


def test_dataset_file_without_prompt_column(tmp_path):
    data = tmp_path / "data.jsonl"
    data.write_text('{"question": "1+1=", "answer": 2}\n')
    with pytest.raises(ValueError, match="no 'prompt' column"):
        run(ZeroStdGRPOTrainer, ZeroStdGRPOConfig, ["--output_dir", str(tmp_path), "--dataset_name", str(data)])
    assert not (tmp_path / "warm_start").exists()


def test_missing_dataset_file_and_unknown_reward(tmp_path):
    with pytest.raises(FileNotFoundError, match="no_such.jsonl"):
        load_train_dataset(ScriptArguments(dataset_name=str(tmp_path / "no_such.jsonl")), seed=0)
    with pytest.raises(ValueError, match="--reward_funcs"):
        run(ZeroStdGRPOTrainer, ZeroStdGRPOConfig, ["--output_dir", str(tmp_path), "--reward_funcs", "no_such_reward"])


@pytest.mark.parametrize("suffix", [".jsonl", ".csv"])
def test_local_dataset_file(tmp_path, suffix):
    data = tmp_path / f"data{suffix}"
    data.write_text('{"prompt": "1+1=", "answer": 2}\n' if suffix == ".jsonl" else "prompt,answer\n1+1=,2\n")
    dataset = load_train_dataset(ScriptArguments(dataset_name=str(data)), seed=0)
    assert dataset["prompt"] == ["1+1="] and dataset["answer"] == [2]


def test_reward_summary_compares_first_and_last_steps():
    history = [{"step": step, "reward": reward} for step, reward in enumerate([0.2, 0.4, 0.6, 0.8], start=1)]
    history.append({"step": 4, "train_runtime": 1.0})
    assert reward_summary(history, window=2) == (
        "Mean reward: 0.300 over the first 2 logged steps -> 0.700 over the last 2 (+0.400)."
    )
    assert reward_summary([]) == "No reward was logged."


def test_package_flags_are_stripped_for_trl_configs():
    from demo.train_cli import without_package_flags

    argv = ["--max_steps", "5", "--zero_std_normalization", "exclude", "--mask_zero_std_groups=false", "--beta", "0.1"]
    assert without_package_flags(argv) == ["--max_steps", "5", "--beta", "0.1"]


def test_plot_compares_runs_and_falls_back_to_trl_zero_std_metric(tmp_path):
    from demo.train_cli import moving_average, plot_metrics

    ours = [
        {"step": s, "reward": s / 20, "kl": 0.1, "zero_std/masked_group_frac": 0.5, "grad_norm": 1.0}
        for s in range(20)
    ]
    base = [{"step": s, "reward": s / 30, "kl": 0.2, "frac_reward_zero_std": 0.4, "grad_norm": 2.0} for s in range(20)]
    plot_metrics({"base": base, "ours": ours}, tmp_path / "compare.png")
    assert (tmp_path / "compare.png").stat().st_size > 0
    assert moving_average([1.0, 2.0, 3.0, 4.0], 2) == [1.5, 2.5, 3.5]


def test_the_default_run_learns(tmp_path):
    """The main job's defaults (warm start, then ZeroStdGRPOTrainer), cut to 60 steps: the reward rises (measured:
    0.445 over the first 10 steps -> 0.641 over the last 10, seed 0)."""
    trainer = run(ZeroStdGRPOTrainer, ZeroStdGRPOConfig, ["--output_dir", str(tmp_path), "--max_steps", "60"])
    rewards = [entry["reward"] for entry in trainer.state.log_history if "reward" in entry]
    first, last = sum(rewards[:10]) / 10, sum(rewards[-10:]) / 10
    assert len(rewards) == 60 and last > first + 0.1, (first, last)


def test_tiny_model_on_a_dataset_file_is_warm_started_on_the_addition_task(tmp_path):
    """A user's prompt file needs no "answer" column: the tiny model's warm start uses the embedded addition task."""
    data = tmp_path / "data.jsonl"
    data.write_text("".join(f'{{"prompt": "{a}+{a}="}}\n' for a in range(8)))
    trainer = run(ZeroStdGRPOTrainer, ZeroStdGRPOConfig, ["--output_dir", str(tmp_path), "--dataset_name", str(data),
                                                          *TINY_RUN, "--plot", "false"])  # fmt: skip
    assert trainer.state.global_step == 2 and (tmp_path / "warm_start" / "model.safetensors").is_file()
