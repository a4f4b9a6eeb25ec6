"""Dynamic sampling through the trainers (``trl_zerostd/sampling/refill.py``): refill rounds, the cap, reproducibility,
resume, eval identity, the skip history it feeds and the trained batch against TRL's on the same groups."""

from __future__ import annotations

import json

import pytest
import torch

from tests.support.refill import DATA, DYNAMIC, assert_trains_as_trl, group_prompts, tied_or_informative
from tests.support.trainers import (
    assert_all_zero,
    constant_reward,
    loss_and_grads,
    move_policy_away,
    rows_of,
    stub_generation,
    train_batch,
)
from trl_zerostd.trainer.state import STATE_FILE


@pytest.mark.parametrize("kind", ["grpo", "rloo"])
def test_tied_groups_are_replaced_by_informative_ones(make_trainer, kind):
    trainer = make_trainer(kind, prompts=DATA, **DYNAMIC)
    batch = train_batch(trainer, ["1+1=", "2+3="], tied_or_informative)
    assert "1+1=" not in group_prompts(trainer, batch)
    assert batch["completion_mask"].view(2, 4, -1).sum(dim=(1, 2)).min() > 0  # no wholly masked group
    assert trainer._metrics["train"]["zero_std/masked_group_frac"][-1] == 0.0
    metrics = trainer._metrics["train"]
    assert metrics["dynamic_sampling/rounds"][-1] >= 2 and metrics["dynamic_sampling/dropped_groups"][-1] >= 1
    assert metrics["dynamic_sampling/cap_reached"][-1] == 0.0
    assert list(trainer._logs["prompt"])[-8:] == [p for p in group_prompts(trainer, batch) for _ in range(4)]


@pytest.mark.every_trl
@pytest.mark.parametrize("kind", ["grpo", "rloo"])
def test_the_trained_batch_is_trls_on_the_same_groups(make_trainer, kind):
    """The refilled batch trains exactly as TRL trains a batch of the same groups (beta > 0, policy moved)."""
    ours = make_trainer(kind, prompts=DATA, **DYNAMIC)
    base = make_trainer(kind, ours=False, prompts=DATA, beta=0.1)
    for trainer in (ours, base):
        move_policy_away(trainer.model)
    ours_batch = train_batch(ours, ["1+1=", "2+3="], tied_or_informative)
    base_batch = train_batch(base, group_prompts(ours, ours_batch), tied_or_informative)
    for key in ("prompt_ids", "completion_ids", "completion_mask", "advantages"):
        assert torch.equal(ours_batch[key], base_batch[key]), key
    assert_trains_as_trl(ours, ours_batch, base, base_batch)


def test_same_seed_same_batches(make_trainer):
    batches = []
    for _ in range(2):
        trainer = make_trainer(prompts=DATA, **DYNAMIC)
        batches.append([train_batch(trainer, ["1+1=", "1+1="], tied_or_informative)["prompt_ids"] for _ in range(3)])
    for first, second in zip(*batches, strict=True):
        assert torch.equal(first, second)


@pytest.mark.parametrize("kind", ["grpo", "rloo"])
def test_at_the_cap_the_batch_trains_masked_and_warns_once(make_trainer, kind, caplog):
    """Every group zero-variance: the cap is reached, the batch is completed with masked groups, a warning names the
    cap and the informative rate once, and the step puts zero gradient (beta > 0, policy moved)."""
    trainer = make_trainer(kind, prompts=DATA, reward_funcs=constant_reward, dynamic_sampling_max_rounds=3, **DYNAMIC)
    move_policy_away(trainer.model)
    with caplog.at_level("WARNING", logger="trl_zerostd"):
        batches = [train_batch(trainer, ["2+3=", "4+4="], tied_or_informative) for _ in range(2)]
    warnings = [r.getMessage() for r in caplog.records if "dynamic_sampling_max_rounds=3" in r.getMessage()]
    assert len(warnings) == 1 and "informative rate 0.0%" in warnings[0]
    metrics = trainer._metrics["train"]
    assert metrics["dynamic_sampling/cap_reached"][-2:] == [1.0, 1.0] and metrics["dynamic_sampling/rounds"][-1] == 3
    assert not batches[-1]["completion_mask"].any()
    loss, grads = loss_and_grads(trainer, batches[-1])
    assert loss.item() == 0.0
    assert_all_zero(grads)


