"""Command-line plumbing shared by ``scripts/train_grpo.py`` and ``scripts/train_rloo.py``.

``run(trainer_cls, config_cls)`` parses ``ScriptArguments``, the trainer's config and ``trl.ModelConfig``, builds
model, tokenizer, dataset and reward functions, trains, then writes to ``output_dir``: the model,
``metrics.json`` (``trainer.state.log_history``) and ``metrics.png`` (reward, KL, masked group fraction and grad
norm per step). With no argument it fine-tunes the embedded default: the tiny local model (``tiny_model.py``), warm
started on the addition task (``addition_task.py``); ``--task spread`` trains on the difficulty-spread task
(``spread_task.py``) and evaluates on its held-out split. The parser's defaults (``TINY_DEFAULTS``) are tuned for
those runs; set learning rate, lengths and batch sizes yourself for a real ``--model_name_or_path``.
"""

from __future__ import annotations

import gc
import importlib
import json
import os
import sys
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import torch
from datasets import Dataset, load_dataset
from tqdm.auto import tqdm
from transformers.trainer_callback import PrinterCallback, ProgressCallback, TrainerCallback
from transformers.trainer_utils import IntervalStrategy
from trl import ModelConfig, TrlParser, get_peft_config, get_quantization_config

from demo import addition_task, chat_arith_task, spread_task
from demo.held_out_eval import SampledEvaluation
from demo.tiny_model import build_model, build_tokenizer
from trl_zerostd.core.settings import ZERO_STD_FIELDS, refuse_removed_flags

DATA_FILE_BUILDERS = {".json": "json", ".jsonl": "json", ".csv": "csv", ".parquet": "parquet"}
# panel title -> the logged keys it shows, first found (TRL's base trainer logs no zero_std/ metric)
PLOTTED_METRICS = {
    "reward": ("reward",),
    "held-out reward": ("eval_reward",),
    "kl": ("kl",),
    "zero-variance group fraction": ("zero_std/masked_group_frac", "frac_reward_zero_std"),
    "truncated completions": ("completions/clipped_ratio",),
    "grad_norm": ("grad_norm",),
}
LOG_SCALE_PANELS = ("kl", "grad_norm")  # occasional spikes would flatten the rest
SMOOTHING = 10  # logged steps in the plots' moving average
SUMMARY_WINDOW = 10  # logged steps averaged at each end of the run for the reward summary
PRINTED_METRICS = {
    "reward": "reward",
    "kl": "kl",
    "zero_std/masked_group_frac": "zero-var groups",
    "grad_norm": "grad",
}

TINY_DEFAULTS = {
    "num_generations": 8,
    "per_device_train_batch_size": 128,  # completions per step: 16 prompts x 8 generations
    "max_completion_length": 4,
    "temperature": 1.0,
    "learning_rate": 1e-3,
    "beta": 0.04,
    "max_steps": 300,
    "logging_steps": 1,
    "save_strategy": "no",
    "report_to": "none",
    "gradient_checkpointing": False,
}
if not torch.cuda.is_available():
    TINY_DEFAULTS.update({"use_cpu": True, "bf16": False})


