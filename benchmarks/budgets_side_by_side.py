"""Per-prompt budgets side by side with base TRL, this package's best arms and the PyPI peer ``trl-cgrpo``: held-out
accuracy reached per generated token and per second, on the spread task (tiny model, 10 seeds) or the real model
(SmolLM2-135M-Instruct, 5 seeds for this package's arms, 2 for the peer's).

    pip install --no-deps trl-cgrpo==0.2.0        # the peer, beside TRL 1.16 (it pins trl<1.15 and runs on 1.16)
    python -m benchmarks.budgets_side_by_side --study spread
    python -m benchmarks.budgets_side_by_side --study real
    python -m benchmarks.budgets_side_by_side --study real --report_only true     # the table and figure of the runs

Every run is a run of the study it belongs to (``time_to_accuracy.py``, ``time_to_accuracy_real.py``: same task,
data, seeds, starting weights and target rule), cached where that study caches its runs, so runs already made for it
are not made again. Tokens are counted alike for every arm: the prompt and completion tokens of every sequence
generated, the peer's calibration included and its padding rows not (``runs.timing_generation``). The peer's arms:
``cgrpo-g8`` (its grid capped at TRL's group width: 2, 4, 8) and ``cgrpo`` (its default grid 2 ... 32, as many
prompts a step as TRL); its calibration set is 32 prompts taken off the train split (``peer_cgrpo.py``). On the real
model ``trl-rerun`` is base TRL made again, two runs at a time as the later arms ran: wall ratios are like for like
only between runs made under the same load.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path

from benchmarks import time_to_accuracy, time_to_accuracy_real
from benchmarks.runs import report, run_all
from benchmarks.time_to_accuracy_plot import plot
from benchmarks.time_to_accuracy_tables import summarise

PEER = ["cgrpo-g8", "cgrpo"]
STUDIES = {
    # study: (its arguments, this package's arms and seeds, the peer's arms and seeds)
    "spread": (time_to_accuracy.TimeToAccuracyArguments,
               ["trl", "keep_failed", "budgets-prior", "budgets-prior-yield", "budgets-prior-yield-kf",
                "trl-g4", "keep_failed-g4", "trl-g2"], list(range(10)), PEER, list(range(10))),
    "real": (time_to_accuracy_real.RealTimeToAccuracyArguments,
             ["trl", "keep_failed", "budgets-prior-kf", "budgets-prior-yield-kf",
              "trl-g4", "keep_failed-g4", "budgets-prior-yield-kf-g4", "trl-rerun"],
             list(range(5)), ["cgrpo-g8"], [0, 1]),
}  # fmt: skip


@dataclass
class SideBySideArguments:
    study: str = field(default="spread", metadata={"help": "'spread' (tiny model) or 'real' (SmolLM2-135M)."})
    report_only: bool = field(default=False, metadata={"help": "Report the runs already cached, run none."})
    jobs: int = field(default=2, metadata={"help": "Runs at a time."})


def study_args(study: str):
    """The study's arguments with this comparison's arms, figure and output paths."""
    arguments, ours, _, peer, _ = STUDIES[study]
    arms = [*ours, *peer]
    out = Path("docs/results") / f"budgets_{study}"
    return replace(
        arguments(), arms=arms, report_arms=arms, plot_arms=arms, seeds=STUDIES[study][2],
        table=str(out / "table.md"), plot=str(out / "curves.png"),
    )  # fmt: skip


def main(args: SideBySideArguments) -> None:
    if args.study not in STUDIES:
        raise ValueError(f"--study must be one of {list(STUDIES)}, got {args.study!r}.")
    _, ours, our_seeds, peer, peer_seeds = STUDIES[args.study]
    base = study_args(args.study)
    Path(base.table).parent.mkdir(parents=True, exist_ok=True)
    if not args.report_only:
        jobs = time_to_accuracy.jobs(replace(base, arms=ours, seeds=our_seeds))
        jobs += time_to_accuracy.jobs(replace(base, arms=peer, seeds=peer_seeds))
        jobs.sort(key=lambda job: job[3])  # seed by seed: a study stopped early has every arm on its first seeds
        run_all([job for job in jobs if not Path(job[-1]).exists()], args.jobs)
    records = [json.loads(Path(job[-1]).read_text()) for job in time_to_accuracy.jobs(base) if Path(job[-1]).exists()]
    base.arms = [arm for arm in base.arms if any(r["arm"] == arm for r in records)]
    base.plot_arms = base.arms
    report(records, base, summarise, plot)


if __name__ == "__main__":
    from trl import TrlParser

    (parsed,) = TrlParser((SideBySideArguments,)).parse_args_and_config()
    main(parsed)
