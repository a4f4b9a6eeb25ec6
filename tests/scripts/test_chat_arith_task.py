"""The real-model task: levels, a held-out split disjoint from the train split by prompt text, determinism, and the
final-answer reward (a truncated completion scores 0) with its per-level metrics."""

import collections
import re

import pytest

from demo.chat_arith_task import LEVELS, FinalAnswerReward, chat_arith_splits, final_answer, level_counts

QUESTION = re.compile(r"What is (\d+) ([+*]) (\d+)\? Answer with the number only\.")
EOS = 2


def operands(row) -> tuple[int, str, int]:
    (message,) = row["prompt"]
    a, op, b = QUESTION.fullmatch(message["content"]).groups()
    return int(a), op, int(b)


def test_levels_shares_operands_and_answers():
    train, held_out = chat_arith_splits(1000, 200, seed=0)
    assert len(train) == 1000 and len(held_out) == 200
    assert collections.Counter(train["level"]) == {"1": 150, "2": 150, "3": 200, "4": 200, "5": 150, "6": 150}
    assert level_counts(200) == [30, 30, 40, 40, 30, 30]
    shapes = {"1": ("+", 1, 1), "2": ("*", 1, 1), "3": ("+", 2, 1), "4": ("+", 2, 2), "5": ("+", 3, 3),
              "6": ("*", 3, 3)}  # fmt: skip
    for row in [*train.select(range(300)), *held_out]:
        a, op, b = operands(row)
        assert (op, len(str(a)), len(str(b))) == shapes[row["level"]]
        assert row["answer"] == (a + b if op == "+" else a * b)
    assert sum(level.share for level in LEVELS) == pytest.approx(1.0)


def test_held_out_prompts_are_distinct_and_never_in_the_train_split():
    for seed in (0, 1, 2):
        train, held_out = chat_arith_splits(4000, 400, seed=seed)
        train_texts = {row[0]["content"] for row in train["prompt"]}
        held_texts = [row[0]["content"] for row in held_out["prompt"]]
        assert len(set(held_texts)) == len(held_texts)
        assert not train_texts & set(held_texts)


def test_splits_are_deterministic_in_the_seed():
    first, second, other = chat_arith_splits(300, 50, 1), chat_arith_splits(300, 50, 1), chat_arith_splits(300, 50, 2)
    assert first[0]["prompt"] == second[0]["prompt"] and first[1]["prompt"] == second[1]["prompt"]
    assert first[0]["prompt"] != other[0]["prompt"]


def test_too_many_held_out_prompts_for_a_level_is_refused():
    with pytest.raises(ValueError, match="num_eval"):
        chat_arith_splits(100, 700, seed=0)  # 105 held-out prompts of level 1, which has 100 in all


def test_final_answer_is_the_last_integer():
    assert final_answer("7 * 6 = 42") == 42
    assert final_answer("The answer is -3.") == -3
    assert final_answer("no number") is None


def test_reward_needs_an_ended_completion_and_logs_per_level():
    logged = collections.defaultdict(list)
    reward = FinalAnswerReward([EOS])
    prompts = ["p1"] * 2 + ["p5"] * 2
    rewards = reward(
        completions=["3 + 4 = 7", "3 + 4 = 7", "100 + 200 = 300", "I think 300"],
        completion_ids=[[5, 6, EOS], [5, 6, 7], [5, EOS], [9, EOS]],  # the second ran out of tokens
        answer=[7, 7, 300, 301],
        level=["1", "1", "5", "5"],
        prompts=prompts,
        log_metric=lambda name, value: logged[name].append(value),
    )
    assert rewards == [1.0, 0.0, 1.0, 0.0]
    assert logged["level/1/accuracy"] == [0.5] and logged["level/5/accuracy"] == [0.5]
    assert logged["level/all_wrong_group_frac"] == [0.0] and logged["level/all_right_group_frac"] == [0.0]
    with pytest.raises(ValueError, match="stop token"):
        FinalAnswerReward([])


def test_cli_task_chat_arith_needs_a_real_model(tmp_path):
    from demo.train_cli import run
    from trl_zerostd import ZeroStdGRPOConfig, ZeroStdGRPOTrainer

    with pytest.raises(ValueError, match="model_name_or_path"):
        run(ZeroStdGRPOTrainer, ZeroStdGRPOConfig, ["--output_dir", str(tmp_path), "--task", "chat_arith"])