@dataclass
class ScriptArguments:
    """What to train on and what to write; the trainer's config and ``trl.ModelConfig`` hold everything else."""

    dataset_name: str | None = field(
        default=None,
        metadata={
            "help": "Hub dataset name, or a local .json/.jsonl/.csv/.parquet file, with a 'prompt' column. "
            "Default: the embedded addition task (num_prompts prompts 'a+b=')."
        },
    )
    dataset_config: str | None = field(
        default=None, metadata={"help": "Configuration name of a hub dataset (the `name` of `load_dataset`)."}
    )
    dataset_train_split: str = field(
        default="train", metadata={"help": "Split of a hub dataset to train on (a local file has only 'train')."}
    )
    task: str = field(
        default="addition",
        metadata={
            "help": "Embedded task without --dataset_name: 'addition' (single-digit sums, evaluated on its own "
            "prompts), 'spread' (sums in three difficulty bands, evaluated on a held-out split; spread_task.py) or "
            "'chat_arith' (chat prompts of arithmetic in five levels for a real instruct model, evaluated on a "
            "held-out split; chat_arith_task.py; needs --model_name_or_path).",
            "choices": ["addition", "spread", "chat_arith"],
        },
    )
    num_prompts: int = field(
        default=2000,
        metadata={
            "help": "Prompts in the embedded task's train split (RL prompts and warm start, without --dataset_name)."
        },
    )
    chat_prompts: bool = field(
        default=False,
        metadata={
            "help": "--task spread: conversational prompts (one user message, 'What is a + b? Answer with the "
            "number only.'), which TRL renders with the model's chat template; for instruct models."
        },
    )
    num_eval_prompts: int = field(
        default=200,
        metadata={"help": "Prompts in the held-out split of --task spread or chat_arith (never trained on)."},
    )
    warm_start_steps: int | None = field(
        default=None,
        metadata={
            "help": "Supervised steps (batches of 64) that teach the embedded tiny model part of the task before RL, "
            "so that zero-variance groups occur and the reward can rise. Default: 150 for --task addition, 800 for "
            "--task spread. Ignored with --model_name_or_path; 0 starts RL from random weights."
        },
    )
    reward_funcs: list[str] | None = field(
        default=None,
        metadata={
            "help": "Reward functions: dotted import paths (module.function) or names from `trl.rewards` "
            "(e.g. accuracy_reward). Default: demo.addition_task.correct_sum_reward (the first number of a "
            "completion against the dataset's 'answer' column, or the sum asked by an 'a+b=' prompt); with --task "
            "spread, demo.spread_task.banded_sum_reward (the same, logging accuracy and tied groups per "
            "difficulty band); with --task chat_arith, demo.chat_arith_task.FinalAnswerReward (the last number of "
            "a completion that ended, per level)."
        },
    )
    eval_by_sampling: bool = field(
        default=False,
        metadata={
            "help": "Evaluate on the held-out split by sampling alone (held_out_eval.py: generation and reward, "
            "without TRL's reference and loss forwards), on TRL's schedule (--eval_strategy steps, --eval_steps, "
            "--eval_on_start), with --num_generations_eval samples a prompt."
        },
    )
    eval_also_at: list[int] = field(
        default_factory=list,
        metadata={
            "help": "With --eval_by_sampling: also evaluate at these optimizer steps (e.g. 5 15 for a finer early "
            "curve). Evaluation samples with its own seed and leaves training's random state alone."
        },
    )
    eval_train_groups: bool = field(
        default=False,
        metadata={
            "help": "With --eval_by_sampling: at each evaluation also sample one group of --num_generations "
            "completions of every train prompt, not trained on, and log the share whose group would split "
            "(eval_train_informative_frac): how much of a revisited prompt set still teaches. Costs a group per "
            "train prompt per evaluation; meant for small train sets."
        },
    )
    plot: bool = field(default=True, metadata={"help": "Write output_dir/metrics.png after training."})
    print_every: int = field(
        default=25,
        metadata={"help": "Print one line of the main metrics every this many logged steps (the bar shows reward)."},
    )
    cpu_threads: int | None = field(
        default=None,
        metadata={
            "help": "torch intra-op threads when training on CPU. Default: 1 for the embedded tiny model (its "
            "matrices are too small to gain from threads, and extra threads stall on a busy machine), torch's "
            "own choice otherwise."
        },
    )


def make_parser(config_cls, **defaults) -> TrlParser:
    """``TrlParser`` over ``(ScriptArguments, config_cls, ModelConfig)`` with ``TINY_DEFAULTS`` and ``defaults``."""
    parser = TrlParser((ScriptArguments, config_cls, ModelConfig))
    unknown = parser.set_defaults_with_config(**{**TINY_DEFAULTS, **defaults})
    if unknown:
        raise ValueError(f"Defaults for settings that {config_cls.__name__} does not have: {unknown[::2]}")
    return parser


def main(trainer_cls, config_cls, **defaults) -> None:
    """A script's entry point: ``run`` with the command line. A multi-process run of this package's trainers needs
    nothing more at exit (they end the process group themselves: ``trl_zerostd/trainer/process_exit.py``)."""
    run(trainer_cls, config_cls, **defaults)


def end_run(accelerator) -> None:
    """For TRL's own trainers, which do not end the process group at exit: drop the accelerator's models and
    optimizers (FSDP's and DeepSpeed's hold communication handles), collect them, destroy the process group, while
    the interpreter is whole. Without it a multi-process run can abort at exit after training finished (``terminate
    called without an active exception``, exit code 1; ``tests/tools/stress_launches.py`` shows it with plain
    torch)."""
    accelerator.free_memory()
    gc.collect()
    accelerator.end_training()


