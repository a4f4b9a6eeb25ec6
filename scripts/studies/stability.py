"""Stability study: does masking stall training at high learning rates, and does zero_std_kl="keep_failed" fix it?

Arms x learning rates x seeds of the main job (scripts/train_grpo.py defaults: 300 steps, 16 prompts x 8
completions, beta 0.04, dapo, warm start), changing only the learning rate and the seed:

    python scripts/studies/stability.py                                   # 4 arms x 3 lrs x 5 seeds, 2 runs at a time
    python scripts/studies/stability.py --seeds 0 1 2 --learning_rates 3e-3 --arms trl keep_failed

Writes one JSON per run to --runs_dir (a run already there is not run again), then
docs/results/stability/stability.md (the table) and docs/results/stability/stability.png (mean reward curves).
Collapsed: mean reward of the last 20 steps below --collapse_below.
"""

from __future__ import annotations

import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path

if __package__ in (None, ""):  # run by path (python scripts/studies/<name>.py): scripts/ holds demo/ and studies/
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from studies.runs import final_reward, moving, report, run_all

ARMS = {  # name -> extra CLI flags ("trl": TRL's own GRPOTrainer)
    "trl": [],
    "masking on": [],
    "keep_failed": ["--zero_std_kl", "keep_failed"],
    "masking off": ["--mask_zero_std_groups", "false"],
}
STYLE = {"masking off": ":"}  # bit-identical to TRL: dotted, so TRL's line shows under it


@dataclass
class StudyArguments:
    arms: list[str] = field(default_factory=lambda: list(ARMS), metadata={"help": f"Arms among {list(ARMS)}."})
    learning_rates: list[float] = field(default_factory=lambda: [1e-3, 2e-3, 3e-3])
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2, 3, 4])
    max_steps: int = field(default=300, metadata={"help": "Steps per run (the main job's default)."})
    jobs: int = field(default=2, metadata={"help": "Runs at a time (each on one CPU thread)."})
    runs_dir: str = field(default="outputs/stability", metadata={"help": "One JSON per run; existing ones reused."})
    table: str = field(default="docs/results/stability/stability.md")
    plot: str = field(default="docs/results/stability/stability.png")
    collapse_below: float = field(default=0.4, metadata={"help": "Final reward under which a run collapsed."})


def warning_step(record: dict) -> int | None:
    """The step at which the trainer's stall warning fired: the default ``StallMonitor`` replayed on the logged
    metrics it observes (one generation batch and one optimizer step per logged step)."""
    from trl_zerostd.core.monitor import StallMonitor

    if record["all_low_group_frac"][0] is None:  # TRL's own trainer has no monitor
        return None
    monitor = StallMonitor()
    for step, (low, untrained) in enumerate(zip(record["all_low_group_frac"], record["untrained_step_frac"]), 1):
        if monitor.observe_batch(low) or monitor.observe_step(int(untrained < 1.0)):
            return step
    return None


def summarise(records: list[dict], args: StudyArguments) -> str:
    """The table: per arm and learning rate, collapsed runs / runs and mean final reward +- sd; then warnings."""
    header = "| arm | " + " | ".join(f"lr {lr:g}" for lr in args.learning_rates) + " |"
    lines = [header, "|---" * (len(args.learning_rates) + 1) + "|"]
    for arm in args.arms:
        cells = []
        for lr in args.learning_rates:
            finals = [final_reward(r) for r in records if r["arm"] == arm and r["learning_rate"] == lr]
            if not finals:
                cells.append("-")
                continue
            collapsed = sum(f < args.collapse_below for f in finals)
            spread = statistics.stdev(finals) if len(finals) > 1 else 0.0
            cells.append(f"{collapsed}/{len(finals)} · {statistics.fmean(finals):.2f} ± {spread:.2f}")
        lines.append(f"| {arm} | " + " | ".join(cells) + " |")
    lines.append("")
    for arm in [arm for arm in args.arms if arm != "trl"]:
        runs = [r for r in records if r["arm"] == arm]
        warned = [r for r in runs if warning_step(r) is not None]
        if not runs or not warned:
            lines.append(f"Stall warning ({arm}): fired in 0/{len(runs)} runs.")
            continue
        quiet = [final_reward(r) for r in runs if warning_step(r) is None]
        lines.append(
            f"Stall warning ({arm}): fired in {len(warned)}/{len(runs)} runs, at step "
            f"{statistics.median(warning_step(r) for r in warned):.0f} (median); final reward "
            f"{statistics.fmean(final_reward(r) for r in warned):.2f} where it fired"
            + (f", {statistics.fmean(quiet):.2f} where it did not." if quiet else ".")
        )
    return "\n".join(lines)


def plot(records: list[dict], args: StudyArguments) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, len(args.learning_rates), figsize=(5 * len(args.learning_rates), 4), sharey=True)
    for axis, lr in zip(list(axes) if len(args.learning_rates) > 1 else [axes], args.learning_rates):
        for index, arm in enumerate(args.arms):
            runs = [r["reward"] for r in records if r["arm"] == arm and r["learning_rate"] == lr]
            if not runs:
                continue
            for rewards in runs:
                axis.plot(moving(rewards), color=f"C{index}", alpha=0.15, linewidth=0.8)
            mean = [statistics.fmean(values) for values in zip(*(moving(r) for r in runs))]
            axis.plot(mean, STYLE.get(arm, "-"), color=f"C{index}", linewidth=2, label=f"{arm} ({len(runs)} seeds)")
        axis.set_title(f"learning rate {lr:g}")
        axis.set_xlabel("step")
        axis.axhline(args.collapse_below, color="grey", linestyle=":", linewidth=1)
        axis.grid(alpha=0.3)
    (axes[0] if len(args.learning_rates) > 1 else axes).set_ylabel("reward (20-step moving average)")
    (axes[0] if len(args.learning_rates) > 1 else axes).legend(loc="lower left", fontsize=8)
    figure.tight_layout()
    figure.savefig(args.plot, dpi=110)
    plt.close(figure)


def main(args: StudyArguments) -> None:
    jobs = [
        (arm, ARMS[arm], lr, seed, args.max_steps, f"{args.runs_dir}/{arm.replace(' ', '_')}-lr{lr:g}-seed{seed}.json")
        for lr in args.learning_rates
        for seed in args.seeds
        for arm in args.arms
    ]
    report(run_all(jobs, args.jobs), args, summarise, plot)


if __name__ == "__main__":
    from trl import TrlParser

    (study_args,) = TrlParser((StudyArguments,)).parse_args_and_config()
    main(study_args)
