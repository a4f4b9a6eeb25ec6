"""Held-out accuracy at a token budget against base TRL's final, paired by seed: the measure a performance claim is
read by. For each arm and seed, the held-out accuracy after a fraction of base TRL's run tokens on that seed
(interpolated in tokens between evaluations; a run that ends sooner keeps its last evaluation) minus TRL's final
accuracy (the mean of its last two evaluations); per arm, the mean, sd and one-sided 90% lower bound (Student's t) of
those paired differences. With ``--against ARM`` the difference is against that arm's accuracy after the same
number of tokens instead: which of two arms is ahead at each budget.

    python scripts/studies/accuracy_at_budget.py                    # the real-model study's arms, from their records
    python scripts/studies/accuracy_at_budget.py --runs_dir DIR --arms trl keep_failed --seeds 0 1 2 --table out.md
    python scripts/studies/accuracy_at_budget.py --tokens generated_tokens completion_tokens prompt_once_tokens
    python scripts/studies/accuracy_at_budget.py --arms zvp-a02 --against keep_failed    # which of two arms is ahead

Tokens are counted three ways (``--tokens``, one table each): every generated sequence's prompt and completion
tokens (``generated_tokens``, TRL's ``num_tokens``), completion tokens alone, and completions plus each prompt once per
group (``prompt_once_tokens``: what an engine that caches prefixes prefills). A seed whose records predate a count is
left out of that table.

Reads the run records the studies write (``scripts/studies/runs.py``); runs nothing.
"""

from __future__ import annotations

import functools
import json
import math
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path

if __package__ in (None, ""):  # run by path (python scripts/studies/<name>.py): scripts/ holds demo/ and studies/
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from studies.time_to_accuracy_metrics import accuracy_at_tokens, final_reward, run_tokens

# One-sided 90% quantiles of Student's t by degrees of freedom (1 to 20); the normal's beyond
T90 = (3.078, 1.886, 1.638, 1.533, 1.476, 1.440, 1.415, 1.397, 1.383, 1.372,
       1.363, 1.356, 1.350, 1.345, 1.341, 1.337, 1.333, 1.330, 1.328, 1.325)  # fmt: skip
NORMAL_90 = 1.2816
LABELS = {
    "trl": "base TRL",
    "keep_failed": '`zero_std_kl="keep_failed"`',
    "zvp-a02": "`tied_group_entropy_scale=0.2`",
    "skip-rate-prior": "prompt skipping, level prior",
    "dynamic": "dynamic sampling",
    "skip-rate-prior-f02-mu2-x2-lr05": "skipping, `num_iterations=2`, 2x steps, half the rate",
    "keep_failed-g4": "`keep_failed`, `num_generations=4`",
    "cgrpo-g8": "the peer `trl-cgrpo`, grid 2, 4, 8",
    "skip-rate-kf": "prompt skipping over `keep_failed`",
    "skip-rate-prior-kf": "prompt skipping over `keep_failed`, level prior",
    "skip-fade-kf": "prompt skipping over `keep_failed`, evidence fading",
    "skip-fade-prior-kf": "prompt skipping over `keep_failed`, level prior, evidence fading",
}
README_ARMS = ["trl", "keep_failed", "zvp-a02", "skip-rate-prior", "dynamic", "keep_failed-g4"]
TOKEN_LABELS = {
    "generated_tokens": "tokens as TRL counts them (prompt and completion of every row)",
    "completion_tokens": "completion tokens only",
    "prompt_once_tokens": "completions plus each prompt once per group",
}


@dataclass
class AccuracyAtBudgetArguments:
    runs_dir: str = field(default="docs/results/time_to_accuracy_real/runs")
    arms: list[str] = field(
        default_factory=lambda: list(README_ARMS), metadata={"help": "Default: the README's table."}
    )
    seeds: list[int] = field(default_factory=lambda: list(range(10)))
    fractions: list[float] = field(default_factory=lambda: [1 / 3, 0.5, 1.0], metadata={"help": "Of TRL's tokens."})
    tokens: list[str] = field(
        default_factory=lambda: ["generated_tokens"], metadata={"help": f"Token counts, of {list(TOKEN_LABELS)}."}
    )
    against: str | None = field(
        default=None,
        metadata={
            "help": "Pair each arm with this one instead of TRL's final: their accuracies after the same tokens."
        },
    )
    table: str | None = field(default=None, metadata={"help": "Where to write the Markdown table (default: print)."})


