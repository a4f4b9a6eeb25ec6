"""Does prompt skipping lose anything now that its success rate learns that a prompt ties forever (0.2)? Each arm's
runs before that change and after it, paired by seed with base TRL's: held-out accuracy at half and at all of TRL's
run tokens (interpolated in tokens between evaluations; a run that ends sooner keeps its last evaluation), minus TRL's
final accuracy (the mean of its last two evaluations).

    python scripts/studies/stuck_prompts.py --study spread  # the spread task's records (docs/results/stuck_prompts)
    python scripts/studies/stuck_prompts.py --study real        # the real model's

The runs are made by the studies themselves, into the folders named here (a run already there is not made again): after
the change, ``python scripts/studies/time_to_accuracy.py --arms skip-rate skip-rate-prior --seeds 0 1 2 3 4 5 6 7 8 9
--runs_dir docs/results/stuck_prompts/spread_after`` (real model: ``python scripts/studies/time_to_accuracy_real.py
--arms skip-rate-prior --seeds 0 1 --runs_dir docs/results/stuck_prompts/real_after``); before it, at commit
``aadc222``, ``python -m benchmarks.time_to_accuracy --arms trl skip-rate skip-rate-prior --seeds 0 1 2 3 4 5 6 7
8 9 --runs_dir docs/results/stuck_prompts/spread_before`` (the real model's runs before it, and TRL's, are the study's
own, ``docs/results/time_to_accuracy_real/runs``). Writes ``--table`` (Markdown) and ``--plot``."""

from __future__ import annotations

import json
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path

if __package__ in (None, ""):  # run by path (python scripts/studies/<name>.py): scripts/ holds demo/ and studies/
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from studies.accuracy_at_budget import paired_gains
from studies.time_to_accuracy_metrics import accuracy_at_tokens, eval_points, run_tokens

FRACTIONS = (0.5, 1.0)  # of TRL's run tokens
STUDIES = {
    "spread": {
        "arms": ["skip-rate", "skip-rate-prior"],
        "seeds": list(range(10)),
        "trl": "docs/results/stuck_prompts/spread_before",
        "before": "docs/results/stuck_prompts/spread_before",
        "after": "docs/results/stuck_prompts/spread_after",
        "title": "Difficulty-spread task (tiny model)",
    },
    "real": {
        "arms": ["skip-rate-prior"],
        "seeds": [0, 1],
        "trl": "docs/results/time_to_accuracy_real/runs",
        "before": "docs/results/time_to_accuracy_real/runs",
        "after": "docs/results/stuck_prompts/real_after",
        "title": "SmolLM2-135M-Instruct, LoRA, chat arithmetic",
    },
}


@dataclass
class StuckPromptsArguments:
    study: str = field(default="spread", metadata={"help": f"One of {sorted(STUDIES)}."})
    table: str | None = field(default=None, metadata={"help": "Default: docs/results/stuck_prompts/<study>.md"})
    plot: str | None = field(default=None, metadata={"help": "Default: docs/results/stuck_prompts/<study>.png"})


def load(folder: str, arm: str, seed: int) -> dict:
    path = Path(folder) / f"{arm}-seed{seed}.json"
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: make it with the command in this module's docstring.")
    return json.loads(path.read_text())


def spread(values: list[float]) -> str:
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.fmean(values):+.3f} ± {sd:.3f} ({min(values):+.3f} to {max(values):+.3f})"


def table(study: dict) -> str:
    seeds = study["seeds"]
    trl = [load(study["trl"], "trl", seed) for seed in seeds]
    lines = [
        f"{study['title']}, seeds {seeds[0]} to {seeds[-1]}: held-out accuracy at a fraction of base TRL's run tokens "
        "minus TRL's final (mean ± sd over seeds, min to max); the change: the after run minus the before run of "
        "each seed.",
        "",
        "| arm | at | before (aadc222) | after | change, paired | after within the before's spread or above |",
        "|---|---|---|---|---|---|",
    ]
    for arm in study["arms"]:
        before = [load(study["before"], arm, seed) for seed in seeds]
        after = [load(study["after"], arm, seed) for seed in seeds]
        for fraction in FRACTIONS:
            old, new = paired_gains(before, trl, fraction), paired_gains(after, trl, fraction)
            change = [n - o for n, o in zip(new, old)]
            floor = statistics.fmean(old) - (statistics.stdev(old) if len(old) > 1 else 0.0)
            holds = "yes" if statistics.fmean(new) >= floor else "NO"
            lines.append(f"| {arm} | {fraction:g}x | {spread(old)} | {spread(new)} | {spread(change)} | {holds} |")
    tokens = [run_tokens(t) / 1e6 for t in trl]
    lines += ["", f"TRL's run tokens (M) by seed: {', '.join(f'{t:.3f}' for t in tokens)}."]
    return "\n".join(lines)


def plot(study: dict, path: str) -> None:
    """Held-out accuracy against generated tokens over TRL's run tokens, mean over seeds: TRL, each arm before and
    after."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    seeds = study["seeds"]
    trl = [load(study["trl"], "trl", seed) for seed in seeds]
    grid = [i / 20 for i in range(21)]
    figure, axis = plt.subplots(figsize=(7, 4.5))
    curves = [("base TRL", trl, "black", "-")]
    for arm, color in zip(study["arms"], ("tab:blue", "tab:red", "tab:green")):
        curves.append((f"{arm}, before", [load(study["before"], arm, s) for s in seeds], color, "--"))
        curves.append((f"{arm}, after", [load(study["after"], arm, s) for s in seeds], color, "-"))
    for label, records, color, style in curves:
        means = [
            statistics.fmean(accuracy_at_tokens(r, x * run_tokens(t)) for r, t in zip(records, trl)) for x in grid
        ]
        axis.plot(grid, means, style, label=label, color=color)
    start = statistics.fmean(eval_points(t)[0][1] for t in trl)
    axis.axhline(start, color="grey", lw=0.5)
    axis.set_xlabel("generated tokens / base TRL's run tokens (per seed)")
    axis.set_ylabel(f"held-out accuracy, mean of {len(seeds)} seeds")
    axis.set_title(study["title"])
    axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def main(args: StuckPromptsArguments) -> None:
    study = STUDIES[args.study]
    text = table(study)
    Path(args.table or f"docs/results/stuck_prompts/{args.study}.md").write_text(text + "\n")
    plot(study, args.plot or f"docs/results/stuck_prompts/{args.study}.png")
    print(text)


if __name__ == "__main__":
    from trl import TrlParser

    (parsed,) = TrlParser((StuckPromptsArguments,)).parse_args_and_config()
    main(parsed)
