"""TRL's own vLLM code (``VLLMGeneration``, server and colocate) under every feature, with a stand-in at vLLM's
boundary (``fake_vllm.py``): every row's completion was generated for its own prompt, the engine holds the policy's
weights at every call and is synced once per generation batch, no call asks for more sequences than TRL sized the
engine for, and the trained batch is the one TRL's HF-generate path gives for the same completions."""

from __future__ import annotations

import pytest
import torch
from conftest import assert_grads_close, loss_and_grads, move_policy_away, rows_of, stub_generation
from fake_vllm import CyclingCompletions, Engine, answer, install, origin

DATA = ["1+1=", "2+3=", "4+4=", "3+5="]
SUMS = {p: str(sum(int(x) for x in p.rstrip("=").split("+"))) for p in DATA}
# "1+1=" is always right (a tied group); the others alternate right and wrong
TEXTS = {p: [SUMS[p]] if p == "1+1=" else [SUMS[p], "9"] for p in DATA}
VLLM = {"use_vllm": True, "max_completion_length": 8, "beta": 0.1}
FEATURES = {
    "masking": {},
    "dynamic": {"dynamic_sampling": True},
    "screen": {"dynamic_sampling": True, "dynamic_sampling_screen": 2},
    "skipping": {"skip_zero_std_prompts": True, "skip_predictor": "streak"},
    "empty_slots": {"skip_zero_std_prompts": True, "skip_predictor": "streak", "skip_refill": False},
    "dynamic_skipping": {"dynamic_sampling": True, "skip_zero_std_prompts": True, "skip_predictor": "streak"},
}


class OriginReward:
    """The task reward of a fake completion, recording every scored row whose completion came from another prompt."""

    __name__ = "origin_reward"

    def __init__(self):
        self.rows = 0
        self.foreign = []

    def __call__(self, completions, prompts, **kwargs):
        self.rows += len(completions)
        self.foreign += [(p, c) for p, c in zip(prompts, completions) if origin(c) != p]
        return [float(answer(c) == SUMS[p]) for p, c in zip(prompts, completions)]


@pytest.fixture
def vllm_trainer(make_trainer, monkeypatch, tokenizer):
    """``vllm_trainer(kind, mode, **config) -> (trainer, engine, reward)`` on the stand-in engine."""

    def make(kind="grpo", mode="server", **config):
        engine = install(monkeypatch, Engine(tokenizer, CyclingCompletions(TEXTS)))
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
