"""The shared trainer plumbing (``_adapter.py``) in the wider TRL setup: accumulation, several iterations per
generation, PEFT, checkpoint and resume, bad reward output, masked rows skipping the scoring forwards and the reward
calls that needs. GRPO is the vehicle; RLOO shares the code."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from peft import LoraConfig

from studies.skip_compute import ForwardCounter
from tests.support.trainers import (
    INFORMATIVE,
    LOSS_TYPES,
    MIXED_PROMPTS,
    OUR_CLASSES,
    TIED,
    answer_or_not,
    answer_reward,
    assert_all_zero,
    assert_grads_close,
    clipped_loss_metrics,
    grad_norm,
    loss_and_grads,
    move_policy_away,
    rows_of,
    stub_generation,
    stub_rollout,
    table_reward,
    train_batch,
)
from trl_zerostd import ZeroStdGRPOTrainer, ZeroStdRLOOTrainer
from trl_zerostd.trainer.hooks import TrainerHooks


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


@pytest.mark.every_trl
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


@pytest.mark.every_trl
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


@pytest.mark.every_trl
def test_steps_per_generation_keeps_masks_and_normalisers(make_trainer):
    """steps_per_generation=2 with no accumulation: one generation batch feeds two optimizer steps (old log-probs
    computed), each micro-batch carries the masks of the whole batch and its loss is TRL's ('keep', beta=0)."""
    config = {"beta": 0.0, "per_device_train_batch_size": 4, "steps_per_generation": 2}
    base, ours = make_trainer(ours=False, **config), make_trainer(**config)
    base_batches = micro_batches(base, MIXED_PROMPTS, TIED + INFORMATIVE, steps=2)
    ours_batches = micro_batches(ours, MIXED_PROMPTS, TIED + INFORMATIVE, steps=2)
    tokenizer = ours.processing_class
    for base_batch, ours_batch in zip(base_batches, ours_batches, strict=True):
        assert "old_per_token_logps" in ours_batch
        texts = tokenizer.batch_decode(ours_batch["completion_ids"], skip_special_tokens=True)
        tied = torch.tensor([text in TIED for text in texts])
        assert torch.equal(ours_batch["completion_mask"].sum(dim=1) == 0, tied)
        assert_grads_close(
            accumulated_grads(ours, [ours_batch]), accumulated_grads(base, [base_batch]), rtol=1e-5, atol=1e-7
        )


@pytest.mark.every_trl
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


@pytest.mark.every_trl
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


# ---------------------------------------------------------------------------------------------------------------
# Scoring forwards (issue 5): masked rows skip the reference and old-policy forwards
# ---------------------------------------------------------------------------------------------------------------

SCORING_CASES = {  # completions of MIXED_PROMPTS, extra config, rows the scoring forwards keep
    "zero_std": (TIED + INFORMATIVE, {}, 4),
    "truncated": (TIED + ["5 x|"] + INFORMATIVE[1:], {"mask_truncated_completions": True}, 3),
    "unscorable": (TIED + INFORMATIVE, {"reward_funcs": table_reward({"5 x": 1.0, "3": 0.0, "5": 1.0})}, 3),
}
SCORING_CONFIG = {"grpo": {"beta": 0.1, "num_iterations": 2}, "rloo": {"beta": 0.1}}  # both forwards run


def scored_with_counts(trainer, prompts, completions):
    """``train_batch`` plus the rows the policy and the reference model forwarded while scoring."""
    policy, reference = ForwardCounter(trainer.model), ForwardCounter(trainer.ref_model)
    policy.counting = reference.counting = True
    batch = train_batch(trainer, prompts, completions)
    policy.counting = reference.counting = False
    return batch, policy.rows, reference.rows


