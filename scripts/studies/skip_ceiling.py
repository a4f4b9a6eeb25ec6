"""How far can a skip rule see? Every training group of base TRL's runs of scripts/studies/time_to_accuracy.py (TRL
draws every prompt in turn, so its groups are an unbiased sample of what a prompt gives when drawn), scored offline by
predictors of "this group will be informative" that read only the groups of earlier batches, and by one that also reads
later ones (a ceiling for any history of the prompt's own groups).

    python scripts/studies/skip_ceiling.py                    # seeds 0-9, 2 runs at a time (about 3 minutes)

Predictors: the prompt's band (its ``--prior_key`` group's informative rate over ~10 batches: ``skip_prior_key``'s
prior); the band and the prompt's last outcome (never drawn / informative / all-wrong / all-right: what the streak
predictor, since removed, read), and the band and the number right in its last group, each as the informative rate of
its cell over ~10 batches (a calibrated lookup table); the package's ``SuccessRates`` (prompt skipping's predictor)
with the band as its groups, and the same with its evidence fading (``evidence_fade`` 1, tried); and "hindsight": the
same Beta-binomial on the prompt's groups before and after (weight halving every 30 steps away), never the group
itself. Prompts are keyed by their text.

For each: the AUC (the chance that an informative group was scored above a zero-variance one), and the informative
share of the 30% and 50% of groups it scores highest; a skip rule that generated only those would need TRL's
informative share over that one of TRL's tokens per informative group. Each run is the benchmark's run of the arm
"trl" (same flags, evaluation included): the table says whether its generated tokens equal the cached record's.
"""

from __future__ import annotations

import json
import math
import statistics
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import torch

if __package__ in (None, ""):  # run by path (python scripts/studies/<name>.py): scripts/ holds demo/ and studies/
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from studies.runs import run_all, train_job
from studies.time_to_accuracy import TimeToAccuracyArguments, common_flags
from trl_zerostd.sampling.success_rate import EVIDENCE_FADE, Outcome, SuccessRates, informative_prob

SHARES = (0.3, 0.5)  # of the groups, scored highest
CELL_DECAY = 0.9  # per batch, as the prior's
HINDSIGHT_HALF_LIFE = 30  # steps


def logging_groups(trainer_cls, prior_key: str):
    """``trainer_cls`` that keeps ``(step, prompt, prior_key value, task reward of each row)`` of every training
    group in ``trainer.group_log``."""

    class GroupsLogged(trainer_cls):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.group_log = []

        def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
            rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
            if self.model.training:
                rewards = (rewards_per_func * self.reward_weights.to(rewards_per_func.device)).nansum(dim=1).tolist()
                G = self.num_generations
                for i in range(0, len(prompts), G):
                    row = [self.state.global_step, str(prompts[i]), inputs[i][prior_key], rewards[i : i + G]]
                    self.group_log.append(row)
            return rewards_per_func

    GroupsLogged.__name__ = trainer_cls.__name__
    return GroupsLogged


def log_run(job: tuple, prior_key: str) -> dict:
    """Train ``job`` (the benchmark's "trl" run of a seed) logging its groups; cached as JSON at the job's path."""
    path = Path(job[-1])
    if path.exists():
        return json.loads(path.read_text())
    trainer = train_job(job, wrap=lambda cls: logging_groups(cls, prior_key))
    tokens = [entry["num_tokens"] for entry in trainer.state.log_history if "num_tokens" in entry]
    record = {"seed": job[3], "groups": trainer.group_log, "tokens": tokens[-1]}
    path.write_text(json.dumps(record))
    return record


def informative(rewards: list[float]) -> bool:
    return max(rewards) - min(rewards) > 1e-6


def tie_outcome(rewards: list[float]) -> Outcome:
    """A group's ``Outcome`` under a binary reward (right = 1)."""
    if informative(rewards):
        return Outcome.INFORMATIVE
    return Outcome.ALL_HIGH if min(rewards) > 0.5 else Outcome.ALL_LOW


def batches(groups: list) -> list[list]:
    by_step = defaultdict(list)
    for group in groups:
        by_step[group[0]].append(group)
    return [by_step[step] for step in sorted(by_step)]


