"""Held-out accuracy reached per generated token and per second: base TRL against this package's arms, on the
difficulty-spread task (scripts/demo/spread_task.py), over several seeds.

    python scripts/studies/time_to_accuracy.py                # 28 arms x 10 seeds, 300 steps (-x2 600, -half 150)
    python scripts/studies/time_to_accuracy.py --arms trl skip-rate --seeds 0 1 --max_steps 100

Every run is ``scripts/train_grpo.py --task spread`` (tiny local model warm started on the train split, 2,000 train
prompts in three difficulty bands, real generation with the model's own ``generate``) with the arm's flags; the same
seeds, model, data and settings for every arm. At the start and every ``--eval_steps`` steps TRL's own evaluation
samples ``--eval_samples`` completions for each of the 200 held-out prompts (never trained on), apart from training,
where no arm chooses its prompts. Generated tokens are TRL's ``num_tokens`` (prompt and completion tokens of every row
generated, refills included); wall time is the sum of TRL's ``step_time`` (evaluation excluded), split into
generation (the model's ``generate``, timed) and the rest (scoring and update).

The warm start depends on the seed (the held-out reward at the start ranges over 0.16-0.55 for seeds 0-9, as the
medium band is learned or not) and on the machine (its floating-point kernels: another CPU gives other warm starts
for the same seeds; on one machine a run repeats, which scripts/studies/skip_precision.py checks), so the target is per
seed, by a rule fixed before the runs: the start plus ``--target_fraction`` of the gain that base TRL makes on that
seed (its final held-out reward: the mean of its last two evaluations). An arm's cost to reach it is read at its
first evaluation at or above it; ratios to TRL are taken per seed, then their median over seeds, a seed where the
arm never reaches it counting as its costliest.
Runs are cached as JSON in --runs_dir. Writes --table (Markdown) and --plot.

Arms are data (time_to_accuracy_arms.py); the report's tables and figure are time_to_accuracy_tables.py,
time_to_accuracy_checks.py and time_to_accuracy_plot.py, from the per-run measures of time_to_accuracy_metrics.py.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

if __package__ in (None, ""):  # run by path (python scripts/studies/<name>.py): scripts/ holds demo/ and studies/
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from studies.runs import report, run_all
from studies.time_to_accuracy_arms import ARMS, arm_flags, check_runnable
from studies.time_to_accuracy_plot import plot
from studies.time_to_accuracy_tables import summarise

__all__ = ["ARMS", "TimeToAccuracyArguments", "arm_flags", "common_flags", "jobs", "main"]


@dataclass
class TimeToAccuracyArguments:
    arms: list[str] = field(
        default_factory=lambda: [
            "trl",
            "masking",
            "keep_failed",
            "dynamic",
            "skip-rate",
            "skip-rate-prior",
            "skip-rate-prior-f02",
            "trl-mu2",
            "masking-mu2",
            "skip-rate-prior-mu2",
            "skip-rate-prior-f02-mu2",
            "trl-mu2-x2",
            "masking-mu2-x2",
            "skip-rate-prior-mu2-x2",
            "skip-rate-prior-f02-mu2-x2",
            "trl-half",
            "skip-rate-prior-f02-half",
            "trl-lr05",
            "skip-rate-prior-f02-lr05",
            "trl-mu2-lr05",
            "skip-rate-prior-f02-mu2-lr05",
            "trl-mu2-x2-lr05",
            "skip-rate-prior-f02-mu2-x2-lr05",
            "trl-lr2",
            "skip-rate-prior-lr2",
            "skip-rate-prior-f02-lr2",
            "trl-mu2-lr2",
            "skip-rate-prior-f02-mu2-lr2",
        ],  # fmt: skip
        metadata={
            "help": f"Of {list(ARMS)} (-8g: 8 groups a step instead of 16; skip-rate: skip_zero_std_prompts=True "
            "(its predictor: each prompt's success rate); -prior: skip_prior_key=band; -f02: skip_min_draw_prob=0.02; "
            "-mu2: num_iterations=2; -x2: 2 x max_steps; -half: max_steps / 2; -lr05, -lr2: learning_rate x 0.5, x 2; "
            "-g4, -g2: groups of 4 or 2, as many prompts a step; trl-rerun: base TRL made again; cgrpo: the PyPI "
            "peer trl-cgrpo)."
        },
    )
    seeds: list[int] = field(default_factory=lambda: list(range(10)))
    learning_rate: float = field(default=1e-3, metadata={"help": "The main job's default."})
    max_steps: int = field(default=300)
    eval_steps: int = field(default=30)
    eval_samples: int = field(default=8, metadata={"help": "Completions per held-out prompt at each evaluation."})
    target_fraction: float = field(
        default=0.9,
        metadata={"help": "Per seed, the target is the start plus this fraction of base TRL's held-out gain."},
    )
    plot_arms: list[str] = field(
        default_factory=lambda: [
            "trl",
            "masking",
            "dynamic",
            "skip-rate-prior-f02",
            "skip-rate-prior-f02-mu2",
            "trl-mu2",
            "skip-rate-prior-f02-mu2-x2-lr05",
            "trl-mu2-x2-lr05",
        ],  # fmt: skip
        metadata={"help": "Arms drawn in the figure (all of --arms are in the table)."},
    )
    task_flags: list[str] = field(
        default_factory=lambda: ["--task", "spread", "--max_completion_length", "6"],
        metadata={"help": "The task's flags, shared by every arm (the main job's defaults give the rest)."},
    )
    difficulty_column: str = field(default="band", metadata={"help": "The task's difficulty column (-band, -prior)."})
    levels: list[str] = field(
        default_factory=lambda: ["easy", "medium", "hard"], metadata={"help": "Its values, easiest first."}
    )
    hard_level: str = field(default="hard", metadata={"help": "The level whose accuracy the task check shows."})
    completions_per_step: int = field(default=128, metadata={"help": "The task's per_device_train_batch_size."})
    num_generations: int = field(default=8, metadata={"help": "The task's num_generations."})
    eval_batch_size: int = field(default=200, metadata={"help": "per_device_eval_batch_size of the evaluations."})
    title: str = field(default="Difficulty-spread task")
    report_only: bool = field(
        default=False, metadata={"help": "Report the runs already cached, run none (a study made over sessions)."}
    )
    report_arms: list[str] = field(
        default_factory=list,
        metadata={"help": "With --report_only: the arms reported, those with runs (default: --arms)."},
    )
    jobs: int = field(default=2)
    runs_dir: str = field(default="outputs/time_to_accuracy")
    table: str = field(default="docs/time_to_accuracy.md")
    plot: str = field(default="docs/time_to_accuracy.png")


def common_flags(args: TimeToAccuracyArguments, eval_steps: int | None = None) -> list[str]:
    """The flags every arm's run shares: the task's (``args.task_flags``), its held-out evaluation (every
    ``eval_steps``, default ``args.eval_steps``)."""
    return [
        *args.task_flags, "--eval_strategy", "steps", "--eval_steps", str(eval_steps or args.eval_steps),
        "--eval_on_start", "true", "--num_generations_eval", str(args.eval_samples),
        "--per_device_eval_batch_size", str(args.eval_batch_size),
    ]  # fmt: skip


def record_path(args: TimeToAccuracyArguments, arm: str, seed: int) -> Path:
    """Where the run of ``arm`` at ``seed`` keeps its record (also for an arm whose setting left the package)."""
    return Path(f"{args.runs_dir}/{arm}-seed{seed}.json")


def jobs(args: TimeToAccuracyArguments) -> list[tuple]:
    """One job per seed and arm: ``Arm.steps x max_steps`` steps at the arm's learning rate, evaluated every
    ``eval_steps`` generation batches (every ``Arm.iterations x eval_steps`` steps). A record missing for an arm
    whose setting left the package is refused before any run starts (``check_runnable``)."""
    for arm, seed in ((arm, seed) for arm in args.arms for seed in args.seeds):
        if not record_path(args, arm, seed).exists():
            check_runnable(arm)
    return [
        (arm, [*arm_flags(arm, args), *common_flags(args, args.eval_steps * ARMS[arm].iterations)],
         args.learning_rate * ARMS[arm].lr_scale, seed, round(args.max_steps * ARMS[arm].steps),
         str(record_path(args, arm, seed)))
        for seed in args.seeds
        for arm in args.arms
    ]  # fmt: skip


def main(args: TimeToAccuracyArguments) -> None:
    """Run the arms' missing records, then report them beside base TRL's records of the same seeds (every figure is
    against TRL's run of the seed); with ``--report_only``, report ``--report_arms`` from the records alone. The
    report goes to ``--table`` and ``--plot``: point them elsewhere for a run of a few seeds."""
    if args.report_only:
        args.arms = args.report_arms or args.arms
    else:
        run_all(jobs(args), args.jobs)
    args.arms = list(dict.fromkeys(["trl", *args.arms]))
    paths = [record_path(args, arm, seed) for seed in args.seeds for arm in args.arms]
    records = [json.loads(path.read_text()) for path in paths if path.exists()]
    args.arms = [arm for arm in args.arms if any(r["arm"] == arm for r in records)]
    with_trl = {r["seed"] for r in records if r["arm"] == "trl"}
    if not with_trl:
        print(f"No report: {args.runs_dir} has no base TRL record of seeds {args.seeds} (run them with --arms trl).")
        return
    args.seeds = [seed for seed in args.seeds if seed in with_trl]
    records = [r for r in records if r["seed"] in with_trl]
    report(records, args, summarise, plot)


if __name__ == "__main__":
    from trl import TrlParser

    (parsed,) = TrlParser((TimeToAccuracyArguments,)).parse_args_and_config()
    main(parsed)
