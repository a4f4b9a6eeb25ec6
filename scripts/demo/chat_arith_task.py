"""The real-model task: arithmetic as chat prompts, in six difficulty levels, for SmolLM2-135M-Instruct.

Chosen from what the offline model (``scripts/demo/real_model.py``) does before training, sampling at temperature 0.7
with the prompt "What is a + b? Answer with the number only." (``scripts/studies/real_task_levels.py``); the accuracies
are the mean of base TRL's 3 seeds in ``docs/studies/real_model.md`` (``make train-real``'s config):

=====  ==================  ========  =====  ============================================================
level  prompt              prompts   share  base TRL's held-out accuracy in a run (start -> step 40)
=====  ==================  ========  =====  ============================================================
1      a + b, a, b < 10    100       15%    0.31 -> 0.91: known but rambled about, then mostly solved
2      a * b, a, b < 10    100       15%    0.24 -> 0.86
3      ab + c              900       20%    0.08 -> 0.64: learned
4      ab + cd             8,100     20%    0.06 -> 0.59: learned, partly
5      abc + def           810,000   15%    0.00 -> 0.17: learned a little
6      abc * def           810,000   15%    0.00 -> 0.00: out of reach, all-wrong groups throughout
=====  ==================  ========  =====  ============================================================

Most errors of the start are not arithmetic: half or more of the completions run past 16 tokens in a sentence
(a truncated completion has no final answer, and gets reward 0: the model learns to answer briefly, as a real run
learns its output format), and the rest often restate the question with a wrong sum. Every level has many groups of
G that are all wrong, and the hard levels almost only those: the zero-variance groups this package is for.

The reward (``FinalAnswerReward``) is 1.0 where a completion ended (its last token is a stop token) and the last
integer of its text is the answer, else 0.0; it logs per level, through TRL's metric store, the accuracy and the
share of all-wrong and all-right groups, as ``spread_task.banded_sum_reward`` does per band.

The held-out split is disjoint from the train split by prompt text in every level (the enumerable levels are
split before drawing; the others are drawn without the held-out prompts). Both splits have a ``level`` column, the
key a prior by difficulty (``skip_prior_key``) reads, as DeepMath's ``difficulty``.
"""

from __future__ import annotations

import re

from datasets import Dataset

from demo.spread_task import Band, band_counts, log_group_metrics, split_pairs

LAST_NUMBER = re.compile(r"-?\d+")
QUESTION = "What is {a} {op} {b}? Answer with the number only."
LEVELS = (
    Band("1", 1, 1, 0.15),
    Band("2", 1, 1, 0.15, op="*"),
    Band("3", 2, 1, 0.2),
    Band("4", 2, 2, 0.2),
    Band("5", 3, 3, 0.15),
    Band("6", 3, 3, 0.15, op="*"),
)
HELD_OUT_PAIR_SHARE = 0.3  # of an enumerable level's distinct prompts, at least, reserved for the held-out split


def level_counts(n: int) -> list[int]:
    """Rows per level for a split of ``n`` rows."""
    return band_counts(n, LEVELS)


def chat_arith_splits(num_train: int = 4000, num_eval: int = 150, seed: int = 0) -> tuple[Dataset, Dataset]:
    """``(train, held_out)`` datasets with columns ``prompt`` (a conversation of one user message, ``QUESTION``),
    ``answer`` (int) and ``level``: ``spread_task.split_pairs`` over ``LEVELS`` (held-out prompts distinct and
    never in the train split; deterministic in ``seed``)."""
    train, held_out = split_pairs(LEVELS, num_train, num_eval, seed, HELD_OUT_PAIR_SHARE, "chat_arith_splits")
    return _dataset(train), _dataset(held_out)


def _dataset(rows: list[tuple[Band, int, int]]) -> Dataset:
    return Dataset.from_dict(
        {
            "prompt": [[{"role": "user", "content": QUESTION.format(a=a, op=lv.op, b=b)}] for lv, a, b in rows],
            "answer": [lv.answer(a, b) for lv, a, b in rows],
            "level": [lv.name for lv, _, _ in rows],
        }
    )


def final_answer(text: str) -> int | None:
    """The last integer of ``text``, or None."""
    numbers = LAST_NUMBER.findall(text)
    return int(numbers[-1]) if numbers else None


class FinalAnswerReward:
    """1.0 where the completion ended with one of ``stop_token_ids`` and the last integer of its text is the
    ``answer`` column's, else 0.0; logs per level (``log_metric``: ``level/<name>/accuracy``, ``.../all_wrong_frac``,
    ``.../all_right_frac``, ``level/all_wrong_group_frac``, ``level/all_right_group_frac``).

    A truncated completion (no stop token: it ran to ``max_completion_length``) has no final answer and gets 0, so
    that answering briefly is learned, as it is needed at evaluation; it is not masked out of training.
    """

    __name__ = "final_answer_reward"  # TRL names a reward function by its __name__

    def __init__(self, stop_token_ids: list[int]):
        if not stop_token_ids:
            raise ValueError("FinalAnswerReward needs the tokenizer's stop token ids (its EOS), none were given.")
        self.stop_token_ids = frozenset(stop_token_ids)

    def __call__(self, completions, completion_ids, answer, level, prompts, log_metric=None, **kwargs) -> list[float]:
        rewards = []
        for completion, ids, expected in zip(completions, completion_ids, answer, strict=True):
            ended = len(ids) > 0 and int(ids[-1]) in self.stop_token_ids
            text = completion if isinstance(completion, str) else completion[-1]["content"]
            rewards.append(float(ended and final_answer(text) == int(expected)))
        if log_metric is not None:
            log_group_metrics(log_metric, "level", prompts, rewards, level)
        return rewards


def stop_token_ids(tokenizer) -> list[int]:
    """The token ids that end a completion, as TRL's trainers read them: the EOS (a list in some configs)."""
    eos = tokenizer.eos_token_id
    return list(eos) if isinstance(eos, list | tuple) else [eos]