@pytest.mark.every_trl
@pytest.mark.parametrize("case", list(SCORING_CASES))
@pytest.mark.parametrize("kind", ["grpo", "rloo"])
def test_scoring_forwards_skip_masked_rows_and_change_nothing_else(make_trainer, kind, case):
    """The reference and old-policy forwards see the unmasked rows only, where TRL's see every row: the trained rows'
    log-probs are TRL's, and loss and gradients are TRL's on its own batch with our advantages and loss mask."""
    completions, config, kept = SCORING_CASES[case]
    results = {}
    for ours in (True, False):
        trainer = make_trainer(kind, ours=ours, **SCORING_CONFIG[kind], **config)
        move_policy_away(trainer.model)
        results[ours] = (trainer, *scored_with_counts(trainer, MIXED_PROMPTS, completions))
    (ours, ours_batch, *ours_rows), (base, base_batch, *base_rows) = results[True], results[False]
    assert (ours_rows, base_rows) == ([kept, kept], [8, 8])

    trains = ours_batch["completion_mask"].sum(dim=1) > 0
    assert int(trains.sum()) == kept
    assert ours_batch.keys() >= base_batch.keys()
    for key in base_batch.keys() & {"old_per_token_logps", "ref_per_token_logps", "old_logps"}:
        torch.testing.assert_close(ours_batch[key][trains], base_batch[key][trains], msg=key)
        assert not ours_batch[key][~trains].any(), key  # skipped: 0 (RLOO's old_logps of masked rows: 0 anyway)
    base_batch["advantages"], base_batch["completion_mask"] = ours_batch["advantages"], ours_batch["completion_mask"]
    ours_loss, ours_grads = loss_and_grads(ours, ours_batch)
    base_loss, base_grads = loss_and_grads(base, base_batch)
    assert grad_norm(ours_grads) > 1e-4
    torch.testing.assert_close(ours_loss, base_loss)
    assert_grads_close(ours_grads, base_grads, rtol=1e-5, atol=1e-7)

    ours_metrics, base_metrics = ours._metrics["train"], base._metrics["train"]
    assert ours_metrics.keys() >= base_metrics.keys()
    changed = {key for key in base_metrics if ours_metrics[key] != base_metrics[key]}
    # RLOO folds beta * KL into TRL's reward: its kl, and frac_reward_zero_std where a tied group is skipped, see the
    # skipped rows' KL as 0
    rloo_changed = {"kl"} if case == "unscorable" else {"kl", "frac_reward_zero_std"}
    assert changed == (rloo_changed if kind == "rloo" else set())


def test_scoring_forwards_skip_nothing_when_every_row_trains(make_trainer):
    trainer = make_trainer(**SCORING_CONFIG["grpo"])
    _, policy_rows, reference_rows = scored_with_counts(trainer, ["2+3=", "2+3="], INFORMATIVE * 2)
    assert (policy_rows, reference_rows) == (8, 8)


def test_all_masked_batch_forwards_one_row_while_scoring(make_trainer):
    trainer = make_trainer(**SCORING_CONFIG["grpo"])
    batch, policy_rows, reference_rows = scored_with_counts(trainer, ["1+1=", "4+4="], TIED + ["9", "1", "1 a", "0"])
    assert (policy_rows, reference_rows) == (1, 1) and batch["completion_mask"].sum() == 0


@pytest.mark.every_trl
def test_vllm_importance_sampling_keeps_the_old_forward_whole(make_trainer):
    """Under vLLM importance-sampling correction the old-policy forward gives the ratio that may reject a row, so it
    forwards every row, as TRL's; the reference forward still skips. (vLLM itself is not needed: its sampling
    log-probs are fed through the stubbed generation.)"""
    results = {}
    for ours in (True, False):
        trainer = make_trainer(ours=ours, beta=0.1, vllm_importance_sampling_mode="sequence_mask")
        trainer.use_vllm = True
        stub_generation(trainer, TIED + INFORMATIVE, logprobs=lambda row, ids: [-1.0] * len(ids))
        policy, reference = ForwardCounter(trainer.model), ForwardCounter(trainer.ref_model)
        policy.counting = reference.counting = True
        trainer.model.train()
        batch = trainer._generate_and_score_completions(rows_of(trainer, MIXED_PROMPTS))
        results[ours] = (batch, policy.rows, reference.rows)
    (ours_batch, *ours_rows), (base_batch, *base_rows) = results[True], results[False]
    assert (ours_rows, base_rows) == ([8, 4], [8, 8])
    for key in ("advantages", "importance_sampling_ratio", "old_per_token_logps"):
        torch.testing.assert_close(ours_batch[key], base_batch[key], msg=key)
    assert torch.equal(ours_batch["completion_mask"][4:], base_batch["completion_mask"][4:])
    assert not ours_batch["completion_mask"][:4].any() and base_batch["completion_mask"][:4].all(dim=1).any()


