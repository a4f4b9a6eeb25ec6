"""``zero_std_reward_funcs``: the reward functions whose weighted sum decides whether a group is informative. With a
shaped reward (format plus correctness) an all-wrong group whose formats differ looks informative; gated on the
verifier it is masked, and dynamic sampling drops it."""

from __future__ import annotations

import pytest

from tests.support.refill import DATA
from tests.support.trainers import answer_reward, table_reward, train_batch

ALL_WRONG = ["9 z", "9", "9 z", "9"]  # wrong answers, two formats


def short_reward(completions, **kwargs):
    """The format reward: 1.0 for a completion without a space."""
    return [float(" " not in completion) for completion in completions]


@pytest.mark.parametrize("kind", ["grpo", "rloo"])
def test_an_all_wrong_group_is_masked_when_the_verifier_alone_decides(make_trainer, kind):
    shaped = make_trainer(kind, reward_funcs=[answer_reward, short_reward])
    gated = make_trainer(kind, reward_funcs=[answer_reward, short_reward], zero_std_reward_funcs=["answer_reward"])
    trained = {}
    for name, trainer in (("shaped", shaped), ("gated", gated)):
        batch = train_batch(trainer, ["2+3=", "2+3="], ALL_WRONG)
        trained[name] = batch["completion_mask"].any(dim=1)
        assert trainer._metrics["train"]["zero_std/masked_group_frac"][-1] == (name == "gated")
        assert (batch["advantages"] != 0).any() == (name == "shaped")
    assert trained["shaped"].all() and not trained["gated"].any()


def test_rows_the_deciding_functions_cannot_score_do_not_count_toward_the_decision(make_trainer):
    """The verifier returns None for "a": a group with two scored rows that differ is informative (its unscored rows
    train with TRL's advantage from every function); one with a single scored row is masked."""
    verifier = table_reward({"5": 1.0, "9": 0.0})
    verifier.__name__ = "verifier"
    trainer = make_trainer(reward_funcs=[verifier, short_reward], zero_std_reward_funcs=["verifier"])
    two_scored = train_batch(trainer, ["2+3=", "2+3="], ["5", "9", "a b", "a"])
    assert two_scored["completion_mask"].any(dim=1).all()
    assert two_scored["advantages"][2] != two_scored["advantages"][3]  # the unscored rows differ in format
    one_scored = train_batch(trainer, ["2+3=", "2+3="], ["5", "a", "a b", "a"])
    assert not one_scored["completion_mask"].any()
    assert trainer._metrics["train"]["masked/row_frac/unscorable"][-1] == 0.0  # the format reward scored them


def test_dynamic_sampling_drops_a_group_the_verifier_ties(make_trainer):
    """ "1+1=" rows all right but of two formats: informative by the shaped sum, tied by the verifier, so dynamic
    sampling refills past it."""
    trainer = make_trainer(
        prompts=DATA, reward_funcs=[answer_reward, short_reward], zero_std_reward_funcs=["answer_reward"],
        dynamic_sampling=True,
    )  # fmt: skip

    def completions(prompts):
        return ["2" if i % 2 else "2 a" if p == "1+1=" else "9 z" if i % 2 else "5" for i, p in enumerate(prompts)]

    batch = train_batch(trainer, ["1+1=", "1+1="], completions)
    prompts = trainer.processing_class.batch_decode(batch["prompt_ids"], skip_special_tokens=True)
    assert "1+1=" not in prompts and batch["completion_mask"].any(dim=1).all()


def test_an_unknown_reward_function_name_is_refused(make_trainer):
    with pytest.raises(ValueError, match=r"zero_std_reward_funcs names \['verifier'\].*\['answer_reward'\]"):
        make_trainer(zero_std_reward_funcs=["verifier"])
    with pytest.raises(ValueError, match="non-empty list"):
        make_trainer(zero_std_reward_funcs=[])


def test_a_name_two_reward_functions_share_is_refused(make_trainer):
    first, second = table_reward({"5": 1.0}), table_reward({"a": 1.0})  # both named "reward"
    with pytest.raises(ValueError, match=r"names \['reward'\], which more than one reward function"):
        make_trainer(reward_funcs=[first, second], zero_std_reward_funcs=["reward"])