def cell_rates(groups: list, cell) -> list[float]:
    """Per group: the decayed informative rate of its cell ``cell(prior value, last group's rewards or None)`` over
    earlier batches (a cell not seen yet: 0.5)."""
    counts, last, scores = defaultdict(lambda: [0.0, 0.0]), {}, []
    for batch in batches(groups):
        keys = [cell(value, last.get(prompt)) for _, prompt, value, _ in batch]
        scores += [counts[key][0] / counts[key][1] if counts[key][1] else 0.5 for key in keys]
        for key in counts:
            counts[key] = [CELL_DECAY * n for n in counts[key]]
        for key, (_, prompt, _, rewards) in zip(keys, batch):
            counts[key][0] += informative(rewards)
            counts[key][1] += 1
            last[prompt] = rewards
    return scores


def last_outcome(rewards: list[float] | None) -> str:
    if rewards is None:
        return "never"
    return "informative" if informative(rewards) else ("all-right" if min(rewards) > 0.5 else "all-wrong")


def success_rates(groups: list, evidence_fade: float = EVIDENCE_FADE) -> list[float]:
    """Per group: ``SuccessRates.informative_prob`` of its prompt before its batch (binary reward: right = 1)."""
    prompts = {prompt: value for _, prompt, value, _ in groups}
    slot = {prompt: i for i, prompt in enumerate(prompts)}
    G = len(groups[0][3])
    rates, scores = SuccessRates.new(G, len(slot), list(prompts.values())), []
    rates.evidence_fade = evidence_fade
    for batch in batches(groups):
        slots = torch.tensor([slot[prompt] for _, prompt, _, _ in batch])
        scores += rates.informative_prob(slots).tolist()
        successes = torch.tensor([float(sum(r)) for *_, r in batch], dtype=torch.float64)
        outcomes = torch.tensor([int(tie_outcome(r)) for *_, r in batch])
        rates.record(slots, outcomes, successes, torch.full((len(batch),), float(G), dtype=torch.float64))
    return scores