# ---------------------------------------------------------------------------------------------------------------
# Reward functions see what they see in TRL, once per generation batch
# ---------------------------------------------------------------------------------------------------------------


def recording_reward(calls, events=None):
    """A reward function that records the arguments of each call (and ``"reward"`` in ``events``)."""

    def reward(prompts, completions, completion_ids, trainer_state, log_extra, log_metric, **kwargs):
        if events is not None:
            events.append("reward")
        calls.append(
            {
                "prompts": list(prompts),
                "completions": list(completions),
                "completion_ids": [list(ids) for ids in completion_ids],
                "columns": {key: list(value) for key, value in kwargs.items()},
                "hooks": (type(trainer_state).__name__, callable(log_extra), callable(log_metric)),
                "grad_enabled": torch.is_grad_enabled(),
            }
        )
        return answer_reward(completions, prompts)

    return reward


def turns_and_env(prompts):
    """A rollout_func's extra fields: one value per row, or one for all rows."""
    return {"turns": list(range(len(prompts))), "env": "calc"}


def tool_mask(ids):
    """The first completion token is the model's, the rest a tool's output."""
    return [1] + [0] * (len(ids) - 1)


@pytest.mark.every_trl
@pytest.mark.parametrize("kind", ["grpo", "rloo"])
def test_reward_functions_are_called_once_with_trl_arguments(make_trainer, kind):
    """Scored early (before the forwards), each reward function is still called once per generation batch, with
    the arguments TRL gives it: prompts, completions, ids, every dataset column and (GRPO) a rollout's extra fields."""
    calls = {}
    for ours in (False, True):
        calls[ours] = []
        trainer = make_trainer(kind, ours=ours, reward_funcs=recording_reward(calls[ours]), **SCORING_CONFIG[kind])
        if kind == "grpo":  # a rollout_func's extra fields: one value per row, or one for all rows
            stub_rollout(trainer, TIED + INFORMATIVE, extra_fields=turns_and_env)
        else:
            stub_generation(trainer, TIED + INFORMATIVE)
        trainer.model.train()
        rows = [{"prompt": p, "answer": str(sum(map(int, p.rstrip("=").split("+"))))} for p in MIXED_PROMPTS]
        trainer._generate_and_score_completions([dict(row) for row in rows for _ in range(4)])
    assert len(calls[True]) == len(calls[False]) == 1
    assert calls[True] == calls[False]
    columns = calls[True][0]["columns"]
    assert columns["answer"] == ["2"] * 4 + ["5"] * 4
    if kind == "grpo":
        assert columns["turns"] == list(range(8)) and columns["env"] == ["calc"] * 8


def test_rewards_are_scored_right_after_generation(make_trainer):
    """The plan is decided once, right after generation and scoring: the rewards come before TRL's scoring
    forwards."""
    events = []
    trainer = make_trainer(reward_funcs=recording_reward([], events), **SCORING_CONFIG["grpo"])
    trainer.model.register_forward_pre_hook(lambda *_: events.append("forward"))
    trainer.ref_model.register_forward_pre_hook(lambda *_: events.append("forward"))
    train_batch(trainer, MIXED_PROMPTS, TIED + INFORMATIVE)
    assert events == ["reward", "forward", "forward"]


