"""Prompt skipping's predictor replayed over the prompts-come-back study's records and scored against their probes.

    python scripts/studies/predictor_replay.py --runs_dir docs/results/revisited/runs --arms trl skip-rate-kf \
        --seeds 2 3 4 --evidence_fades 0 0.5 1 2

A record with train-set probes (``train_groups``, ``revisited_prompts.py``) holds every group its run generated, step
by step (``prompt_rewards``). The replay feeds them into a fresh ``PromptSkipper`` of the run's train prompts (one
history per prompt text; with ``--level_prior``, the study's levels as its prior groups) whose success rates fade their
evidence by ``evidence_fade``. At each probe after the first (step ``s``: the policy after ``s`` updates) it asks,
before step ``s``'s groups are recorded, for each train prompt's chance of an informative group and its draw
probability, and scores them against the probe's group of that prompt (it would teach where it splits):

- **AUC**: the chance that a prompt whose probe splits is ranked above one whose probe ties (0.5: blind);
- **split in the lowest quarter**: the share of splitting probes among the quarter of prompts drawn least, the skips
  the predictor makes first (the base rate is the share of all probes that split);
- **draw probability, split / tied**: the mean draw probability of prompts whose probe splits, and ties.

The history is the run's own. Base TRL draws blind, so its records test the predictor on the groups any run could have
had; a skipping run drew what its own predictor chose (``evidence_fade`` 0 when it ran), so a later probe of a prompt
it starved has less history to be judged on. One group of 8 samples a probe: the scores carry its noise.
"""

from __future__ import annotations

import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

if __package__ in (None, ""):  # run by path (python scripts/studies/<name>.py): scripts/ holds demo/ and studies/
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from demo.held_out_eval import splits
from studies.runs import cached_records
from studies.skip_checks import group_size_of, train_levels
from trl_zerostd.sampling.skipping import PromptSkipper

MIN_DRAW_PROB = 0.05  # the setting's default, as the study runs it
REWARD_RANGE = (0.0, 1.0)  # the task's verifier: 1 right, 0 wrong
ATOL = 1e-6


@dataclass(frozen=True)
class Prediction:
    """One probe of one prompt: what the replayed predictor said before the probe's step, and what the probe gave."""

    step: int
    informative_prob: float
    draw_prob: float
    split: bool


def replay(
    record: dict, evidence_fade: float, levels: dict[str, str] | None = None, min_draw_prob: float = MIN_DRAW_PROB
) -> list[Prediction]:
    """The predictions at each probe of ``record`` after the first, prompt by prompt; ``levels``: each train prompt
    text's level, the prior's groups (None: no prior)."""
    probes = dict((step, groups) for step, groups in record["train_groups"])
    texts = sorted(next(iter(probes.values())))
    slot = {text: index for index, text in enumerate(texts)}
    group_size = group_size_of(record)
    prior_groups = None if levels is None else [levels[text] for text in texts]
    skipper = PromptSkipper.new(len(texts), min_draw_prob, group_size, prior_groups=prior_groups)
    skipper.rates.evidence_fade = evidence_fade
    every_prompt = torch.arange(len(texts))
    predictions = []
    for step, by_prompt in enumerate([*record["prompt_rewards"], {}]):  # a probe after the last step too
        if step in probes and step > 0:
            informative = skipper.rates.informative_prob(every_prompt).tolist()
            draw = skipper.draw_prob(every_prompt).tolist()
            predictions += [
                Prediction(step, informative[slot[text]], draw[slot[text]], splits(probes[step][text][:group_size]))
                for text in texts
            ]
        keys, rewards = [], []
        for text, text_rewards in by_prompt.items():
            for start in range(0, len(text_rewards), group_size):
                keys.append(slot[text])
                rewards += text_rewards[start : start + group_size]
        if keys:
            task_rewards = torch.tensor(rewards, dtype=torch.float32)
            skipper.record_batch(task_rewards, ~torch.isnan(task_rewards), keys, 0, REWARD_RANGE, ATOL)
    return predictions