def hindsight(groups: list) -> list[float]:
    """Per group: the Beta-binomial P(informative) of its prompt from its other groups, before and after, weighted
    by ``0.5 ** (steps away / HINDSIGHT_HALF_LIFE)``, around its band's success rate over the other groups of the
    same ``HINDSIGHT_HALF_LIFE`` steps (4 rows' weight, as ``SuccessRates``)."""
    G, by_prompt, band_rows = len(groups[0][3]), defaultdict(list), defaultdict(lambda: [0.0, 0.0])
    for i, (step, prompt, value, rewards) in enumerate(groups):
        by_prompt[prompt].append((i, step, sum(rewards)))
        band_rows[(value, step // HINDSIGHT_HALF_LIFE)][0] += sum(rewards)
        band_rows[(value, step // HINDSIGHT_HALF_LIFE)][1] += G
    scores = []
    for i, (step, prompt, value, rewards) in enumerate(groups):
        right, rows = band_rows[(value, step // HINDSIGHT_HALF_LIFE)]
        right, rows = right - sum(rewards), rows - G
        rate = min(max(right / rows if rows else 0.5, 0.01), 0.99)
        weights = [
            (0.5 ** (abs(other - step) / HINDSIGHT_HALF_LIFE), k) for j, other, k in by_prompt[prompt] if j != i
        ]
        successes = sum(w * k for w, k in weights)
        failures = sum(w * (G - k) for w, k in weights)
        a, b = torch.tensor([4 * rate + successes]), torch.tensor([4 * (1 - rate) + failures])
        scores.append(float(informative_prob(a, b, G)))
    return scores


PREDICTORS = {
    "band": lambda groups: cell_rates(groups, lambda value, last: value),
    "band + last outcome": lambda groups: cell_rates(groups, lambda value, last: (value, last_outcome(last))),
    "band + last number right": lambda groups: cell_rates(
        groups, lambda value, last: (value, None if last is None else round(sum(last)))
    ),
    "success rate (prompt skipping's)": success_rates,
    "success rate, its evidence fading (evidence_fade 1)": partial(success_rates, evidence_fade=1.0),
    "hindsight (sees later groups)": hindsight,
}


def auc(scores: list[float], labels: list[bool]) -> float:
    """Mann-Whitney: the chance that a random informative group scores above a random zero-variance one (ties
    half)."""
    order = sorted(range(len(scores)), key=scores.__getitem__)
    ranks, i = [0.0] * len(scores), 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and scores[order[j + 1]] == scores[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    positives = sum(labels)
    negatives = len(labels) - positives
    rank_sum = sum(rank for rank, label in zip(ranks, labels) if label)
    return (rank_sum - positives * (positives + 1) / 2) / (positives * negatives)


def top_share(scores: list[float], labels: list[bool], share: float) -> float:
    """Informative share of the ``share`` of groups scored highest (ties broken by draw order)."""
    order = sorted(range(len(scores)), key=lambda i: -scores[i])[: math.ceil(share * len(scores))]
    return statistics.fmean(labels[i] for i in order)


@dataclass
class SkipCeilingArguments:
    seeds: list[int] = field(default_factory=lambda: list(range(10)))
    prior_key: str = field(default="band", metadata={"help": "The dataset column the band-keyed predictors read."})
    runs_dir: str = field(default="outputs/skip_ceiling")
    cached_runs_dir: str = field(
        default="outputs/time_to_accuracy", metadata={"help": "The benchmark's cached runs, to compare with."}
    )
    jobs: int = field(default=2)
    table: str = field(default="docs/results/skip_ceiling/skip_ceiling.md")


def summarise(records: list[dict], args: SkipCeilingArguments) -> str:
    rows = defaultdict(list)  # predictor -> per seed [AUC, top share for each of SHARES]
    bases, same = [], []
    for record in records:
        groups = record["groups"]
        scored = [i for i, group in enumerate(groups) if group[0] > 0]  # after the 1st batch: every predictor has data
        labels = [informative(groups[i][3]) for i in scored]
        bases.append(statistics.fmean(labels))
        for name, predictor in PREDICTORS.items():
            all_scores = predictor(groups)
            scores = [all_scores[i] for i in scored]
            rows[name].append([auc(scores, labels), *(top_share(scores, labels, share) for share in SHARES)])
        cached = Path(args.cached_runs_dir) / f"trl-seed{record['seed']}.json"
        if not cached.exists():
            same.append("no record")
        else:
            same.append("yes" if json.loads(cached.read_text())["num_tokens"][-1] == record["tokens"] else "NO")
    base = statistics.fmean(bases)
    header = " | ".join(f"top {share:.0%}: informative, TRL's share / it" for share in SHARES)
    lines = [
        f"Base TRL, seeds {args.seeds} (same runs as the benchmark's: {', '.join(same)}); every training group after "
        f"the first batch; informative share of all of them: {base:.3f} (mean over seeds).",
        "",
        f"| predictor | AUC | {header} |",
        "|---" * (2 + len(SHARES)) + "|",
    ]
    for name, per_seed in rows.items():
        means = [statistics.fmean(column) for column in zip(*per_seed)]
        ratios = [statistics.fmean(b / seed[1 + k] for b, seed in zip(bases, per_seed)) for k in range(len(SHARES))]
        cells = " | ".join(f"{means[1 + k]:.3f}, {ratios[k]:.2f}x" for k in range(len(SHARES)))
        lines.append(f"| {name} | {means[0]:.3f} | {cells} |")
    return "\n".join(lines)


def main(args: SkipCeilingArguments) -> None:
    defaults = TimeToAccuracyArguments()
    flags = common_flags(defaults)
    jobs = [
        ("trl", flags, defaults.learning_rate, seed, defaults.max_steps, f"{args.runs_dir}/trl-groups-seed{seed}.json")
        for seed in args.seeds
    ]
    table = summarise(run_all(jobs, args.jobs, worker=partial(log_run, prior_key=args.prior_key)), args)
    Path(args.table).write_text(table + "\n")
    print(table)


if __name__ == "__main__":
    from trl import TrlParser

    (parsed,) = TrlParser((SkipCeilingArguments,)).parse_args_and_config()
    main(parsed)