@pytest.mark.parametrize("kind", ["grpo", "rloo"])
def test_group_mixing_prompts_is_an_error(make_trainer, kind):
    trainer = make_trainer(kind)
    stub_generation(trainer, TIED + INFORMATIVE)
    trainer.model.train()
    rows = [{"prompt": "1+1="}] * 3 + [{"prompt": "2+3="}] * 5
    with pytest.raises(ValueError, match="mix dataset prompts"):
        trainer._generate_and_score_completions(rows)


TRUNCATED_INFORMATIVE = ["5 x|"] + INFORMATIVE[1:]  # the first row truncated (masked by TRL), the rest informative


@pytest.mark.every_trl
@pytest.mark.parametrize("normalization", ["keep", "exclude"])
@pytest.mark.parametrize(("kind", "loss_type"), [*(("grpo", loss) for loss in LOSS_TYPES), ("rloo", None)])
def test_skipping_masked_rows_in_the_loss_changes_nothing_but_compute(make_trainer, kind, loss_type, normalization):
    """Rows with no active token (tied group, a truncated row) are not forwarded in the loss: the loss forward sees
    the 3 rows that train. Loss and gradients are TRL's, forwarding every row it is given, with our advantages:
    under "keep" on the whole batch with the tied rows' tokens out of its loss mask (bnpo, whose normaliser counts
    that mask, scaled back to every row's tokens), under "exclude" on the informative group alone."""
    config = dict(beta=0.1, mask_truncated_completions=True, **({"loss_type": loss_type} if loss_type else {}))
    ours = make_trainer(kind, zero_std_normalization=normalization, **config)
    base = make_trainer(kind, ours=False, **config)
    for trainer in (ours, base):
        move_policy_away(trainer.model)
    ours_batch = train_batch(ours, MIXED_PROMPTS, TIED + TRUNCATED_INFORMATIVE)
    scale = 1.0
    if normalization == "keep":
        base_batch = train_batch(base, MIXED_PROMPTS, TIED + TRUNCATED_INFORMATIVE)
        base_batch["advantages"] = ours_batch["advantages"]
        if loss_type == "bnpo":
            scale = (base_batch["completion_mask"][4:].sum() / base_batch["completion_mask"].sum()).item()
        base_batch["completion_mask"][:4] = 0
    else:
        base_batch = train_batch(base, ["2+3="], TRUNCATED_INFORMATIVE)
        base_batch["advantages"] = ours_batch["advantages"][4:]
    results = {}
    for trainer, batch in ((ours, ours_batch), (base, base_batch)):
        counter = ForwardCounter(trainer.model)
        counter.counting = True
        results[trainer is ours] = (*loss_and_grads(trainer, batch), counter.rows)
    (ours_loss, ours_grads, ours_rows), (base_loss, base_grads, base_rows) = results[True], results[False]
    assert (ours_rows, base_rows) == (3, 8 if normalization == "keep" else 4)
    assert grad_norm(ours_grads) > 1e-4
    torch.testing.assert_close(ours_loss, base_loss * scale)
    assert_grads_close(ours_grads, {name: grad * scale for name, grad in base_grads.items()}, rtol=1e-5, atol=1e-7)


@pytest.mark.every_trl
def test_logged_token_means_cover_the_trained_tokens(make_trainer):
    """Under 'keep', TRL's kl, entropy and clip-ratio means are over the trained tokens, as TRL's own are when the
    masked rows' tokens are out of its loss mask. num_iterations=2 and a policy moved after generation make the
    importance ratios leave the clip range, so the clip ratios are not trivially 0."""
    base, ours = clipped_loss_metrics(make_trainer, MIXED_PROMPTS, TIED + INFORMATIVE)
    keys = ("kl", "entropy", "clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/region_mean")
    assert ours._metrics["train"]["clip_ratio/region_mean"][-1] > 0
    for key in keys:
        assert ours._metrics["train"][key][-1] == pytest.approx(base._metrics["train"][key][-1], rel=1e-5), key


