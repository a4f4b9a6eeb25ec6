"""The shared trainer plumbing (``_masking.py``) in the wider TRL setup: accumulation, several iterations per
generation, PEFT, checkpoint and resume, bad reward output. GRPO is the vehicle; RLOO shares the code."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import grad_norm, loss_and_grads, move_policy_away, rows_of, stub_generation
from peft import LoraConfig
from test_grpo import INFORMATIVE, MIXED_PROMPTS, TIED, assert_all_zero, assert_grads_close, train_batch

from trl_zerostd._masking import SETTINGS_FILE


def micro_batches(trainer, prompts, completions, steps):
    """The micro-batches TRL's ``_prepare_inputs`` hands to ``training_step`` for ``steps`` steps."""
    stub_generation(trainer, completions)
    trainer.model.train()
    torch.manual_seed(0)  # TRL shuffles the generation batch: same permutation for every trainer
    batches = []
    for step in range(steps):
        trainer._step = step
        batches.append(trainer._prepare_inputs(rows_of(trainer, prompts)))
    return batches


def accumulated_grads(trainer, batches):
    model = trainer.model
    model.zero_grad(set_to_none=True)
    trainer.current_gradient_accumulation_steps = trainer.args.gradient_accumulation_steps
    for batch in batches:
        trainer.compute_loss(model, batch).backward()
    return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dr_grpo", "dapo"])
def test_accumulation_keeps_masks_and_normalisers(make_trainer, loss_type):
    """gradient_accumulation_steps=2 (so steps_per_generation=2): each micro-batch carries the masks decided on the
    whole generation batch, and the accumulated gradient equals TRL's ('keep', beta=0)."""
    config = dict(beta=0.0, loss_type=loss_type, per_device_train_batch_size=4, gradient_accumulation_steps=2)
    base, ours = make_trainer(ours=False, **config), make_trainer(**config)
    assert ours.args.steps_per_generation == 2
    base_batches = micro_batches(base, MIXED_PROMPTS, TIED + INFORMATIVE, steps=2)
    ours_batches = micro_batches(ours, MIXED_PROMPTS, TIED + INFORMATIVE, steps=2)
    tokenizer = ours.processing_class
    seen = []
    for batch in ours_batches:
        texts = tokenizer.batch_decode(batch["completion_ids"], skip_special_tokens=True)
        for text, mask, advantage in zip(texts, batch["completion_mask"], batch["advantages"], strict=True):
            seen.append(text)
            tied = text in TIED
            assert (mask.sum() == 0) == tied and (advantage == 0) == tied, text
    assert sorted(seen) == sorted(TIED + INFORMATIVE)
    assert_grads_close(
        accumulated_grads(ours, ours_batches), accumulated_grads(base, base_batches), rtol=1e-5, atol=1e-7
    )


def test_exclude_under_accumulation_matches_trl_without_masked_rows(make_trainer, monkeypatch):
    """dapo's num_items_in_batch spans the generation batch: recounted once, right for every micro-batch. Unshuffled,
    ours' first micro-batch is the tied group (all masked: one row forwarded at zero weight) and its second is
    exactly the batch TRL trains on alone, so the gradients must match to float precision."""
    monkeypatch.setattr("trl.trainer.grpo_trainer.shuffle_sequence_dict", lambda batch: batch)
    base = make_trainer(ours=False, beta=0.1, loss_type="dapo", per_device_train_batch_size=4)
    ours = make_trainer(
        beta=0.1,
        loss_type="dapo",
        per_device_train_batch_size=4,
        gradient_accumulation_steps=2,
        zero_std_normalization="exclude",
    )
    for trainer in (base, ours):
        move_policy_away(trainer.model)
    ours_batches = micro_batches(ours, MIXED_PROMPTS, TIED + INFORMATIVE, steps=2)
    assert ours_batches[0]["completion_mask"].sum() == 0
    base_grads = accumulated_grads(base, micro_batches(base, ["2+3="], INFORMATIVE, steps=1))
    assert_grads_close(accumulated_grads(ours, ours_batches), base_grads, rtol=1e-5, atol=1e-7)


