"""Stability study: does masking stall training at high learning rates, and does zero_std_kl="keep_failed" fix it?

Arms x learning rates x seeds of the main job (examples/train_grpo.py defaults: 300 steps, 16 prompts x 8
completions, beta 0.04, dapo, warm start), changing only the learning rate and the seed:

    python benchmarks/stability.py                                   # 4 arms x 3 lrs x 5 seeds, 2 runs at a time
    python benchmarks/stability.py --seeds 0 1 2 --learning_rates 3e-3 --arms trl keep_failed

Writes one JSON per run to --runs_dir (a run already there is not run again), then docs/stability.md (the table)
and docs/stability.png (mean reward curves). Collapsed: mean reward of the last 20 steps below --collapse_below.
"""

from __future__ import annotations

import json
import multiprocessing
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))

ARMS = {  # name -> (trainer, extra flags)
    "trl": ("GRPOTrainer", []),
    "masking on": ("ZeroStdGRPOTrainer", []),
    "keep_failed": ("ZeroStdGRPOTrainer", ["--zero_std_kl", "keep_failed"]),
    "masking off": ("ZeroStdGRPOTrainer", ["--mask_zero_std_groups", "false"]),
}
FINAL_WINDOW = 20


@dataclass
class StudyArguments:
    arms: list[str] = field(default_factory=lambda: list(ARMS), metadata={"help": f"Arms among {list(ARMS)}."})
    learning_rates: list[float] = field(default_factory=lambda: [1e-3, 2e-3, 3e-3])
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2, 3, 4])
    max_steps: int = field(default=300, metadata={"help": "Steps per run (the main job's default)."})
    jobs: int = field(default=2, metadata={"help": "Runs at a time (each on one CPU thread)."})
    runs_dir: str = field(
        default="outputs/stability", metadata={"help": "One JSON per run; existing ones are reused."}
    )
    table: str = field(default="docs/stability.md")
    plot: str = field(default="docs/stability.png")
    collapse_below: float = field(default=0.4, metadata={"help": "Final reward under which a run collapsed."})


def run_one(job: tuple[str, float, int, int, str]) -> dict:
    """Train one arm at one learning rate and seed; returns (and writes) its per-step record."""
    arm, lr, seed, max_steps, path = job
    if Path(path).exists():
        return json.loads(Path(path).read_text())
    from train_cli import run, without_package_flags
    from trl import GRPOConfig, GRPOTrainer

    from trl_zerostd import ZeroStdGRPOConfig, ZeroStdGRPOTrainer

    trainer_name, flags = ARMS[arm]
    ours = trainer_name != "GRPOTrainer"
    argv = [
        "--learning_rate", str(lr), "--seed", str(seed), "--max_steps", str(max_steps), "--plot", "false",
        "--print_every", "100000", "--disable_tqdm", "true", "--output_dir", str(Path(path).with_suffix("")), *flags,
    ]  # fmt: skip
    if ours:
        trainer = run(ZeroStdGRPOTrainer, ZeroStdGRPOConfig, argv)
    else:
        trainer = run(GRPOTrainer, GRPOConfig, without_package_flags(argv))
    steps = [entry for entry in trainer.state.log_history if "reward" in entry]
    record = {
        "arm": arm,
        "learning_rate": lr,
        "seed": seed,
        "reward": [entry["reward"] for entry in steps],
        "grad_norm": [entry["grad_norm"] for entry in steps],
        "all_low_group_frac": [entry.get("zero_std/all_low_group_frac") for entry in steps],
        "stall_warning_step": warning_step(trainer.state.log_history) if ours else None,
    }
    Path(path).write_text(json.dumps(record))
    return record


def warning_step(history: list[dict]) -> int | None:
    """The step at which the trainer's stall warning fired: the default ``StallMonitor`` replayed on the logged
    metrics it observes (one generation batch and one optimizer step per logged step)."""
    from trl_zerostd.monitor import StallMonitor

    monitor = StallMonitor()
    for entry in history:
        if "reward" in entry:
            trained = entry["zero_std/untrained_step_frac"] < 1.0
            if monitor.observe_batch(entry["zero_std/all_low_group_frac"]) or monitor.observe_step(int(trained)):
                return entry["step"]
    return None


def final_reward(record: dict) -> float:
    return statistics.fmean(record["reward"][-FINAL_WINDOW:])


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
    warned = [r for r in records if r["arm"] == "masking on" and r["stall_warning_step"] is not None]
    on_runs = [r for r in records if r["arm"] == "masking on"]
    if on_runs:
        collapsed_on = [r for r in on_runs if final_reward(r) < args.collapse_below]
        caught = [r for r in collapsed_on if r["stall_warning_step"] is not None]
        lines += [
            "",
            f"Stall warning (masking on): fired in {len(warned)}/{len(on_runs)} runs, in {len(caught)}/"
            f"{len(collapsed_on)} of the runs that collapsed"
            + (
                f", at step {statistics.median(r['stall_warning_step'] for r in caught):.0f} (median)."
                if caught
                else "."
            ),
        ]
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
            axis.plot(mean, color=f"C{index}", linewidth=2, label=f"{arm} ({len(runs)} seeds)")
        axis.set_title(f"learning rate {lr:g}")
        axis.set_xlabel("step")
        axis.axhline(args.collapse_below, color="grey", linestyle=":", linewidth=1)
        axis.grid(alpha=0.3)
    (axes[0] if len(args.learning_rates) > 1 else axes).set_ylabel("reward (20-step moving average)")
    (axes[0] if len(args.learning_rates) > 1 else axes).legend(loc="lower left", fontsize=8)
    figure.tight_layout()
    figure.savefig(args.plot, dpi=110)
    plt.close(figure)


def moving(values: list[float], window: int = FINAL_WINDOW) -> list[float]:
    return [statistics.fmean(values[max(0, i - window + 1) : i + 1]) for i in range(len(values))]


def main(args: StudyArguments) -> None:
    from tqdm.auto import tqdm

    Path(args.runs_dir).mkdir(parents=True, exist_ok=True)
    jobs = [
        (arm, lr, seed, args.max_steps, f"{args.runs_dir}/{arm.replace(' ', '_')}-lr{lr:g}-seed{seed}.json")
        for lr in args.learning_rates
        for seed in args.seeds
        for arm in args.arms
    ]
    with multiprocessing.get_context("spawn").Pool(args.jobs, maxtasksperchild=1) as pool:
        records = list(tqdm(pool.imap(run_one, jobs), total=len(jobs), desc="runs"))
    table = summarise(records, args)
    Path(args.table).write_text(table + "\n")
    plot(records, args)
    print(table)


if __name__ == "__main__":
    from trl import TrlParser

    (study_args,) = TrlParser((StudyArguments,)).parse_args_and_config()
    main(study_args)