def run(trainer_cls, config_cls, argv: list[str] | None = None, **defaults):
    """Parse ``argv`` (default ``sys.argv[1:]``; ``--config file.yaml`` too), then ``train``; returns the trainer.

    ``defaults`` override ``TINY_DEFAULTS`` for one script, e.g. ``output_dir="outputs/grpo-tiny"``.
    """
    refuse_removed_flags(sys.argv[1:] if argv is None else argv)
    script_args, training_args, model_args = make_parser(config_cls, **defaults).parse_args_and_config(argv)
    threads = script_args.cpu_threads or (1 if model_args.model_name_or_path is None else None)
    with torch_threads(threads if training_args.device.type == "cpu" else None):
        return train(trainer_cls, script_args, training_args, model_args)


def train(trainer_cls, script_args: ScriptArguments, training_args, model_args: ModelConfig):
    """Build model, data and rewards, train, and save model, ``metrics.json`` and ``metrics.png`` to output_dir."""
    if script_args.task == "chat_arith" and model_args.model_name_or_path is None:
        raise ValueError("--task chat_arith asks chat questions of a real instruct model: set --model_name_or_path.")
    if script_args.eval_train_groups and not (script_args.eval_by_sampling and training_args.eval_strategy != "no"):
        raise ValueError("--eval_train_groups probes the train prompts at each sampled evaluation: set "
                         "--eval_by_sampling true and an --eval_strategy other than 'no'.")  # fmt: skip
    if script_args.reward_funcs:
        reward_funcs = [load_reward_func(name) for name in script_args.reward_funcs]
    else:
        reward_funcs = [default_reward(script_args.task, model_args.model_name_or_path)]
    train_dataset, eval_dataset = load_datasets(script_args, training_args.seed)
    if model_args.model_name_or_path is None:
        warm_start_data = train_dataset  # the embedded task's; a user's dataset may have no "answer" column
        if script_args.dataset_name is not None:
            warm_start_data = addition_task.addition_dataset(script_args.num_prompts, seed=training_args.seed)
        model = prepare_tiny_model(
            Path(training_args.output_dir) / "warm_start", warm_start_data, script_args, training_args
        )
    else:
        model = model_args.model_name_or_path
        training_args.model_init_kwargs = {
            "revision": model_args.model_revision,
            "attn_implementation": model_args.attn_implementation,
            "dtype": model_args.dtype,
            **(training_args.model_init_kwargs or {}),
        }
    sampled_eval = None
    if script_args.eval_by_sampling and training_args.eval_strategy != "no":  # our evaluation on TRL's schedule
        sampled_eval = {
            "every": int(training_args.eval_steps), "on_start": training_args.eval_on_start,
            "also_at": script_args.eval_also_at,
        }  # fmt: skip
        training_args.eval_strategy, training_args.eval_on_start = IntervalStrategy.NO, False
    trainer = trainer_cls(
        model=model,
        reward_funcs=reward_funcs,
        args=training_args,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset if training_args.eval_strategy != "no" else None,
        quantization_config=get_quantization_config(model_args),
        peft_config=get_peft_config(model_args),
    )
    if trainer.pop_callback(ProgressCallback) is not None:
        trainer.add_callback(RewardProgressBar())
    trainer.pop_callback(PrinterCallback)  # installed instead of the bar under --disable_tqdm
    trainer.add_callback(MetricLines(script_args.print_every))
    if sampled_eval is not None:
        probed = train_dataset if script_args.eval_train_groups else None
        trainer.add_callback(SampledEvaluation(trainer, eval_dataset, **sampled_eval, train_dataset=probed))
    trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
    trainer.save_model(training_args.output_dir)

    if trainer.accelerator.is_main_process:
        history = trainer.state.log_history
        output_dir = Path(training_args.output_dir)
        (output_dir / "metrics.json").write_text(json.dumps(history, indent=1))
        if script_args.plot:
            plot_metrics({training_args.output_dir: history}, output_dir / "metrics.png")
        print(f"Model, metrics.json{' and metrics.png' if script_args.plot else ''} saved to {output_dir}.")
        print(reward_summary(history))
        if any("eval_reward" in entry for entry in history):
            print(held_out_summary(history))
    return trainer