def lower_bound(values: list[float]) -> float:
    """One-sided 90% lower confidence bound of the mean of ``values`` (Student's t; NaN for one value)."""
    if len(values) < 2:
        return math.nan
    t = T90[len(values) - 2] if len(values) - 1 <= len(T90) else NORMAL_90
    return statistics.fmean(values) - t * statistics.stdev(values) / math.sqrt(len(values))


def paired_gains(
    records: list[dict], trl: list[dict], fraction: float, others: list[dict] | None = None
) -> list[float]:
    """Per seed (every list in seed order): held-out accuracy at ``fraction`` of TRL's run tokens minus TRL's final
    accuracy, or, given ``others`` (another arm's records), minus that arm's accuracy at the same tokens."""
    budgets = [fraction * run_tokens(t) for t in trl]
    if others is None:
        references = [final_reward(t) for t in trl]
    else:
        references = [accuracy_at_tokens(o, budget) for o, budget in zip(others, budgets)]
    return [accuracy_at_tokens(r, budget) - ref for r, budget, ref in zip(records, budgets, references)]


def summary(values: list[float]) -> str:
    """``mean ± sd (lower bound)`` of paired differences, as the tables print them; one seed's difference alone."""
    if not values:
        return ""
    if len(values) == 1:
        return f"{values[0]:+.3f}"
    return f"{statistics.fmean(values):+.3f} ± {statistics.stdev(values):.3f} ({lower_bound(values):+.3f})"


def fraction_label(fraction: float) -> str:
    return {1 / 3: "a third", 0.5: "half", 1.0: "all"}.get(fraction, f"{fraction:g}x")


def counted_by(record: dict | None, tokens: str) -> dict | None:
    """``record`` with its token count read as ``tokens`` (None: the record lacks that count)."""
    if record is None or tokens == "generated_tokens":
        return record
    return {**record, "generated_tokens": record[tokens]} if record.get(tokens) else None


def table(args: AccuracyAtBudgetArguments, tokens: str = "generated_tokens") -> str:
    """One row per arm, over the seeds where it, TRL and ``--against`` have records: its paired differences at each
    fraction, in ``tokens``."""
    folder = Path(args.runs_dir)

    @functools.cache
    def record(arm: str, seed: int) -> dict | None:
        path = folder / f"{arm}-seed{seed}.json"
        return counted_by(json.loads(path.read_text()), tokens) if path.exists() else None

    header = " | ".join(f"at {fraction_label(f)} of TRL's tokens" for f in args.fractions)
    minus = f"{LABELS.get(args.against, args.against)}'s at the same tokens" if args.against else "base TRL's final"
    lines = [
        f"Held-out accuracy minus {minus}, paired by seed: mean ± sd (one-sided 90% lower bound); "
        f"{TOKEN_LABELS.get(tokens, tokens)}. Records: `{args.runs_dir}`.",
        "",
        f"| arm (seeds) | {header} |",
        "|---|" + "---|" * len(args.fractions),
    ]
    needed = ["trl", *([args.against] if args.against else [])]
    for arm in (arm for arm in args.arms if arm != args.against):
        seeds = [s for s in args.seeds if all(record(name, s) is not None for name in (arm, *needed))]
        if not seeds:
            continue
        runs, baselines = [record(arm, s) for s in seeds], [record("trl", s) for s in seeds]
        others = [record(args.against, s) for s in seeds] if args.against else None
        cells = [summary(paired_gains(runs, baselines, f, others)) for f in args.fractions]  # type: ignore[arg-type]
        named = ", ".join(str(s) for s in seeds)
        lines.append(f"| {LABELS.get(arm, arm)} ({named}) | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(args: AccuracyAtBudgetArguments) -> None:
    text = "\n\n".join(table(args, tokens) for tokens in args.tokens)
    if args.table:
        Path(args.table).write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    from trl import TrlParser

    (parsed,) = TrlParser((AccuracyAtBudgetArguments,)).parse_args_and_config()
    main(parsed)
