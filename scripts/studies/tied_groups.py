"""What the tied-group rules did in their runs (docs/studies/tied_groups.md): per run, the share of groups that trained
on their tie, the mean absolute advantage of those rows (all-right, all-wrong) against the informative rows', the
policy's mean token entropy at the start and the end, and the held-out accuracy at each evaluation.

    python scripts/studies/tied_groups.py --arms zvp-a01 zvp-a02 skip-rate-prior-cal1 --seeds 0 1

Reads the run records (``scripts/studies/runs.py``); runs nothing. Which rule pays is read from
``scripts/studies/accuracy_at_budget.py``; this table says why.
"""

from __future__ import annotations

import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path

if __package__ in (None, ""):  # run by path (python scripts/studies/<name>.py): scripts/ holds demo/ and studies/
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from studies.runs import cached_records

COLUMNS = {  # record key -> column
    "tied_trained_group_frac": "tied groups trained",
    "tied_high_adv_abs": "|A| all-right",
    "tied_low_adv_abs": "|A| all-wrong",
    "informative_adv_abs": "|A| informative",
}


@dataclass
class TiedGroupsArguments:
    runs_dir: str = field(default="docs/results/time_to_accuracy_real/runs")
    arms: list[str] = field(default_factory=lambda: ["zvp-a01", "zvp-a02", "skip-rate-prior-cal1"])
    seeds: list[int] = field(default_factory=lambda: list(range(10)))


def mean_of(values: list) -> str:
    present = [v for v in values if v is not None]
    return f"{statistics.fmean(present):.3f}" if present else ""


def entropy_span(record: dict) -> str:
    """Mean token entropy over the first and the last 5 steps that logged it."""
    present = [v for v in record.get("entropy") or [] if v is not None]
    return f"{statistics.fmean(present[:5]):.2f} -> {statistics.fmean(present[-5:]):.2f}" if present else ""


def table(args: TiedGroupsArguments) -> str:
    lines = [
        "| arm | seed | " + " | ".join(COLUMNS.values()) + " | entropy (nats) | held-out at each evaluation |",
        "|---|---|" + "---|" * (len(COLUMNS) + 2),
    ]
    for record in cached_records(args.runs_dir, args.arms, args.seeds):
        cells = [mean_of(record.get(key) or []) for key in COLUMNS]
        evals = ", ".join(f"{step}: {reward:.3f}" for step, reward in record["eval"])
        lines.append(f"| {record['arm']} | {record['seed']} | " + " | ".join(cells)
                     + f" | {entropy_span(record)} | {evals} |")  # fmt: skip
    return "\n".join(lines)


if __name__ == "__main__":
    from trl import TrlParser

    (parsed,) = TrlParser((TiedGroupsArguments,)).parse_args_and_config()
    print(table(parsed))