class RewardProgressBar(ProgressCallback):
    """TRL's progress bar with the reward beside it, without the whole metric dict written at every step."""

    def on_log(self, args, state, control, logs=None, **kwargs):
        if state.is_world_process_zero and self.training_bar is not None and "reward" in (logs or {}):
            self.training_bar.set_postfix(reward=f"{logs['reward']:.3f}", refresh=False)


class MetricLines(TrainerCallback):
    """One short line of the main metrics every ``print_every`` logged steps, and one at the end."""

    def __init__(self, print_every: int):
        self.print_every = max(print_every, 1)
        self.logged = 0

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or not logs:
            return
        self.logged += "reward" in logs
        if "train_runtime" in logs:
            shown = {"runtime (s)": logs["train_runtime"], "mean loss": logs.get("train_loss", float("nan"))}
        elif "reward" in logs and self.logged % self.print_every == 0:
            shown = {name: logs[key] for key, name in PRINTED_METRICS.items() if isinstance(logs.get(key), float)}
        else:
            return
        tqdm.write(f"step {state.global_step}: " + ", ".join(f"{k} {v:.4g}" for k, v in shown.items()))


@contextmanager
def torch_threads(threads: int | None):
    """Within the block torch uses ``threads`` intra-op threads (None: unchanged)."""
    previous = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


WARM_START_STEPS = {"addition": 150, "spread": 800}
DEFAULT_REWARDS = {
    "addition": "demo.addition_task.correct_sum_reward",
    "spread": "demo.spread_task.banded_sum_reward",
}


def default_reward(task: str, model_name_or_path: str | None):
    """The embedded task's reward function; chat_arith's reads the stop tokens of the model's tokenizer."""
    if task == "chat_arith":
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(model_name_or_path)
        return chat_arith_task.FinalAnswerReward(chat_arith_task.stop_token_ids(tokenizer))
    return load_reward_func(DEFAULT_REWARDS[task])


def load_datasets(script_args: ScriptArguments, seed: int) -> tuple[Dataset, Dataset]:
    """``(train, eval)``: the spread or chat_arith task's train and held-out splits; otherwise the train dataset twice
    (the addition task and a user's dataset are evaluated on their own prompts, under --eval_strategy)."""
    if script_args.dataset_name is None and script_args.task == "spread":
        return spread_task.spread_splits(
            script_args.num_prompts, script_args.num_eval_prompts, seed=seed, chat=script_args.chat_prompts
        )
    if script_args.dataset_name is None and script_args.task == "chat_arith":
        return chat_arith_task.chat_arith_splits(script_args.num_prompts, script_args.num_eval_prompts, seed=seed)
    train_dataset = load_train_dataset(script_args, seed)
    return train_dataset, train_dataset


def load_train_dataset(script_args: ScriptArguments, seed: int) -> Dataset:
    """The embedded addition dataset, a local data file, or a hub dataset; it must have a "prompt" column."""
    name = script_args.dataset_name
    if name is None:
        return addition_task.addition_dataset(script_args.num_prompts, seed=seed)
    builder = DATA_FILE_BUILDERS.get(Path(name).suffix.lower())
    if builder is not None:
        if not os.path.isfile(name):
            raise FileNotFoundError(f"--dataset_name {name!r}: no such file.")
        dataset = load_dataset(builder, data_files=name, split="train")
    else:
        dataset = load_dataset(name, name=script_args.dataset_config, split=script_args.dataset_train_split)
    if "prompt" not in dataset.column_names:
        raise ValueError(
            f"--dataset_name {name!r} has no 'prompt' column (columns: {dataset.column_names}); the trainer "
            "generates completions for the 'prompt' of each row."
        )
    return dataset


def prepare_tiny_model(path: Path, dataset: Dataset, script_args: ScriptArguments, training_args) -> str:
    """Build the tiny model, warm start it on ``dataset`` (prompt, answer), save it to ``path``; returns ``path``.

    The trainer gets a path, not a model: TRL loads the reference model from the policy's name. The main process
    writes it; the others wait for it.
    """
    with training_args.main_process_first(local=False, desc="warm start"):
        if training_args.process_index == 0:
            tokenizer = build_tokenizer()
            model = build_model(tokenizer, seed=training_args.seed)
            steps = script_args.warm_start_steps
            steps = WARM_START_STEPS[script_args.task] if steps is None else steps
            addition_task.warm_start(model, tokenizer, dataset, steps=steps, seed=training_args.seed)
            model.save_pretrained(path)
            tokenizer.save_pretrained(path)
    return str(path)


