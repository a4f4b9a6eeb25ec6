"""The real-model task: arithmetic as chat prompts, in five difficulty levels, for SmolLM2-135M-Instruct.

Measured on the offline model (``examples/real_model.py``) before the task was fixed, sampling at temperature 0.7,
24 new tokens, the prompt "What is a + b? Answer with the number only." (``python examples/chat_arith_task.py``
reprints the table; 128 samples a level):

=====  ==================  ========  ========  =========================================================
level  prompt              prompts   accuracy  role in a run of a few hundred optimizer steps
=====  ==================  ========  ========  =========================================================
1      a + b, a, b < 10    100       ~0.3      the model knows it but rambles: learned, then mostly solved
2      a * b, a, b < 10    100       ~0.3      learned, partly
3      ab + c              900       ~0.1      learned a little: the edge
4      ab + cd             8,100     ~0.04     mostly out of reach (rare right answers)
5      abc + def           810,000   ~0.0      out of reach: all-wrong groups
=====  ==================  ========  ========  =========================================================

Most errors of the start are not arithmetic: a third to a half of the completions run past 24 tokens in a sentence
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

import random
import re
from dataclasses import dataclass

from datasets import Dataset
from spread_task import log_group_metrics

LAST_NUMBER = re.compile(r"-?\d+")
QUESTION = "What is {a} {op} {b}? Answer with the number only."


@dataclass(frozen=True)
class Level:
    name: str
    op: str  # "+" or "*"
    left_digits: int  # digits of each operand (no leading zero; a one-digit operand ranges over 0..9)
    right_digits: int
    share: float  # of the prompts of each split

    def operands(self, digits: int) -> range:
        return range(10 ** (digits - 1) if digits > 1 else 0, 10**digits)

    def size(self) -> int:
        """Distinct prompts of the level."""
        return len(self.operands(self.left_digits)) * len(self.operands(self.right_digits))

    def all_pairs(self) -> list[tuple[int, int]]:
        return [(a, b) for a in self.operands(self.left_digits) for b in self.operands(self.right_digits)]

    def random_pair(self, rng: random.Random) -> tuple[int, int]:
        return rng.choice(self.operands(self.left_digits)), rng.choice(self.operands(self.right_digits))

    def answer(self, a: int, b: int) -> int:
        return a + b if self.op == "+" else a * b


LEVELS = (
    Level("1", "+", 1, 1, 0.2),
    Level("2", "*", 1, 1, 0.2),
    Level("3", "+", 2, 1, 0.2),
    Level("4", "+", 2, 2, 0.2),
    Level("5", "+", 3, 3, 0.2),
)
ENUMERABLE = 10_000  # a level with at most this many distinct prompts is split by enumeration
HELD_OUT_PAIR_SHARE = 0.3  # of an enumerable level's distinct prompts, at least, reserved for the held-out split


def level_counts(n: int) -> list[int]:
    """Rows per level for a split of ``n`` rows (shares rounded, the last level takes the rest)."""
    counts = [round(n * level.share) for level in LEVELS[:-1]]
    return [*counts, n - sum(counts)]


def chat_arith_splits(num_train: int = 4000, num_eval: int = 150, seed: int = 0) -> tuple[Dataset, Dataset]:
    """``(train, held_out)`` datasets with columns ``prompt`` (a conversation of one user message, ``QUESTION``),
    ``answer`` (int) and ``level``.

    Held-out rows are distinct prompts, none of them in the train split; an enumerable level gives the held-out
    split its first ``max(n, 30%)`` shuffled prompts and the train split draws, with replacement, from the rest.
    Deterministic in ``seed``.
    """
    if num_train < len(LEVELS) or num_eval < len(LEVELS):
        raise ValueError(f"chat_arith_splits: num_train={num_train} and num_eval={num_eval} must be >= {len(LEVELS)}.")
    rng = random.Random(seed)
    train, held_out = [], []
    for level, n_train, n_eval in zip(LEVELS, level_counts(num_train), level_counts(num_eval)):
        if level.size() <= ENUMERABLE:
            pairs = level.all_pairs()
            rng.shuffle(pairs)
            cut = max(n_eval, round(len(pairs) * HELD_OUT_PAIR_SHARE))
            if cut >= len(pairs):
                raise ValueError(
                    f"chat_arith_splits: num_eval={num_eval} leaves no train prompt in level {level.name}."
                )
            held_pairs, train_pairs = pairs[:n_eval], pairs[cut:]
            train_rows = [rng.choice(train_pairs) for _ in range(n_train)]
        else:
            held_pairs, seen = [], set()
            while len(held_pairs) < n_eval:
                pair = level.random_pair(rng)
                if pair not in seen:
                    seen.add(pair)
                    held_pairs.append(pair)
            train_rows = []
            while len(train_rows) < n_train:
                pair = level.random_pair(rng)
                if pair not in seen:
                    train_rows.append(pair)
        train += [(level, a, b) for a, b in train_rows]
        held_out += [(level, a, b) for a, b in held_pairs]
    rng.shuffle(train)
    return _dataset(train), _dataset(held_out)


def _dataset(rows: list[tuple[Level, int, int]]) -> Dataset:
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


if __name__ == "__main__":  # the table of the module docstring: accuracy per level of the untrained model
    import torch
    from real_model import smollm2_folder
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(0)
    path = smollm2_folder()
    tokenizer = AutoTokenizer.from_pretrained(path, padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    reward = FinalAnswerReward(stop_token_ids(tokenizer))
    _, held_out = chat_arith_splits(num_eval=LEVELS.__len__() * 16)
    for name in [level.name for level in LEVELS]:
        rows = held_out.filter(lambda row, name=name: row["level"] == name)
        texts = [tokenizer.apply_chat_template(p, tokenize=False, add_generation_prompt=True) for p in rows["prompt"]]
        encoded = tokenizer(texts * 8, return_tensors="pt", padding=True)
        with torch.no_grad():
            out = model.generate(**encoded, max_new_tokens=24, do_sample=True, temperature=0.7, top_k=0, top_p=1.0)
        ids = []  # each completion up to and with its first EOS (pad is EOS here)
        for row in out[:, encoded.input_ids.shape[1] :].tolist():
            ids.append(row[: row.index(tokenizer.eos_token_id) + 1] if tokenizer.eos_token_id in row else row)
        completions = tokenizer.batch_decode(ids, skip_special_tokens=True)
        scores = reward(completions, ids, rows["answer"] * 8, rows["level"] * 8, texts * 8)
        print(f"level {name}: accuracy {sum(scores) / len(scores):.2f} over {len(scores)} samples")