def auc(scores: list[float], labels: list[bool]) -> float:
    """The chance that a positive's score is above a negative's (ties count half); NaN without both."""
    positives = [score for score, label in zip(scores, labels, strict=True) if label]
    negatives = [score for score, label in zip(scores, labels, strict=True) if not label]
    if not positives or not negatives:
        return float("nan")
    wins = sum((p > n) + 0.5 * (p == n) for p in positives for n in negatives)
    return wins / (len(positives) * len(negatives))


@dataclass(frozen=True)
class Scores:
    probes: int
    split_frac: float
    auc: float
    lowest_quarter_split_frac: float
    draw_prob_split: float
    draw_prob_tied: float


def scores(predictions: list[Prediction]) -> Scores:
    labels = [prediction.split for prediction in predictions]
    by_draw = sorted(predictions, key=lambda prediction: (prediction.draw_prob, prediction.informative_prob))
    lowest = by_draw[: max(1, len(by_draw) // 4)]
    split_draws = [prediction.draw_prob for prediction in predictions if prediction.split]
    tied_draws = [prediction.draw_prob for prediction in predictions if not prediction.split]
    return Scores(
        probes=len(predictions),
        split_frac=sum(labels) / len(labels),
        auc=auc([prediction.informative_prob for prediction in predictions], labels),
        lowest_quarter_split_frac=sum(prediction.split for prediction in lowest) / len(lowest),
        draw_prob_split=statistics.fmean(split_draws) if split_draws else float("nan"),
        draw_prob_tied=statistics.fmean(tied_draws) if tied_draws else float("nan"),
    )


@dataclass
class PredictorReplayArguments:
    runs_dir: str = field(default="docs/results/revisited/runs")
    arms: list[str] = field(default_factory=lambda: ["trl", "skip-rate-kf"])
    seeds: list[int] = field(default_factory=lambda: list(range(10)))
    evidence_fades: list[float] = field(
        default_factory=lambda: [0.0, 0.5, 1.0, 2.0],
        metadata={"help": "Values of the success rates' evidence_fade to replay (0: evidence never fades)."},
    )
    level_prior: list[bool] = field(
        default_factory=lambda: [False, True], metadata={"help": "Replay without and/or with the level prior."}
    )
    table: str | None = field(default=None, metadata={"help": "Also write the Markdown table here."})


def main(args: PredictorReplayArguments, levels_of: Callable[[int], dict[str, str]] = train_levels) -> str:
    records = [record for record in cached_records(args.runs_dir, args.arms, args.seeds) if "train_groups" in record]
    if not records:
        raise SystemExit(f"No record in {args.runs_dir} of {args.arms} x seeds {args.seeds} has train_groups.")
    runs = ", ".join(f"{record['arm']} seed {record['seed']}" for record in records)
    lines = [
        f"Replayed over {runs}.",
        "",
        "| level prior | evidence_fade | probes | split | AUC (per run) | split in the lowest quarter | "
        "draw probability: split / tied |",
        "|---|---|---|---|---|---|---|",
    ]
    for prior in args.level_prior:
        for fade in args.evidence_fades:
            per_run = [replay(record, fade, levels_of(record["seed"]) if prior else None) for record in records]
            pooled = scores([prediction for predictions in per_run for prediction in predictions])
            each = ", ".join(f"{scores(predictions).auc:.2f}" for predictions in per_run)
            lines.append(
                f"| {'yes' if prior else 'no'} | {fade:g} | {pooled.probes} | {pooled.split_frac:.2f} | "
                f"{pooled.auc:.3f} ({each}) | {pooled.lowest_quarter_split_frac:.2f} | "
                f"{pooled.draw_prob_split:.2f} / {pooled.draw_prob_tied:.2f} |"
            )
    out = "\n".join(lines)
    if args.table:
        Path(args.table).write_text(out + "\n")
    print(out)
    return out


if __name__ == "__main__":
    from transformers import HfArgumentParser

    (parsed,) = HfArgumentParser(PredictorReplayArguments).parse_args_into_dataclasses()
    main(parsed)