def load_reward_func(name: str):
    """A reward function from a dotted import path (``package.module.function``) or a name in ``trl.rewards``."""
    module_name, _, attribute = name.rpartition(".")
    try:
        return getattr(importlib.import_module(module_name or "trl.rewards"), attribute)
    except (ImportError, AttributeError) as error:
        raise ValueError(
            f"--reward_funcs {name!r}: not an importable 'module.function' path nor a name in trl.rewards ({error})."
        ) from error


def metric_series(history: list[dict], key: str) -> tuple[list[int], list[float]]:
    """Steps and values of ``key`` over the training log entries that have it."""
    entries = [entry for entry in history if key in entry]
    return [entry["step"] for entry in entries], [entry[key] for entry in entries]


def reward_summary(history: list[dict], window: int = SUMMARY_WINDOW) -> str:
    """One line comparing the mean reward of the first and the last ``window`` logged steps (at most half each)."""
    _, rewards = metric_series(history, "reward")
    if not rewards:
        return "No reward was logged."
    window = max(1, min(window, len(rewards) // 2))
    first, last = sum(rewards[:window]) / window, sum(rewards[-window:]) / window
    return (
        f"Mean reward: {first:.3f} over the first {window} logged steps -> {last:.3f} over the last {window} "
        f"({last - first:+.3f})."
    )


def held_out_summary(history: list[dict]) -> str:
    """One line: the held-out reward at the first and the last evaluation."""
    steps, rewards = metric_series(history, "eval_reward")
    return (
        f"Held-out reward: {rewards[0]:.3f} at step {steps[0]} -> {rewards[-1]:.3f} at step {steps[-1]} "
        f"({rewards[-1] - rewards[0]:+.3f})."
    )


def plot_metrics(histories: dict[str, list[dict]], path: Path) -> None:
    """One panel per ``PLOTTED_METRICS`` entry against the training step, one line per run (a moving average of
    ``SMOOTHING`` logged steps over the raw values, drawn faint), saved as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(2, 3, figsize=(15, 7), sharex=True)
    for axis, (title, keys) in zip(axes.flat, PLOTTED_METRICS.items()):
        for run_index, (name, history) in enumerate(histories.items()):
            key = next((k for k in keys if metric_series(history, k)[0]), keys[0])
            steps, values = metric_series(history, key)
            color = f"C{run_index}"
            axis.plot(steps, values, color=color, alpha=0.25 if len(steps) > SMOOTHING else 1.0,
                      marker="o" if len(steps) <= SMOOTHING else None)  # fmt: skip
            if len(steps) > SMOOTHING:
                axis.plot(steps[SMOOTHING - 1 :], moving_average(values, SMOOTHING), color=color, label=name)
            elif steps:
                axis.lines[-1].set_label(name)
        axis.set_title(title + (" (log scale)" if title in LOG_SCALE_PANELS else ""))
        if title in LOG_SCALE_PANELS and any(y > 0 for line in axis.lines for y in line.get_ydata()):
            axis.set_yscale("log")
        axis.grid(alpha=0.3)
        if not any(len(line.get_xdata()) for line in axis.lines):
            axis.text(0.5, 0.5, "not logged", ha="center", va="center", transform=axis.transAxes, color="grey")
        elif len(histories) > 1:
            axis.legend()
    for axis in axes[1]:
        axis.set_xlabel("step")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def without_package_flags(argv: list[str]) -> list[str]:
    """``argv`` without this package's ``--<field> [value]`` flags, for TRL's own configs (which lack them)."""
    kept, skip_value = [], False
    for arg in argv:
        name = arg.lstrip("-").split("=")[0]
        if skip_value:
            skip_value = False
        elif arg.startswith("--") and name in ZERO_STD_FIELDS:
            skip_value = "=" not in arg
        else:
            kept.append(arg)
    return kept


def moving_average(values: list[float], window: int) -> list[float]:
    """Means of each ``window`` consecutive values (``len(values) - window + 1`` of them)."""
    sums = [0.0]
    for value in values:
        sums.append(sums[-1] + value)
    return [(sums[i + window] - sums[i]) / window for i in range(len(values) - window + 1)]
