"""Prompt skipping against dynamic sampling alone and base TRL: generation tokens and wall time per informative group
trained, and the reward reached, on a multi-epoch run of the main job where prompts become solved.

    python scripts/studies/prompt_skipping.py                                   # 3 arms x 3 seeds, 300 steps each
    python scripts/studies/prompt_skipping.py --arms dynamic skip-rate --seeds 0 --max_steps 100

Every run is the main job (scripts/train_grpo.py defaults, real generation with the model's own ``generate``) on
``--num_prompts`` prompts, so that 300 steps of 16 prompts walk the dataset many times, with a shorter warm start
(the tiny model memorises 100 prompts faster), with the arm's flags. The
reward is measured apart from training, where no arm chooses its prompts: every ``--eval_steps`` steps TRL's own
evaluation samples 8 completions for every prompt of the dataset (``eval_reward``). Generation tokens are TRL's
``num_tokens`` (prompt and completion tokens of every generated row, refills included); wall time is the sum of
TRL's ``step_time`` (evaluation excluded). Informative groups trained: the groups per step less the zero-variance
ones (``frac_reward_zero_std`` for TRL, ``zero_std/masked_group_frac`` for ours). Runs are cached as JSON in
--runs_dir. Writes --table (Markdown) and --plot.
"""

from __future__ import annotations

import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path

if __package__ in (None, ""):  # run by path (python scripts/studies/<name>.py): scripts/ holds demo/ and studies/
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from studies.learning_curves import cumulative
from studies.runs import report, run_all, seed_arm_jobs

ARMS = {
    "trl": [],
    "dynamic": ["--dynamic_sampling", "true"],
    # the success-rate predictor (the study's table ran the streak predictor, since removed: aadc222 reruns it)
    "skip-rate": ["--dynamic_sampling", "true", "--skip_zero_std_prompts", "true"],
}
GROUPS_PER_STEP = 16  # the main job: 128 completions per step, 8 per prompt


@dataclass
class SkipArguments:
    arms: list[str] = field(default_factory=lambda: ["trl", "dynamic", "skip-rate"])
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2])
    learning_rate: float = field(default=1e-3, metadata={"help": "The main job's default."})
    max_steps: int = field(default=300)
    num_prompts: int = field(default=100, metadata={"help": "Dataset rows: 300 steps x 16 prompts walk 100 48 times."})
    eval_steps: int = field(default=30, metadata={"help": "Evaluate on every prompt of the dataset this often."})
    warm_start_steps: int = field(
        default=90, metadata={"help": "On 100 prompts, 90 supervised steps start RL near the main job's 0.45 reward."}
    )
    jobs: int = field(default=2)
    threshold: float = field(default=0.8, metadata={"help": "Eval reward to time each arm to."})
    runs_dir: str = field(default="outputs/prompt_skipping")
    table: str = field(default="docs/results/prompt_skipping/prompt_skipping.md")
    plot: str = field(default="docs/results/prompt_skipping/prompt_skipping.png")


def informative_trained(record: dict) -> float:
    """Informative groups trained over the run."""
    fractions = record["masked_group_frac"] if record["arm"] != "trl" else record["frac_reward_zero_std"]
    return sum(GROUPS_PER_STEP * (1 - fraction) for fraction in fractions)


def eval_points(record: dict) -> list[tuple[int, float, float, float]]:
    """``(step, eval reward, generation tokens, wall seconds)`` at each evaluation."""
    wall = cumulative(record["step_time"])
    return [(step, reward, record["num_tokens"][step - 1], wall[step - 1]) for step, reward in record["eval"]]


def summarise(records: list[dict], args: SkipArguments) -> str:
    def mean(values):
        return statistics.fmean(values)

    per_arm = {arm: [r for r in records if r["arm"] == arm] for arm in args.arms}
    tokens_per = {
        arm: mean(r["num_tokens"][-1] / informative_trained(r) for r in runs) for arm, runs in per_arm.items()
    }
    wall_per = {arm: mean(cumulative(r["step_time"])[-1] / informative_trained(r) for r in runs)
                for arm, runs in per_arm.items()}  # fmt: skip
    reference = "dynamic" if "dynamic" in per_arm else args.arms[0]
    lines = [
        "| arm | final eval reward | generation tokens (M) | informative groups trained | tokens per informative "
        f"group, / {reference} | wall per informative group (ms), / {reference} | prompts skipped "
        f"| eval reward {args.threshold} reached at: tokens (M), wall (s) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for arm, runs in per_arm.items():
        finals = [r["eval"][-1][1] for r in runs]
        reached = [
            next(((t, w) for _, reward, t, w in eval_points(r) if reward >= args.threshold), None) for r in runs
        ]
        hit = [point for point in reached if point is not None]
        skipped = [mean(r["skipped_frac"]) for r in runs if r["skipped_frac"][0] is not None]
        lines.append(
            f"| {arm} | {mean(finals):.3f} ± {statistics.stdev(finals) if len(finals) > 1 else 0:.3f} "
            f"| {mean(r['num_tokens'][-1] for r in runs) / 1e6:.3f} "
            f"| {mean(informative_trained(r) for r in runs):.0f} "
            f"| {tokens_per[arm]:.0f}, {tokens_per[arm] / tokens_per[reference]:.2f} "
            f"| {1e3 * wall_per[arm]:.1f}, {wall_per[arm] / wall_per[reference]:.2f} "
            f"| {f'{mean(skipped):.0%}' if skipped else '-'} "
            + (f"| {mean(t for t, _ in hit) / 1e6:.3f}, {mean(w for _, w in hit):.0f} ({len(hit)}/{len(runs)} runs) |"
               if hit else "| not reached |")
        )  # fmt: skip
    return "\n".join(lines)


def plot(records: list[dict], args: SkipArguments) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, 2, figsize=(12, 4.2), sharey=True)
    for index, arm in enumerate(args.arms):
        for run_index, record in enumerate(r for r in records if r["arm"] == arm):
            points = eval_points(record)
            label = arm if run_index == 0 else None
            rewards = [reward for _, reward, _, _ in points]
            axes[0].plot([t / 1e6 for _, _, t, _ in points], rewards, "o-", color=f"C{index}", alpha=0.7, label=label)
            axes[1].plot([w for _, _, _, w in points], rewards, "o-", color=f"C{index}", alpha=0.7, label=label)
    axes[0].set_xlabel("generation tokens (millions, TRL's num_tokens)")
    axes[1].set_xlabel("wall clock (s, sum of step times)")
    axes[0].set_ylabel("eval reward over every prompt (8 samples each)")
    for axis in axes:
        axis.axhline(args.threshold, color="grey", linestyle=":", linewidth=1)
        axis.grid(alpha=0.3)
        axis.legend()
    figure.suptitle(f"Main job on {args.num_prompts} prompts, {len(args.seeds)} seeds per arm (one line per seed)")
    figure.tight_layout()
    figure.savefig(args.plot, dpi=110)
    plt.close(figure)


def main(args: SkipArguments) -> None:
    common = [
        "--num_prompts", str(args.num_prompts), "--warm_start_steps", str(args.warm_start_steps),
        "--eval_strategy", "steps", "--eval_steps", str(args.eval_steps), "--per_device_eval_batch_size", "128",
    ]  # fmt: skip
    report(run_all(seed_arm_jobs(args, ARMS, common), args.jobs), args, summarise, plot)


if __name__ == "__main__":
    from trl import TrlParser

    (skip_args,) = TrlParser((SkipArguments,)).parse_args_and_config()
    main(skip_args)
