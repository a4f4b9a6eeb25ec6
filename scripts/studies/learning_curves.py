"""Reward against wall clock and against generation tokens on the main job, for base TRL, masking only and dynamic
sampling (and any other arm in ARMS), over several seeds.

    python scripts/studies/learning_curves.py                                  # 3 arms x 3 seeds, 300 steps each
    python scripts/studies/learning_curves.py --arms trl dynamic --seeds 0 --max_steps 100

Every run is the main job (scripts/train_grpo.py defaults) with the arm's flags; runs are cached as JSON in
--runs_dir. The reward is that of the policy's samples: TRL's ``reward``, or under dynamic sampling (whose ``reward``
describes only the informative groups that train) the mean over every group generated. Wall clock is the sum of
TRL's logged ``step_time`` (generation, scoring and update of each step); generation tokens are TRL's
``num_tokens`` (prompt and completion tokens of every generated row, refills included).
Writes --table (Markdown) and --plot.
"""

from __future__ import annotations

import itertools
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path

if __package__ in (None, ""):  # run by path (python scripts/studies/<name>.py): scripts/ holds demo/ and studies/
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from studies.runs import final_reward, moving, policy_reward, report, run_all, seed_arm_jobs

ARMS = {
    "trl": [],
    "masking": [],
    "dynamic": ["--dynamic_sampling", "true"],
}


@dataclass
class CurveArguments:
    arms: list[str] = field(default_factory=lambda: ["trl", "masking", "dynamic"])
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2])
    learning_rate: float = field(default=1e-3, metadata={"help": "The main job's default."})
    max_steps: int = field(default=300)
    jobs: int = field(default=2)
    threshold: float = field(default=0.8, metadata={"help": "Reward (20-step moving average) to time each arm to."})
    runs_dir: str = field(default="outputs/learning_curves")
    table: str = field(default="docs/results/learning_curves/learning_curves.md")
    plot: str = field(default="docs/results/learning_curves/learning_curves.png")


def cumulative(values: list[float | None]) -> list[float]:
    return list(itertools.accumulate(value or 0.0 for value in values))


def reached(record: dict, threshold: float) -> tuple[float | None, float | None]:
    """Wall seconds and generation tokens at which the reward's moving average first reaches ``threshold``."""
    for step, value in enumerate(moving(policy_reward(record))):
        if value >= threshold:
            return cumulative(record["step_time"])[step], record["num_tokens"][step]
    return None, None


def summarise(records: list[dict], args: CurveArguments) -> str:
    lines = [
        f"| arm | final reward | wall clock (s) | generation tokens (M) | to reach {args.threshold}: wall (s) "
        "| to reach: tokens (M) | steps with a full batch of informative groups |",
        "|---|---|---|---|---|---|---|",
    ]
    for arm in args.arms:
        runs = [r for r in records if r["arm"] == arm]
        finals = [final_reward(r) for r in runs]
        times = [reached(r, args.threshold) for r in runs]
        hit = [t for t in times if t[0] is not None]
        full = (
            [sum(frac == 0.0 for frac in r["masked_group_frac"]) for r in runs]
            if runs[0]["masked_group_frac"][0] is not None
            else None
        )
        lines.append(
            f"| {arm} | {statistics.fmean(finals):.3f} ± {statistics.stdev(finals) if len(finals) > 1 else 0:.3f} "
            f"| {statistics.fmean(cumulative(r['step_time'])[-1] for r in runs):.0f} "
            f"| {statistics.fmean(r['num_tokens'][-1] for r in runs) / 1e6:.2f} "
            + (f"| {statistics.fmean(t[0] for t in hit):.0f} ({len(hit)}/{len(runs)} runs) "
               f"| {statistics.fmean(t[1] for t in hit) / 1e6:.3f} " if hit else "| not reached | not reached ")
            + (f"| {statistics.fmean(full):.0f} of {len(runs[0]['reward'])} |" if full else "| - |")
        )  # fmt: skip
    return "\n".join(lines)


def plot(records: list[dict], args: CurveArguments) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, 2, figsize=(12, 4.2), sharey=True)
    for index, arm in enumerate(args.arms):
        for run_index, record in enumerate(r for r in records if r["arm"] == arm):
            label = arm if run_index == 0 else None
            rewards = moving(policy_reward(record))
            axes[0].plot(cumulative(record["step_time"]), rewards, color=f"C{index}", alpha=0.7, label=label)
            axes[1].plot([t / 1e6 for t in record["num_tokens"]], rewards, color=f"C{index}", alpha=0.7, label=label)
    axes[0].set_xlabel("wall clock (s, sum of step times)")
    axes[1].set_xlabel("generation tokens (millions, TRL's num_tokens)")
    axes[0].set_ylabel("reward of the policy's samples (20-step moving average)")
    for axis in axes:
        axis.axhline(args.threshold, color="grey", linestyle=":", linewidth=1)
        axis.grid(alpha=0.3)
        axis.legend()
    figure.suptitle(f"Main job, {len(args.seeds)} seeds per arm (one line per seed)")
    figure.tight_layout()
    figure.savefig(args.plot, dpi=110)
    plt.close(figure)


def main(args: CurveArguments) -> None:
    report(run_all(seed_arm_jobs(args, ARMS), args.jobs), args, summarise, plot)


if __name__ == "__main__":
    from trl import TrlParser

    (curve_args,) = TrlParser((CurveArguments,)).parse_args_and_config()
    main(curve_args)
