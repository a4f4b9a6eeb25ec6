"""TRL's own vLLM code (``VLLMGeneration``, server and colocate) under every feature, with a stand-in at vLLM's
boundary (``tests/support/fake_vllm.py``): every row's completion was generated for its own prompt, the engine holds
the policy's weights at every call and is synced once per generation batch, no call asks for more sequences than TRL
sized the engine for, and the trained batch is the one TRL's HF-generate path gives for the same completions. (Two
processes: ``tests/launch/test_vllm_two_processes.py``.)"""

from __future__ import annotations

import pytest
import torch

from tests.support.fake_vllm import Engine, completions_by_index, install, origin, per_call
from tests.support.trainers import assert_grads_close, loss_and_grads, move_policy_away, rows_of, stub_generation
from tests.support.vllm_cases import DATA, FEATURES, TEXTS, VLLM, OriginReward


@pytest.fixture
def vllm_trainer(make_trainer, monkeypatch, tokenizer):
    """``vllm_trainer(kind, mode, **config) -> (trainer, engine, reward)`` on the stand-in engine."""

    def make(kind="grpo", mode="server", **config):
        engine = install(monkeypatch, Engine(tokenizer, completions_by_index(TEXTS)))
        for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
            monkeypatch.delenv(name, raising=False)  # colocate sets them; restored after the test
            monkeypatch.setenv(name, "0")
            monkeypatch.delenv(name)
        reward = OriginReward()
        trainer = make_trainer(kind, prompts=DATA, reward_funcs=reward, vllm_mode=mode, **{**VLLM, **config})
        engine.policy = trainer.model
        return trainer, engine, reward

    return make


def assert_engine_invariants(trainer, engine, reward, steps):
    assert reward.rows and not reward.foreign, f"{len(reward.foreign)} of {reward.rows} rows: {reward.foreign[:3]}"
    assert all(call.weights_current for call in engine.calls), "a call generated from stale weights"
    generation_batch = trainer.args.per_device_train_batch_size * trainer.args.steps_per_generation
    assert max(call.prompts * call.n for call in engine.calls) <= generation_batch
    assert engine.syncs == steps  # one sync per generation batch (steps_per_generation=1 here)


@pytest.mark.parametrize("mode", ["server", "colocate"])
@pytest.mark.parametrize("feature", list(FEATURES))
def test_every_row_is_generated_for_its_own_prompt(vllm_trainer, mode, feature):
    trainer, engine, reward = vllm_trainer("grpo", mode, max_steps=3, **FEATURES[feature])
    trainer.train()
    assert_engine_invariants(trainer, engine, reward, steps=3)


@pytest.mark.parametrize("mode", ["server", "colocate"])
@pytest.mark.parametrize("feature", ["masking", "skipping", "dynamic_skipping"])
def test_rloo_rows_are_generated_for_their_own_prompts(vllm_trainer, mode, feature):
    trainer, engine, reward = vllm_trainer("rloo", mode, max_steps=2, **FEATURES[feature])
    trainer.train()
    assert_engine_invariants(trainer, engine, reward, steps=2)


IS_MODES = ["token_truncate", "token_mask", "sequence_truncate", "sequence_mask"]


@pytest.mark.parametrize("mode", ["server", "colocate"])
@pytest.mark.parametrize("is_mode", IS_MODES)
def test_importance_sampling_correction_under_dynamic_sampling(vllm_trainer, mode, is_mode):
    """TRL's correction reads the engine's sampling log-probs of each row: they must be that row's, through every
    round. A log-prob far below the policy's puts every ratio past the clip range, so sequence_mask rejects every row
    (masked, logged)."""
    trainer, engine, reward = vllm_trainer(
        "grpo",
        mode,
        max_steps=2,
        vllm_importance_sampling_correction=True,
        vllm_importance_sampling_mode=is_mode,
        dynamic_sampling_max_rounds=3,
        **FEATURES["dynamic"],
    )
    engine.logprob = -20.0
    trainer.train()
    assert_engine_invariants(trainer, engine, reward, steps=2)
    rejected = [entry["masked/row_frac/rejected"] for entry in trainer.state.log_history if "loss" in entry]
    assert rejected and all(frac == (1.0 if is_mode == "sequence_mask" else 0.0) for frac in rejected)


@pytest.mark.every_trl
@pytest.mark.parametrize("feature", ["dynamic", "dynamic_skipping"])
def test_sleep_mode_syncs_once_per_generation_batch(vllm_trainer, feature):
    """Colocated vLLM under sleep mode: the engine wakes, takes the weights once and sleeps once per generation batch,
    however many calls the batch's rounds make; every call finds it awake with the policy's weights."""
    trainer, engine, reward = vllm_trainer(
        "grpo", "colocate", max_steps=4, steps_per_generation=2, vllm_enable_sleep_mode=True, **FEATURES[feature]
    )
    scoring_forward, awake_at_scoring = trainer._get_per_token_logps_and_entropies, []

    def forward_seeing_the_engine(*args, **kwargs):  # the scoring forwards of the passes that train
        batch = trainer._generation_batch
        if batch is not None and trainer._loss_call is None:
            awake_at_scoring.append(engine.kv_awake)
        return scoring_forward(*args, **kwargs)

    trainer._get_per_token_logps_and_entropies = forward_seeing_the_engine
    trainer.train()
    assert awake_at_scoring and not any(awake_at_scoring)  # asleep before them, as after TRL's own generate
    batches = 2  # 4 optimizer steps, 2 per generation batch
    assert len(engine.calls) > batches  # the rounds made several calls a batch
    assert all(call.weights_loaded for call in engine.calls)
    assert engine.sleeps == [2] * (batches + 1)  # at init, then once after each batch
    assert_engine_invariants(trainer, engine, reward, steps=batches)