def test_a_full_batch_of_informative_groups_is_trls_own(make_trainer):
    """Nothing to refill: one round, the dataloader's groups, as with dynamic_sampling off."""
    on, off = make_trainer(prompts=DATA, **DYNAMIC), make_trainer(prompts=DATA, beta=0.1)
    on_batch = train_batch(on, ["2+3=", "4+4="], tied_or_informative)
    off_batch = train_batch(off, ["2+3=", "4+4="], tied_or_informative)
    assert on._metrics["train"]["dynamic_sampling/rounds"][-1] == 1
    for key in off_batch:
        assert torch.equal(on_batch[key], off_batch[key]), key


def test_resume_restores_the_prompt_stream(make_trainer):
    """Resuming from checkpoint-1 restores the refill stream (and the decayed rate that sizes rounds), so step 2
    draws what the uninterrupted run drew."""
    trainer = make_trainer(prompts=DATA, max_steps=2, save_strategy="steps", save_steps=1, **DYNAMIC)
    stub_generation(trainer, tied_or_informative)
    trainer.train()
    checkpoint = f"{trainer.args.output_dir}/checkpoint-1"
    with open(f"{checkpoint}/{STATE_FILE}") as f:
        assert json.load(f)["prompt_stream"] != {"epoch": 0, "position": 0}
    resumed = make_trainer(prompts=DATA, max_steps=2, **DYNAMIC)
    stub_generation(resumed, tied_or_informative)
    resumed.train(resume_from_checkpoint=checkpoint)
    assert resumed.zero_std.refiller.stream.state_dict() == trainer.zero_std.refiller.stream.state_dict()
    assert resumed.zero_std.refiller.informative_history == trainer.zero_std.refiller.informative_history
    for resumed_parameter, parameter in zip(resumed.model.parameters(), trainer.model.parameters(), strict=True):
        torch.testing.assert_close(resumed_parameter, parameter)


@pytest.mark.every_trl
@pytest.mark.parametrize("setting", ["dynamic_sampling", "skip_zero_std_prompts"])
def test_eval_is_untouched(make_trainer, setting):
    trainers = [make_trainer(ours=ours, prompts=DATA, beta=0.1, **({setting: True} if ours else {}))
                for ours in (False, True)]  # fmt: skip
    outputs = []
    for trainer in trainers:
        stub_generation(trainer, tied_or_informative)
        trainer.model.eval()
        outputs.append(trainer._generate_and_score_completions(rows_of(trainer, ["1+1=", "2+3="])))
    for key in outputs[0]:
        assert torch.equal(outputs[0][key], outputs[1][key]), key


def test_bad_settings_are_named(make_trainer, tmp_path):
    from trl_zerostd import ZeroStdGRPOConfig

    base = dict(output_dir=str(tmp_path), use_cpu=True, bf16=False)
    with pytest.raises(ValueError, match="dynamic_sampling_max_rounds"):
        ZeroStdGRPOConfig(**base, dynamic_sampling=True, dynamic_sampling_max_rounds=0)
    with pytest.raises(ValueError, match="dynamic_sampling_max_rounds=5 caps the rounds.*set dynamic_sampling=True"):
        ZeroStdGRPOConfig(**base, dynamic_sampling_max_rounds=5)
    for removed, value in (("dynamic_sampling_on_cap", "error"), ("dynamic_sampling_screen", 2)):
        with pytest.raises(ValueError, match=f"sets \\['{removed}'\\], removed in trl-zerostd 0.2"):
            ZeroStdGRPOConfig(**base, dynamic_sampling=True, **{removed: value})


def test_every_group_generated_counts_in_the_skip_history(make_trainer):
    """With prompt skipping, every group dynamic sampling generated, the dropped tied ones too, counts in the success
    rates: "1+1=" (always right) ties high on all its rows and never splits; the others split."""
    generated = []

    def recording(prompts):
        generated.extend(prompts)
        return tied_or_informative(prompts)

    trainer = make_trainer(prompts=DATA, **DYNAMIC, skip_zero_std_prompts=True)
    trained = []
    for _ in range(6):
        trained += group_prompts(trainer, train_batch(trainer, ["2+3=", "4+4="], recording))
    rates = trainer.zero_std.skipper.rates
    assert generated.count("1+1=") > 0 and "1+1=" not in trained
    assert rates.one_sided.tolist() == [generated.count("1+1="), 0.0, 0.0, 0.0]
    assert rates.split.tolist() == [False, True, True, True]
