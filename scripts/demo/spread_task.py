"""A task shaped like real RL data: sums in three difficulty bands, with a held-out split never trained on.

Real math sets (DeepMath, DAPO-Math, GSM8K) hold, for a given model, prompts it always solves, prompts it learns to
solve during the run, and prompts it cannot solve for a long time. The bands here play those roles for the tiny
local model (``tiny_model.py``) after its warm start (``addition_task.warm_start`` on the train split):

=======  ====================  ==================  ============================================================
band     prompt                share of prompts    role after the warm start
=======  ====================  ==================  ============================================================
easy     ``a+b=``, a,b < 10    25%                 mostly solved: many all-correct groups
medium   ``ab+c=``, 2 + 1 dig  40%                 partly solved: the signal, learnable within the run
hard     ``abc+def=``, 3 + 3   35%                 out of reach within the run: all-wrong groups
=======  ====================  ==================  ============================================================

How far the warm start gets depends on its seed: in some seeds it already solves part of the hard band
(``scripts/studies/time_to_accuracy.py`` reports the bands per seed).

The held-out split is disjoint from the train split by prompt text in every band (the 100 easy and 900 medium
prompts are split before drawing; the hard band has 810,000). The reward is ``banded_sum_reward``:
``addition_task.correct_sum_reward`` against the ``answer`` column, which also logs per band, through TRL's metric
store, the accuracy and the share of all-wrong and all-correct groups (the ``band`` column names each row's band).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from itertools import groupby

from datasets import Dataset

from demo.addition_task import correct_sum_reward


@dataclass(frozen=True)
class Band:
    name: str
    left_digits: int  # digits of the first operand (no leading zero, except the one-digit band's 0)
    right_digits: int
    share: float  # of the prompts of each split
    op: str = "+"  # "+" or "*"

    def operands(self, digits: int) -> range:
        return range(10 ** (digits - 1) if digits > 1 else 0, 10**digits)

    def size(self) -> int:
        """Distinct prompts of the band."""
        return len(self.operands(self.left_digits)) * len(self.operands(self.right_digits))

    def all_pairs(self) -> list[tuple[int, int]]:
        return [(a, b) for a in self.operands(self.left_digits) for b in self.operands(self.right_digits)]

    def random_pair(self, rng: random.Random) -> tuple[int, int]:
        left, right = self.operands(self.left_digits), self.operands(self.right_digits)
        return rng.choice(left), rng.choice(right)

    def answer(self, a: int, b: int) -> int:
        return a + b if self.op == "+" else a * b


BANDS = (Band("easy", 1, 1, 0.25), Band("medium", 2, 1, 0.40), Band("hard", 3, 3, 0.35))
CHAT_QUESTION = "What is {a} + {b}? Answer with the number only."  # an instruct model's prompt (user turn)
HELD_OUT_PAIR_SHARE = 0.2  # of the enumerable bands' distinct prompts, reserved for the held-out split
ENUMERABLE = 10_000  # a band with at most this many distinct prompts is split by enumeration


def band_counts(n: int, bands: tuple[Band, ...] = BANDS) -> list[int]:
    """Rows per band for a split of ``n`` rows (shares rounded, the last band takes the rest)."""
    counts = [round(n * band.share) for band in bands[:-1]]
    return [*counts, n - sum(counts)]


def spread_splits(
    num_train: int = 2000, num_eval: int = 200, seed: int = 0, chat: bool = False
) -> tuple[Dataset, Dataset]:
    """``(train, held_out)`` datasets with columns ``prompt`` ("a+b="; with ``chat``, a conversation of one user
    message, ``CHAT_QUESTION``), ``answer`` (int) and ``band``: ``split_pairs`` over ``BANDS``."""
    train, held_out = split_pairs(BANDS, num_train, num_eval, seed, HELD_OUT_PAIR_SHARE, "spread_splits")
    return _dataset(train, chat), _dataset(held_out, chat)


def split_pairs(
    bands: tuple[Band, ...], num_train: int, num_eval: int, seed: int, held_out_share: float, caller: str
) -> tuple[list[tuple[Band, int, int]], list[tuple[Band, int, int]]]:
    """``(train, held_out)`` rows ``(band, a, b)``, ``band_counts`` of each split per band.

    Held-out rows are distinct prompts, none of them in the train split: a band of at most ``ENUMERABLE`` prompts
    gives the held-out split its first of ``max(n, held_out_share)`` shuffled prompts and the train split draws,
    with replacement, from the rest (a prompt can repeat, as in real sets with duplicates); a larger band is drawn
    at random without the held-out prompts. Train rows are shuffled. Deterministic in ``seed``; ``caller`` names
    the task in errors.
    """
    if num_train < len(bands) or num_eval < len(bands):
        raise ValueError(f"{caller}: num_train={num_train} and num_eval={num_eval} must be >= {len(bands)}.")
    rng = random.Random(seed)
    train, held_out = [], []
    for band, n_train, n_eval in zip(bands, band_counts(num_train, bands), band_counts(num_eval, bands)):
        if band.size() <= ENUMERABLE:
            pairs = band.all_pairs()
            rng.shuffle(pairs)
            cut = max(n_eval, round(len(pairs) * held_out_share)) if n_eval else 0
            if cut >= len(pairs):
                raise ValueError(f"{caller}: num_eval={num_eval} leaves no train prompt in band {band.name!r}.")
            held_pairs, train_pairs = pairs[:n_eval], pairs[cut:]
            train_rows = [rng.choice(train_pairs) for _ in range(n_train)]
        else:
            held_pairs, seen = [], set()
            while len(held_pairs) < n_eval:
                pair = band.random_pair(rng)
                if pair not in seen:
                    seen.add(pair)
                    held_pairs.append(pair)
            train_rows = []
            while len(train_rows) < n_train:
                pair = band.random_pair(rng)
                if pair not in seen:
                    train_rows.append(pair)
        train += [(band, a, b) for a, b in train_rows]
        held_out += [(band, a, b) for a, b in held_pairs]
    rng.shuffle(train)
    return train, held_out


def _dataset(rows: list[tuple[Band, int, int]], chat: bool) -> Dataset:
    def prompt(a: int, b: int):
        return [{"role": "user", "content": CHAT_QUESTION.format(a=a, b=b)}] if chat else f"{a}+{b}="

    return Dataset.from_dict(
        {
            "prompt": [prompt(a, b) for _, a, b in rows],
            "answer": [band.answer(a, b) for band, a, b in rows],
            "band": [band.name for band, _, _ in rows],
        }
    )


def banded_sum_reward(completions, prompts, answer, band, log_metric=None, **kwargs) -> list[float]:
    """``correct_sum_reward``, and per band and in all (``log_metric``, TRL >= 1.16; train and eval apart):
    ``spread/<band>/accuracy``, ``spread/<band>/all_wrong_frac`` and ``spread/<band>/all_right_frac`` (of the band's
    groups), ``spread/all_wrong_group_frac`` and ``spread/all_right_group_frac`` (of every group).

    ``log_group_metrics`` says what a group is.
    """
    rewards = correct_sum_reward(completions, prompts, answer=answer)
    if log_metric is not None:
        log_group_metrics(log_metric, "spread", prompts, rewards, band)
    return rewards


def log_group_metrics(log_metric, prefix: str, prompts: list, rewards: list[float], labels: list[str]) -> None:
    """Per label and in all, through ``log_metric``: ``<prefix>/<label>/accuracy``, ``<prefix>/<label>/all_wrong_frac``
    and ``<prefix>/<label>/all_right_frac`` (of the label's groups), ``<prefix>/all_wrong_group_frac`` and
    ``<prefix>/all_right_group_frac`` (of every group); a reward is 0 or 1.

    A group is a run of consecutive rows with one prompt (TRL's layout in one process; under data parallelism a
    group split over ranks counts on each rank). A metric of a label absent from the batch is not logged for it.
    """
    groups = []  # (label, rewards) of each run of consecutive rows with one prompt
    for _, run in groupby(range(len(prompts)), key=prompts.__getitem__):
        rows = list(run)
        groups.append((labels[rows[0]], [rewards[i] for i in rows]))
    for name in sorted(set(labels)):
        in_label = [group for group_label, group in groups if group_label == name]
        log_metric(f"{prefix}/{name}/accuracy", sum(map(sum, in_label)) / sum(map(len, in_label)))
        log_metric(f"{prefix}/{name}/all_wrong_frac", sum(max(g) == 0 for g in in_label) / len(in_label))
        log_metric(f"{prefix}/{name}/all_right_frac", sum(min(g) == 1 for g in in_label) / len(in_label))
    log_metric(f"{prefix}/all_wrong_group_frac", sum(max(g) == 0 for _, g in groups) / len(groups))
    log_metric(f"{prefix}/all_right_group_frac", sum(min(g) == 1 for _, g in groups) / len(groups))
