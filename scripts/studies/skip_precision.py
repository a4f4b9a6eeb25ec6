"""How well prompt skipping's predictor foresees a prompt's next group: the runs of a prompt-skipping arm of
scripts/studies/time_to_accuracy.py, re-run with every generated group tallied by the predicted probability that it is
informative when its prompt was drawn (the success-rate predictor's, in bins of 0.2: a calibrated predictor's bins
hold about their own share) against whether it was.

    python scripts/studies/skip_precision.py                  # skip-rate-prior-f02, seeds 3 and 6, 2 runs at a time

Prompt skipping draws a prompt by its predicted chance of an informative group; it can only save tokens as far as
that prediction tells the two apart. Each run is the benchmark's run (same flags, evaluation included): when the
benchmark's cached record of it is in --runs_dir, the generated tokens of both are compared and the table says whether
they agree. Writes --table (Markdown). (A tally of the streak predictor's histories, a predictor since removed, is
``docs/results/skip_precision/skip_precision.md``: ``git checkout aadc222`` to rerun it.)
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import torch

if __package__ in (None, ""):  # run by path (python scripts/studies/<name>.py): scripts/ holds demo/ and studies/
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from studies.runs import run_all, timing_generation, train_job
from studies.time_to_accuracy import ARMS, TimeToAccuracyArguments, arm_flags, common_flags
from trl_zerostd.sampling.success_rate import Outcome

BINS = ("0-0.2", "0.2-0.4", "0.4-0.6", "0.6-0.8", "0.8-1")  # the predicted P(informative) when drawn


def tallying(trainer_cls):
    """``trainer_cls`` that counts, per half of the run, ``(predicted bin at draw, next group informative)`` of every
    group recorded by the skipper, in ``trainer.precision_tally`` (a prompt drawn twice in one batch, which happens
    only across the end of a pass, counts its later outcome twice)."""

    class PrecisionTallied(trainer_cls):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.precision_tally = Counter()
            skipper = self.zero_std.skipper
            record = skipper.record

            def tallied(keys, outcomes, *args, **kwargs):
                predicted = skipper.rates.informative_prob(skipper._slots(torch.tensor(keys, dtype=torch.long)))
                bins = [BINS[min(int(p * len(BINS)), len(BINS) - 1)] for p in predicted.tolist()]
                last = dict(zip(keys, outcomes.tolist()))  # a prompt's later outcome in the batch, as the history had
                half = "first half" if self.state.global_step < self.args.max_steps // 2 else "second half"
                for key, state in zip(keys, bins):
                    self.precision_tally[(half, state, last[key] == Outcome.INFORMATIVE)] += 1
                return record(keys, outcomes, *args, **kwargs)

            skipper.record = tallied

    PrecisionTallied.__name__ = trainer_cls.__name__
    return PrecisionTallied


def tally_run(job: tuple) -> dict:
    """Train ``job`` (a ``runs.run_one`` job) with the tally; return it and the run's generated tokens."""
    trainer = train_job(job, wrap=lambda cls: tallying(timing_generation(cls)))
    tokens = [entry["num_tokens"] for entry in trainer.state.log_history if "num_tokens" in entry]
    return {"seed": job[3], "tally": [[*key, n] for key, n in trainer.precision_tally.items()], "tokens": tokens[-1]}


@dataclass
class SkipPrecisionArguments:
    arm: str = field(default="skip-rate-prior-f02", metadata={"help": "A prompt-skipping arm of time_to_accuracy.py."})
    seeds: list[int] = field(default_factory=lambda: [3, 6])
    runs_dir: str = field(
        default="outputs/time_to_accuracy", metadata={"help": "The benchmark's cached runs, to compare with."}
    )
    jobs: int = field(default=2)
    table: str = field(default="docs/results/skip_precision/skip_precision_rate.md")


def summarise(results: list[dict], args: SkipPrecisionArguments) -> str:
    lines = [
        f"`{args.arm}`: each generated group by its prompt's predicted probability of an informative group when "
        "drawn; the share of them that were informative (groups).",
        "",
        "| seed | half | " + " | ".join(BINS) + " | all | same run as the benchmark's |",
        "|---" * (len(BINS) + 4) + "|",
    ]
    for result in results:
        counts = Counter({(half, state, informative): n for half, state, informative, n in result["tally"]})
        cached = Path(args.runs_dir) / f"{args.arm}-seed{result['seed']}.json"
        same = "no record"
        if cached.exists():
            same = "yes" if json.loads(cached.read_text())["num_tokens"][-1] == result["tokens"] else "NO"
        for half in ("first half", "second half"):
            cells = []
            for state in (*BINS, None):
                hits = sum(
                    n for (h, s, informative), n in counts.items() if h == half and state in (s, None) and informative
                )
                total = sum(n for (h, s, _), n in counts.items() if h == half and state in (s, None))
                cells.append(f"{hits / total:.2f} ({total})" if total else "-")
            lines.append(f"| {result['seed']} | {half} | " + " | ".join(cells) + f" | {same} |")
    return "\n".join(lines)


def main(args: SkipPrecisionArguments) -> None:
    defaults = TimeToAccuracyArguments()
    flags = arm_flags(args.arm, defaults) if args.arm in ARMS else []
    if "--skip_zero_std_prompts" not in flags:
        raise ValueError(f"--arm {args.arm!r} is not a prompt-skipping arm of time_to_accuracy.py.")
    flags = [*flags, *common_flags(defaults)]
    jobs = [
        (args.arm, flags, defaults.learning_rate, seed, defaults.max_steps, f"/tmp/skip_precision/{args.arm}-{seed}")
        for seed in args.seeds
    ]
    results = run_all(jobs, args.jobs, worker=tally_run)
    table = summarise(results, args)
    Path(args.table).write_text(table + "\n")
    print(table)


if __name__ == "__main__":
    from trl import TrlParser

    (parsed,) = TrlParser((SkipPrecisionArguments,)).parse_args_and_config()
    main(parsed)