def test_later_iterations_reuse_the_masks(make_trainer):
    """num_iterations=2: the second pass over a generation batch (policy moved, old log-probs from generation) keeps
    the masks, and the tied rows still put exactly zero gradient, KL term included."""
    base = make_trainer(ours=False, beta=0.1, num_iterations=2)
    ours = make_trainer(beta=0.1, num_iterations=2)
    grads = {}
    for name, trainer in (("base", base), ("ours", ours)):
        first, second = micro_batches(trainer, ["1+1="], TIED, steps=2)
        assert "old_per_token_logps" in second and torch.equal(first["completion_mask"], second["completion_mask"])
        move_policy_away(trainer.model)
        grads[name] = loss_and_grads(trainer, second)[1]
    assert grad_norm(grads["base"]) > 1e-4
    assert_all_zero(grads["ours"])


def test_peft_lora_reference_is_the_base_model(make_trainer):
    """LoRA: the reference is the model with adapters disabled; the KL-gradient fix holds for the adapters."""
    lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)
    base = make_trainer(ours=False, beta=0.1, peft_config=lora)
    ours = make_trainer(beta=0.1, peft_config=lora)
    for trainer in (base, ours):
        assert trainer.ref_model is None
        move_policy_away(trainer.model)
    _, base_tied = loss_and_grads(base, train_batch(base, ["1+1="], TIED))
    _, ours_tied = loss_and_grads(ours, train_batch(ours, ["1+1="], TIED))
    _, ours_mixed = loss_and_grads(ours, train_batch(ours, MIXED_PROMPTS, TIED + INFORMATIVE))
    lora_grads = {k: v for k, v in ours_mixed.items() if "lora" in k}
    assert lora_grads and grad_norm(lora_grads) > 1e-4
    assert grad_norm({k: v for k, v in base_tied.items() if "lora" in k}) > 1e-4
    assert_all_zero(ours_tied)
    ours.train()  # and a real LoRA training step runs


def test_resume_restores_the_package_settings(make_trainer):
    trainer = make_trainer(
        max_steps=2, save_strategy="steps", save_steps=1, zero_std_normalization="exclude", zero_std_atol=0.25
    )
    trainer.train()
    checkpoint = f"{trainer.args.output_dir}/checkpoint-1"
    with open(f"{checkpoint}/{SETTINGS_FILE}") as f:
        assert json.load(f)["zero_std_normalization"] == "exclude"
    resumed = make_trainer(max_steps=3)
    assert resumed.masking.zero_std_normalization == "keep"
    resumed.train(resume_from_checkpoint=checkpoint)
    assert (resumed.masking.zero_std_normalization, resumed.masking.zero_std_atol) == ("exclude", 0.25)
    assert resumed.state.global_step == 3


def test_reward_function_with_wrong_number_of_values_is_named(make_trainer):
    def short_reward(completions, **kwargs):
        return [1.0]

    trainer = make_trainer(reward_funcs=short_reward)
    stub_generation(trainer, TIED)
    trainer.model.train()
    with pytest.raises(ValueError, match="short_reward.*returned 1 rewards"):
        trainer._generate_and_score_completions(rows_of(trainer, ["1+1="]))


def test_metrics_reach_an_offline_tracker(make_trainer):
    """report_to="tensorboard": the package's metrics are logged through the trainer's own metric store."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    trainer = make_trainer(max_steps=2, report_to="tensorboard")
    trainer.train()
    (event_file,) = Path(trainer.args.output_dir).rglob("events.out.tfevents*")
    events = EventAccumulator(str(event_file))
    events.Reload()
    tags = events.Tags()["scalars"]
    for name in ("zero_std/masked_group_frac", "zero_std/masked_token_frac", "masked/row_frac/truncated"):
        assert f"train/{name}" in tags, tags
    assert len(events.Scalars("train/zero_std/masked_group_frac")) == 2
