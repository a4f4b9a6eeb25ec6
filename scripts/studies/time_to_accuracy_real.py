"""Held-out accuracy reached per generated token and per second on a real pretrained model: base TRL against this
package's arms, SmolLM2-135M-Instruct (offline, ``scripts/demo/real_model.py``) with LoRA on the chat arithmetic task
(``scripts/demo/chat_arith_task.py``), over several seeds.

    python scripts/studies/time_to_accuracy_real.py              # the study's arms x 5 seeds; runs cached, resumable
    python scripts/studies/time_to_accuracy_real.py --report_only true    # every arm with runs: tables and figure
    python scripts/studies/time_to_accuracy_real.py --arms trl masking --seeds 0 --max_steps 20

The study of ``time_to_accuracy.py`` (same arms, same rule for the target, same tables and figure) with the task's
settings: every run is ``scripts/train_grpo.py --config scripts/configs/smollm2_chat_arith.yaml`` with the arm's
flags; the same seeds, data, starting weights and settings for every arm. Runs are cached as JSON in ``--runs_dir``
(kept in the repository: a run already there is not run again, so the study resumes across machines); a run killed
mid-way goes on from its last checkpoint (every 10 steps) the next time.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

import yaml

if __package__ in (None, ""):  # run by path (python scripts/studies/<name>.py): scripts/ holds demo/ and studies/
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from demo.real_model import smollm2_folder
from studies.time_to_accuracy import TimeToAccuracyArguments, main

CONFIG = "scripts/configs/smollm2_chat_arith.yaml"
TASK = yaml.safe_load((Path(__file__).resolve().parents[2] / CONFIG).read_text())  # the study's defaults come from it
# The study, what a plain run runs: base TRL, masking, keep_failed, skipping at TRL's settings, the lead setting, and
# TRL in that setting
ARMS_REAL = [
    "trl", "masking", "keep_failed", "skip-rate-prior", "skip-rate-prior-f02-mu2-x2-lr05", "trl-mu2-x2-lr05",
]  # fmt: skip
# What --report_only shows, in this order: the study's arms and those run on some seeds to test an idea
# (docs/studies/real_model.md says which); run one with --arms
REPORT_ARMS_REAL = [
    "trl", "trl-lr2", "masking", "keep_failed", "skip-rate-prior", "skip-rate-prior-f02-mu2-x2-lr05",
    "trl-mu2-x2-lr05", "keep_failed-mu2-x2-lr05", "skip-rate-prior-f02-mu2-x2", "trl-mu2-x2", "dynamic",
]  # fmt: skip
PLOT_ARMS = ["trl", "masking", "keep_failed", "skip-rate-prior", "skip-rate-prior-f02-mu2-x2-lr05", "trl-mu2-x2-lr05"]


@dataclass
class RealTimeToAccuracyArguments(TimeToAccuracyArguments):
    """``TimeToAccuracyArguments`` with the task config's settings as defaults (every run reads the config too)."""

    arms: list[str] = field(
        default_factory=lambda: list(ARMS_REAL),
        metadata={"help": "Arms of time_to_accuracy.py's ARMS (its --help says what each suffix sets)."},
    )
    report_arms: list[str] = field(
        default_factory=lambda: list(REPORT_ARMS_REAL),
        metadata={"help": "With --report_only: the arms reported, those with runs."},
    )
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2, 3, 4])
    learning_rate: float = field(default=TASK["learning_rate"])
    max_steps: int = field(default=TASK["max_steps"])
    eval_steps: int = field(default=TASK["eval_steps"])
    eval_samples: int = field(
        default=TASK["num_generations_eval"], metadata={"help": "Completions per held-out prompt at each evaluation."}
    )
    plot_arms: list[str] = field(default_factory=lambda: list(PLOT_ARMS), metadata={"help": "Arms in the figure."})
    # evaluations at 0, 5, 10, 15, 20, 30, 40: a crossing at half TRL's tokens shows (runs before had no 5, 15); a
    # checkpoint every 10 steps (the end of a generation batch under num_iterations 2): a run killed goes on from its
    # last (runs.run_one), to the record it would have made
    task_flags: list[str] = field(
        default_factory=lambda: [
            "--config",
            CONFIG,
            "--cpu_threads",
            "1",
            "--eval_also_at",
            "5",
            "15",
            "--save_strategy",
            "steps",
            "--save_steps",
            "10",
            "--save_total_limit",
            "2",
        ]  # fmt: skip
    )
    difficulty_column: str = field(default="level")
    levels: list[str] = field(default_factory=lambda: ["1", "2", "3", "4", "5", "6"])
    hard_level: str = field(default="3")
    completions_per_step: int = field(default=TASK["per_device_train_batch_size"])
    num_generations: int = field(default=TASK["num_generations"])
    eval_batch_size: int = field(default=TASK["per_device_eval_batch_size"])
    title: str = field(default="SmolLM2-135M-Instruct, LoRA, chat arithmetic")
    runs_dir: str = field(default="docs/results/time_to_accuracy_real/runs")
    table: str = field(default="docs/results/time_to_accuracy_real/table.md")
    plot: str = field(default="docs/results/time_to_accuracy_real/curves.png")


def run_real_study(arguments: type[RealTimeToAccuracyArguments] = RealTimeToAccuracyArguments) -> None:
    """The command line parsed into ``arguments``; SmolLM2 converted from its GGUF file once, before the runs read it
    (not to report alone); then the study (``time_to_accuracy.main``)."""
    from trl import TrlParser

    (parsed,) = TrlParser((arguments,)).parse_args_and_config()
    if not parsed.report_only:
        smollm2_folder(TASK["model_name_or_path"])
    main(parsed)


if __name__ == "__main__":
    run_real_study()
