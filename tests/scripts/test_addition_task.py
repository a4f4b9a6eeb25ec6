"""The embedded task: the verifier reward, the dataset and the warm start."""

import pytest

from demo.addition_task import addition_dataset, correct_sum_reward, mean_reward, warm_start
from demo.tiny_model import build_model
from demo.train_cli import torch_threads


@pytest.mark.parametrize(
    ("completion", "reward"),
    [
        ("7", 1.0),
        (" 7", 1.0),
        ("7 apples", 1.0),
        ("sum: 7.", 1.0),
        ("8", 0.0),
        ("17", 0.0),
        ("-7", 0.0),
        ("", 0.0),
        ("seven", 0.0),
        ("8 7", 0.0),  # only the first number counts
    ],
)
def test_reward_reads_the_first_number(completion, reward):
    assert correct_sum_reward([completion], ["3+4="]) == [reward]


def test_reward_prefers_the_answer_column_and_reads_conversations():
    assert correct_sum_reward(["12", "5"], ["what is 7 plus 5?", "2+3="], answer=[12, 6]) == [1.0, 0.0]
    conversation = [{"role": "assistant", "content": "4"}]
    assert correct_sum_reward([conversation], [[{"role": "user", "content": "1+3="}]]) == [1.0]


def test_reward_without_answer_needs_a_sum_prompt():
    with pytest.raises(ValueError, match="answer"):
        correct_sum_reward(["3"], ["what is 1 plus 2?"])


def test_dataset_shape_and_determinism():
    dataset = addition_dataset(50, seed=3)
    assert len(dataset) == 50 and dataset.column_names == ["prompt", "answer"]
    for prompt, answer in zip(dataset["prompt"], dataset["answer"]):
        a, b = prompt.removesuffix("=").split("+")
        assert len(a) == len(b) == 1 and int(a) + int(b) == answer
    assert addition_dataset(50, seed=3)["prompt"] == dataset["prompt"]
    assert addition_dataset(50, seed=4)["prompt"] != dataset["prompt"]
    assert correct_sum_reward([str(a) for a in dataset["answer"]], dataset["prompt"]) == [1.0] * 50


def test_warm_start_raises_the_held_out_reward(tokenizer):
    """Greedy reward on a fresh sample (seed 1) of the 100 possible prompts, before and after 100 steps."""
    held_out = addition_dataset(100, seed=1)
    model = build_model(tokenizer, seed=0)
    with torch_threads(1):  # the tiny model gains nothing from threads, and they stall when the other core is busy
        before = mean_reward(model, tokenizer, held_out, temperature=0)
        warm_start(model, tokenizer, addition_dataset(500, seed=0), steps=100)
        after = mean_reward(model, tokenizer, held_out, temperature=0)
    assert before < 0.15 and after > before + 0.3
