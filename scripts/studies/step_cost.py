"""Seconds a training step takes, for arms of the real-model study run at the same time on the same machine: the
wall times of runs made in different sessions do not compare (what ran beside them, and the machine, changed), so a
wall-time claim between two arms needs their steps measured side by side.

    python scripts/studies/step_cost.py --arms trl trl-g4 --steps 3 6

Each arm trains seed 0 of the real-model study (``time_to_accuracy_real.py``: same task, flags and starting weights)
for its ``--steps`` steps, without evaluation, every arm in its own process at once (one CPU thread each, as the
study runs two at a time; ``--cpu_threads`` to change it). Give a cheaper arm more steps so that it runs for as long
as the others and every step is measured beside them. Writes TRL's ``step_time`` (generation, scoring and update)
per step to ``--table``.
"""

from __future__ import annotations

import statistics
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path

if __package__ in (None, ""):  # run by path (python scripts/studies/<name>.py): scripts/ holds demo/ and studies/
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from studies import time_to_accuracy
from studies.runs import host, optimizer_steps, run_all, train_job
from studies.time_to_accuracy_real import RealTimeToAccuracyArguments


@dataclass
class StepCostArguments:
    arms: list[str] = field(default_factory=lambda: ["trl", "trl-g4"], metadata={"help": "Arms of the real study."})
    steps: list[int] = field(default_factory=lambda: [3, 6], metadata={"help": "Steps per arm, in --arms' order."})
    table: str = field(default="docs/results/step_cost/table.md")
    cpu_threads: int = field(default=1, metadata={"help": "torch threads per process (the study's: 1)."})


def step_times(job: tuple) -> list[float]:
    """Train ``job`` (see ``runs.run_one``); its steps' ``step_time`` in seconds."""
    trainer = train_job(job)
    return [entry["step_time"] for entry in optimizer_steps(trainer.state.log_history)]


def main(args: StepCostArguments) -> None:
    if len(args.steps) != len(args.arms) or min(args.steps, default=0) < 1:
        raise ValueError(f"--steps needs one count of at least 1 per arm: arms {args.arms}, counts {args.steps}.")
    if len(set(args.arms)) != len(args.arms):
        raise ValueError(f"--arms names an arm twice: {args.arms}.")
    base = replace(RealTimeToAccuracyArguments(), seeds=[0])
    jobs = []
    for arm, steps in zip(args.arms, args.steps, strict=True):
        _, flags, lr, seed, _, _ = time_to_accuracy.jobs(replace(base, arms=[arm]))[0]
        no_eval = ["--eval_strategy", "no", "--eval_on_start", "false", "--report_to", "none"]
        threads = ["--cpu_threads", str(args.cpu_threads)]  # after the study's flags: the last one counts
        path = f"outputs/step_cost/{arm}.json"  # train_job's output_dir: this path less .json
        jobs.append((arm, [*flags, *no_eval, *threads], lr, seed, steps, path))
    times = run_all(jobs, len(jobs), worker=step_times)
    machine = host()
    command = " ".join(["python scripts/studies/step_cost.py --arms", *args.arms, "--steps", *map(str, args.steps)])
    command += f" --cpu_threads {args.cpu_threads}" if args.cpu_threads != 1 else ""
    lines = [
        f"Seconds a training step takes (TRL's step_time), seed 0 of the real study, all arms at once (`{command}`):",
        "",
        "| arm | steps | median (s) | per step (s) |",
        "|---|---|---|---|",
        *(
            f"| {arm} | {len(t)} | {statistics.median(t):.1f} | {', '.join(f'{s:.1f}' for s in t)} |"
            for arm, t in zip(args.arms, times, strict=True)
        ),
        "",
        f"CPU {machine['cpu']}; load averages over 1, 5 and 15 minutes at the end: "
        + ", ".join(f"{load:.2f}" for load in machine["load_average"]),
    ]
    Path(args.table).parent.mkdir(parents=True, exist_ok=True)
    Path(args.table).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    from trl import TrlParser

    (parsed,) = TrlParser((StepCostArguments,)).parse_args_and_config()
    main(parsed)
