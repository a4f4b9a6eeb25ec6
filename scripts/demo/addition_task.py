"""The embedded default task: single-digit addition with a binary verifier reward.

A prompt is ``"a+b="`` with ``a, b`` in 0..9 and the completion should be the sum, e.g. ``"3+4="`` -> ``"7"``.
``warm_start`` teaches the tiny model (``tiny.py``) part of the table by a short supervised pass, so that at the
start of RL some prompts are always solved and some never (zero-variance groups, masked by this package) while
the rest give a learning signal.
"""

from __future__ import annotations

import random
import re

import torch
from datasets import Dataset

FIRST_NUMBER = re.compile(r"-?\d+")
SUM_PROMPT = re.compile(r"\s*(\d+)\s*\+\s*(\d+)\s*=\s*")


def _text(message) -> str:
    """The text of a standard (``str``) or conversational (list of messages, last one read) prompt/completion."""
    return message if isinstance(message, str) else message[-1]["content"]


def expected_sum(prompt) -> int:
    """The sum that ``prompt`` ``"a+b="`` asks for."""
    match = SUM_PROMPT.fullmatch(_text(prompt))
    if match is None:
        raise ValueError(f"Prompt {_text(prompt)!r} is not 'a+b=' and the dataset has no 'answer' column.")
    return int(match[1]) + int(match[2])


def correct_sum_reward(completions, prompts, answer=None, **kwargs) -> list[float]:
    """1.0 where the first integer of the completion equals the answer, else 0.0 (no number: 0.0; never None).

    The answer is the dataset's ``answer`` column where there is one (TRL passes extra columns as keyword
    arguments), else the sum asked for by the prompt ``"a+b="``.
    """
    if answer is None:
        answer = [expected_sum(prompt) for prompt in prompts]
    rewards = []
    for completion, expected in zip(completions, answer, strict=True):
        found = FIRST_NUMBER.search(_text(completion))
        rewards.append(float(found is not None and int(found.group()) == int(expected)))
    return rewards


def addition_dataset(n: int, seed: int = 0) -> Dataset:
    """``n`` random prompts ``"a+b="`` (``a, b`` in 0..9, with replacement): columns "prompt" and "answer" (int)."""
    rng = random.Random(seed)
    pairs = [(rng.randrange(10), rng.randrange(10)) for _ in range(n)]
    return Dataset.from_dict({"prompt": [f"{a}+{b}=" for a, b in pairs], "answer": [a + b for a, b in pairs]})


def warm_start(
    model,
    tokenizer,
    dataset: Dataset,
    steps: int = 150,
    batch_size: int = 64,
    learning_rate: float = 3e-3,
    seed: int = 0,
):
    """Supervised pass on ``prompt + str(answer) + eos`` (loss on the answer and EOS only); returns ``model``, in eval
    mode.

    Plain AdamW, constant learning rate, batches of ``batch_size`` rows drawn with replacement. ``steps`` is the knob
    for how much of the table the model learns (0 leaves it untouched): with the defaults the tiny model (``tiny.py``)
    gets about half its sums right when sampled at temperature 1 (greedy: about 0.6-0.7).
    """
    if steps <= 0:
        return model.eval()
    prompt_ids = [tokenizer(p, add_special_tokens=False).input_ids for p in dataset["prompt"]]
    answer_ids = [
        tokenizer(str(a), add_special_tokens=False).input_ids + [tokenizer.eos_token_id] for a in dataset["answer"]
    ]
    device = next(model.parameters()).device
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate)
    model.train()
    for _ in range(steps):
        rows = torch.randint(len(prompt_ids), (batch_size,), generator=generator).tolist()
        input_ids, labels = _padded_batch([prompt_ids[i] for i in rows], [answer_ids[i] for i in rows], tokenizer)
        loss = model(
            input_ids=input_ids.to(device),
            attention_mask=(input_ids != tokenizer.pad_token_id).to(device),
            labels=labels.to(device),
        ).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return model.eval()


def _padded_batch(prompts: list[list[int]], answers: list[list[int]], tokenizer) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ``(B, T)`` input ids and labels (-100 on prompt and padding tokens)."""
    length = max(len(p) + len(a) for p, a in zip(prompts, answers))
    input_ids = torch.full((len(prompts), length), tokenizer.pad_token_id)
    labels = torch.full((len(prompts), length), -100)
    for row, (p, a) in enumerate(zip(prompts, answers)):
        input_ids[row, : len(p) + len(a)] = torch.tensor(p + a)
        labels[row, len(p) : len(p) + len(a)] = torch.tensor(a)
    return input_ids, labels


@torch.no_grad()
def mean_reward(
    model, tokenizer, dataset: Dataset, max_new_tokens: int = 4, temperature: float = 1.0, num_samples: int = 1
) -> float:
    """Mean ``correct_sum_reward`` of ``num_samples`` completions a prompt, sampled at ``temperature`` (0: greedy)."""
    prompts = list(dataset["prompt"]) * num_samples
    batch = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    device = next(model.parameters()).device
    sampling = {"do_sample": True, "temperature": temperature} if temperature > 0 else {"do_sample": False}
    output = model.eval().generate(**batch.to(device), max_new_tokens=max_new_tokens, **sampling)
    completions = tokenizer.batch_decode(output[:, batch.input_ids.shape[1] :], skip_special_tokens=True)
    return sum(correct_sum_reward(completions, prompts)) / len(prompts)
