"""Which difficulty levels a run trained on: per arm and seed of a time-to-accuracy study, the steps (of the run)
that trained at least one group of each level, read from each run's ``metrics.json`` (the ``level/<x>/accuracy``
metric is logged only for the levels of the step's groups). Shows what prompt skipping's level prior made of the
data: a level it drew rarely is a level it barely trained on. A second table gives, per arm and half of the run, each
level's informative share (1 - its groups' all-right and all-wrong fractions, averaged over the steps that drew it):
under an arm that draws the dataloader's prompts (trl, masking) it is what choosing by level could gain at best.

    python scripts/studies/level_mix.py                                    # the real-model study's runs
    python scripts/studies/level_mix.py --runs_dir outputs/time_to_accuracy --arms trl skip-rate-prior --prefix spread

The run folders (``<runs_dir>/<arm>-seed<n>/``) are written by the study's runs and are not kept in the repository.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class LevelMixArguments:
    runs_dir: str = field(default="docs/results/time_to_accuracy_real/runs")
    arms: list[str] = field(default_factory=lambda: ["trl", "masking", "skip-rate-prior"])
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2])
    prefix: str = field(default="level", metadata={"help": "The task's metric prefix: level (chat_arith), spread."})


def level_steps(history: list[dict], prefix: str) -> dict[str, int]:
    """Per level, the logged training steps whose batch held a group of it."""
    steps = [entry for entry in history if "loss" in entry]
    keys = {key for entry in steps for key in entry}
    names = sorted({key.split("/")[1] for key in keys if key.startswith(f"{prefix}/") and key.endswith("/accuracy")})
    return {name: sum(f"{prefix}/{name}/accuracy" in entry for entry in steps) for name in names}


def informative_by_half(history: list[dict], prefix: str) -> dict[str, tuple[float, float]]:
    """Per level, its mean informative share over the steps of the first and of the second half of the run that drew
    it (NaN where none did)."""
    steps = [entry for entry in history if "loss" in entry]
    last = max(entry["step"] for entry in steps)
    shares: dict[str, tuple[list, list]] = {}
    for entry in steps:
        for key in entry:
            if key.startswith(f"{prefix}/") and key.endswith("/accuracy"):
                name = key.split("/")[1]
                tied = entry[f"{prefix}/{name}/all_right_frac"] + entry[f"{prefix}/{name}/all_wrong_frac"]
                shares.setdefault(name, ([], []))[2 * entry["step"] > last].append(1 - tied)
    return {name: (mean(first), mean(second)) for name, (first, second) in shares.items()}


def mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def mean_text(values: list[float]) -> str:
    """The mean of the numbers that are not NaN, as text ("-" where none is)."""
    finite = [value for value in values if value == value]
    return f"{mean(finite):.2f}" if finite else "-"


def main(args: LevelMixArguments) -> None:
    rows, halves = [], {}
    for arm in args.arms:
        for seed in args.seeds:
            path = Path(args.runs_dir) / f"{arm}-seed{seed}" / "metrics.json"
            if not path.exists():
                continue
            data = json.loads(path.read_text())
            history = data["log_history"] if isinstance(data, dict) else data
            rows.append((arm, seed, level_steps(history, args.prefix), sum("loss" in e for e in history)))
            halves.setdefault(arm, []).append(informative_by_half(history, args.prefix))
    levels = sorted({name for *_, counts, _ in rows for name in counts})
    print(f"| arm | seed | steps | {' | '.join(f'level {name}' for name in levels)} |")
    print("|---|---|---|" + "---|" * len(levels))
    for arm, seed, counts, steps in rows:
        print(f"| {arm} | {seed} | {steps} | {' | '.join(str(counts.get(name, 0)) for name in levels)} |")
    print("\nInformative share of each level's groups, first half -> second half (mean over seeds):\n")
    print(f"| arm | {' | '.join(f'level {name}' for name in levels)} |")
    print("|---|" + "---|" * len(levels))
    for arm, per_seed in halves.items():
        cells = []
        for name in levels:
            pairs = [seed[name] for seed in per_seed if name in seed]
            cells.append(" -> ".join(mean_text([pair[half] for pair in pairs]) for half in (0, 1)))
        print(f"| {arm} | {' | '.join(cells)} |")


if __name__ == "__main__":
    from trl import TrlParser

    (parsed,) = TrlParser((LevelMixArguments,)).parse_args_and_config()
    main(parsed)