@pytest.mark.every_trl
@pytest.mark.parametrize("mode", ["server", "colocate"])
def test_rounds_are_decoded_in_calls_no_larger_than_trls(vllm_trainer, mode):
    """A first round of two generation batches (dynamic sampling sizes it by the informative rate seen) is decoded as
    two calls of TRL's size."""
    trainer, engine, reward = vllm_trainer("grpo", mode, max_steps=3, **FEATURES["dynamic"])
    trainer.train()
    assert max(call.prompts * call.n for call in engine.calls) == 8
    assert sum(call.prompts * call.n for call in engine.calls) == reward.rows > 8 * 3


def test_hf_generate_decodes_in_calls_no_larger_than_trls(make_trainer):
    """HF generate (the real tiny model): no ``generate`` call holds more rows than TRL's generation batch."""

    def reward(prompts, **kwargs):  # "1+1=" ties its group, every other group is informative
        return [1.0 if prompt == "1+1=" else float(i % 2) for i, prompt in enumerate(prompts)]

    trainer = make_trainer(prompts=DATA, max_steps=3, dynamic_sampling=True, reward_funcs=reward)
    model = trainer.model
    generate, sizes = model.generate, []

    def counting_generate(*args, **kwargs):
        sizes.append(len(kwargs["input_ids"]))
        return generate(*args, **kwargs)

    model.generate = counting_generate
    trainer.train()
    assert max(sizes) == 8 and sum(sizes) > 8 * 3


@pytest.mark.parametrize("mode", ["server", "colocate"])
@pytest.mark.parametrize(
    ("kind", "feature"),
    [(kind, feature) for kind in ("grpo", "rloo") for feature in ("masking", "dynamic", "skipping")]
    + [("grpo", "entropy")],
)
def test_the_vllm_batch_trains_as_the_hf_generate_batch(vllm_trainer, make_trainer, kind, mode, feature):
    """The same completions through TRL's vLLM code and through TRL's HF-generate path (its generation seam stubbed):
    the same rows, advantages and masks, and the same loss and gradients on a policy moved off the reference."""
    correction = {"vllm_importance_sampling_correction": False} if kind == "grpo" else {}
    ours, _, _ = vllm_trainer(kind, mode, **FEATURES[feature], **correction)
    hf = make_trainer(kind, prompts=DATA, reward_funcs=OriginReward(), **{**VLLM, "use_vllm": False},
                      **FEATURES[feature])  # fmt: skip
    stub_generation(hf, per_call(completions_by_index(TEXTS)))
    batches = []
    for trainer in (ours, hf):
        trainer.model.train()
        batches.append(trainer._generate_and_score_completions(rows_of(trainer, ["1+1=", "2+3="])))
    for key in ("prompt_ids", "completion_ids", "completion_mask", "advantages"):
        torch.testing.assert_close(batches[0][key], batches[1][key], msg=key)
    assert batches[1]["advantages"].abs().sum() > 0
    results = []
    for trainer, batch in zip((ours, hf), batches):
        move_policy_away(trainer.model)
        results.append(loss_and_grads(trainer, batch))
    torch.testing.assert_close(results[0][0], results[1][0])
    assert_grads_close(results[0][1], results[1][1])


@pytest.mark.parametrize("mode", ["server", "colocate"])
def test_logged_columns_stand_beside_their_rows(vllm_trainer, mode):
    """A reward function's ``log_extra`` column, logged by every round's scoring, is flushed beside the rows that
    train: each row's logged origin is its own prompt."""
    trainer, _, reward = vllm_trainer("grpo", mode, max_steps=2, **FEATURES["dynamic"])

    def logging_reward(completions, prompts, log_extra=None, **kwargs):
        log_extra("origin", [origin(c) for c in completions])
        return reward(completions, prompts)

    trainer.reward_funcs = [logging_reward]
    trainer.train()
    logged = list(trainer._logs["extra"]["origin"])
    assert len(logged) == 8 and logged == list(trainer._logs["prompt"])


def test_a_rollout_func_under_server_mode_with_a_refill_is_refused(vllm_trainer):
    """A rollout_func gets a refill round's rows unaligned, and TRL's server path needs them aligned: refused at init,
    naming the settings; the same rollout without a refill, or colocated, is accepted."""

    def rollout(prompts, trainer):
        raise AssertionError("not called at init")

    with pytest.raises(ValueError, match="rollout_func under use_vllm=True, vllm_mode='server'"):
        vllm_trainer("grpo", "server", rollout_func=rollout, **FEATURES["dynamic"])
    assert vllm_trainer("grpo", "server", rollout_func=rollout)[0].zero_std.refiller is None
    assert vllm_trainer("grpo", "colocate", rollout_func=rollout, **FEATURES["dynamic"])[0].zero_std.refiller