# ---------------------------------------------------------------------------------------------------------------
# What a masked row looks like, and zero-weight forwards
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.every_trl
def test_masked_rows_have_a_zero_tool_mask(make_trainer):
    """SEMANTICS: a masked row's completion_mask and tool_mask are all zero; a trained row keeps TRL's tool mask."""
    batch = train_batch(make_trainer(), MIXED_PROMPTS, TIED + INFORMATIVE, tool_mask=tool_mask)
    base = train_batch(make_trainer(ours=False), MIXED_PROMPTS, TIED + INFORMATIVE, tool_mask=tool_mask)
    assert base["tool_mask"][:4].any() and not base["tool_mask"][4:, 1].any()
    assert not batch["tool_mask"][:4].any() and not batch["completion_mask"][:4].any()
    assert torch.equal(batch["tool_mask"][4:], base["tool_mask"][4:])


@pytest.mark.parametrize("normalization", ["keep", "exclude"])
def test_all_masked_batch_gives_a_moe_auxiliary_loss_zero_weight(make_trainer, tiny_moe_model, normalization):
    """A MoE model's load-balancing loss depends on the tokens forwarded: with every row masked, the one row still
    forwarded (to keep ranks in step) must add nothing, so the router gets zero gradient too."""
    trainer = make_trainer(model=tiny_moe_model, beta=0.1, zero_std_normalization=normalization)
    assert trainer.aux_loss_enabled
    move_policy_away(trainer.model)
    loss, grads = loss_and_grads(trainer, train_batch(trainer, ["1+1=", "4+4="], TIED + ["9", "1", "1 a", "0"]))
    assert loss.item() == 0.0
    assert_all_zero(grads)
    _, mixed = loss_and_grads(trainer, train_batch(trainer, MIXED_PROMPTS, TIED + INFORMATIVE))
    assert grad_norm({k: g for k, g in mixed.items() if "gate" in k}) > 0  # the router trains on trained rows


@pytest.mark.every_trl
@pytest.mark.parametrize("kind", ["grpo", "rloo"])
def test_a_trainer_built_without_init_falls_back_to_trl(make_trainer, kind):
    """TRL's own tests build trainers with ``object.__new__`` and set attributes by hand: our overrides then find no
    package state (class-level defaults) and give TRL's result, outputs and gradients, not an AttributeError."""
    base = stub_generation(make_trainer(kind, ours=False), answer_or_not)
    move_policy_away(base.model)
    bare = object.__new__(OUR_CLASSES[kind][0])
    bare.__dict__.update(base.__dict__)  # TRL's state only: no _init_zero_std
    base.model.train()
    rows = rows_of(base, MIXED_PROMPTS)
    expected, actual = base._generate_and_score_completions(rows), bare._generate_and_score_completions(rows)
    for key in ("advantages", "completion_mask", "completion_ids"):
        torch.testing.assert_close(actual[key], expected[key], msg=key)
    assert "row_role" not in actual
    expected_loss, expected_grads = loss_and_grads(base, expected)
    actual_loss, actual_grads = loss_and_grads(bare, actual)
    torch.testing.assert_close(actual_loss, expected_loss)
    assert_grads_close(actual_grads, expected_grads)


def test_a_trainer_missing_a_hook_cannot_be_built():
    """The adapter's hooks (``trainer.hooks.TrainerHooks``) are abstract: both trainers implement every one, and a
    trainer that leaves one out is refused at construction, naming it."""
    assert not ZeroStdGRPOTrainer.__abstractmethods__ and not ZeroStdRLOOTrainer.__abstractmethods__
    assert len(TrainerHooks.__abstractmethods__) == 10

    class NoAdvantages(ZeroStdGRPOTrainer):
        _advantages = TrainerHooks._advantages

    with pytest.raises(TypeError, match="_advantages"):
        object.__new__(NoAdvantages)
