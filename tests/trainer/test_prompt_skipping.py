"""Prompt skipping through the trainers (``trl_zerostd/sampling/skipping.py``, ``success_rate.py``, ``refill.py``):
skip decisions and the per-prompt success rates, reproducibility, resume, history and prior keys."""

from __future__ import annotations

import pytest
import torch

from tests.support.refill import DATA, DYNAMIC, SKIP, tied_or_informative, trained_groups
from tests.support.trainers import stub_generation, train_batch
from trl_zerostd.sampling.streams import PromptStream
from trl_zerostd.trainer.state import SKIP_STATE_FILE


@pytest.mark.every_trl
@pytest.mark.parametrize("kind", ["grpo", "rloo"])
def test_a_prompt_tied_before_is_skipped_and_its_rates_say_why(make_trainer, kind):
    """ "1+1=" (4 right of 4 each time) is drawn in fewer than half of the quarter of the groups it would get without
    skipping; its rates count every row right and every group tied high, the others' 2 right of 4 per group (the
    evidence unfaded, ``evidence_fade`` 0, so that the counts are exact)."""
    steps = 24
    trainer = make_trainer(kind, prompts=DATA, **SKIP)
    trainer.zero_std.skipper.rates.evidence_fade = 0.0
    drawn = trained_groups(trainer, steps)  # without dynamic sampling: every group generated
    assert len(drawn) == 2 * steps and drawn.count("1+1=") < steps * 2 / 4 / 2
    rates, metrics = trainer.zero_std.skipper.rates, trainer._metrics["train"]
    assert rates.successes[0] == rates.rows[0] > 0
    torch.testing.assert_close(rates.successes[1:], rates.rows[1:] / 2)
    assert rates.one_sided.tolist() == [4.0 * drawn.count("1+1="), 0.0, 0.0, 0.0]  # DATA's rows
    assert rates.split.tolist() == [False, True, True, True]
    assert sum(metrics["prompt_skip/skipped_frac"]) > 0 and len(metrics["prompt_skip/prompts_drawn"]) == steps


def test_skipping_with_dynamic_sampling_generates_fewer_zero_variance_groups(make_trainer):
    """Same data, full informative batches trained, a smaller zero-variance share of the groups generated than under
    dynamic sampling alone (whose first round takes the dataloader's prompts: a seeded pass over DATA, as TRL's
    sampler serves them; a quarter of them tied)."""
    informative_frac = {}
    for name, config in {"dynamic": DYNAMIC, "skip": {**DYNAMIC, **SKIP}}.items():
        trainer, dataloader = make_trainer(prompts=DATA, **config), PromptStream(len(DATA), seed=1)
        for _ in range(24):
            train_batch(trainer, [DATA[i] for i in dataloader.take(2)], tied_or_informative)
        metrics = trainer._metrics["train"]
        assert max(metrics["zero_std/masked_group_frac"]) == 0.0
        informative_frac[name] = sum(metrics["dynamic_sampling/informative_group_frac"]) / 24
    assert 1 - informative_frac["skip"] < 0.5 * (1 - informative_frac["dynamic"])


def test_same_seed_same_skip_decisions(make_trainer):
    runs = []
    for _ in range(2):
        trainer = make_trainer(prompts=DATA, **SKIP)
        runs.append((trained_groups(trainer, 8), trainer.zero_std.skipper.state_dict()))
    assert runs[0][0] == runs[1][0]
    assert runs[0][1]["rates"].keys() == runs[1][1]["rates"].keys()
    for name, value in runs[0][1]["rates"].items():
        assert torch.equal(value, runs[1][1]["rates"][name]), name


@pytest.mark.parametrize("prior_key", [None, "prompt"])
def test_resume_restores_the_success_rates(make_trainer, prior_key):
    config = {**SKIP, "max_steps": 4, "skip_prior_key": prior_key}
    trainer = make_trainer(prompts=DATA, save_strategy="steps", save_steps=3, **config)
    stub_generation(trainer, tied_or_informative)
    trainer.train()
    checkpoint = f"{trainer.args.output_dir}/checkpoint-3"
    saved = torch.load(f"{checkpoint}/{SKIP_STATE_FILE}")
    assert saved["rates"]["rows"].sum() > 0 and saved["rates"]["one_sided"].any()
    assert saved["rates"]["group_counts"].shape == (1 if prior_key is None else len(DATA), 2)
    assert saved["rates"]["group_counts"].sum() > 0
    resumed = make_trainer(prompts=DATA, **config)
    stub_generation(resumed, tied_or_informative)
    resumed.train(resume_from_checkpoint=checkpoint)
    assert resumed.zero_std.refiller.stream.state_dict() == trainer.zero_std.refiller.stream.state_dict()
    expected = trainer.zero_std.skipper.rates.state_dict()
    assert resumed.zero_std.skipper.rates.state_dict().keys() == expected.keys()
    for name, value in resumed.zero_std.skipper.rates.state_dict().items():
        assert torch.equal(value, expected[name]), name


@pytest.mark.parametrize("num_iterations", [1, 2])
def test_each_generation_batch_enters_the_history_once_under_num_iterations(make_trainer, num_iterations):
    """num_iterations=2 (TRL's mu): a generation batch trains two optimizer steps; its groups are drawn and recorded
    once, not once per step, and every step updates the model."""
    config = {**SKIP, "max_steps": 4, "num_iterations": num_iterations}
    trainer = make_trainer(prompts=DATA, logging_steps=1, **config)
    stub_generation(trainer, tied_or_informative)
    recorded, record = [], trainer.zero_std.skipper.record
    trainer.zero_std.skipper.record = lambda keys, *args, **kwargs: (
        recorded.append(list(keys)) or record(keys, *args, **kwargs)
    )
    trainer.train()
    assert len(recorded) == 4 // num_iterations and all(len(keys) == 2 for keys in recorded)
    grad_norms = [entry["grad_norm"] for entry in trainer.state.log_history if "grad_norm" in entry]
    assert len(grad_norms) == 4 and min(grad_norms) > 0


def test_skipping_off_is_dynamic_sampling_alone(make_trainer):
    off = make_trainer(prompts=DATA, skip_zero_std_prompts=False, **DYNAMIC)
    alone = make_trainer(prompts=DATA, **DYNAMIC)
    assert off.zero_std.skipper is None
    for _ in range(3):
        off_batch = train_batch(off, ["1+1=", "2+3="], tied_or_informative)
        alone_batch = train_batch(alone, ["1+1=", "2+3="], tied_or_informative)
        for key in alone_batch:
            assert torch.equal(off_batch[key], alone_batch[key]), key
    assert not any(key.startswith("prompt_skip/") for key in off._metrics["train"])


@pytest.mark.parametrize(
    "setting, value",
    [
        ("skip_min_draw_prob", 0.0),
        ("skip_min_draw_prob", 1.5),
        ("skip_predictor", "success_rate"),  # removed in 0.2: refused even at the value now in force
        ("skip_target_zero_std_frac", 0.25),
        ("skip_refill", True),
    ],
)
def test_bad_skip_settings_are_named(tmp_path, setting, value):
    from trl_zerostd import ZeroStdGRPOConfig

    with pytest.raises(ValueError, match=setting):
        ZeroStdGRPOConfig(
            output_dir=str(tmp_path), use_cpu=True, bf16=False, skip_zero_std_prompts=True, **{setting: value}
        )
    with pytest.raises(ValueError, match="skip_min_draw_prob=0.1 sets the floor.*set skip_zero_std_prompts=True"):
        ZeroStdGRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, skip_min_draw_prob=0.1)


def test_history_key_column_pools_the_rows_that_share_it(make_trainer):
    """skip_history_key="prompt": the two "1+1=" rows share one history, whose tied rows count both rows' draws (the
    evidence unfaded, ``evidence_fade`` 0, so that the count is exact)."""
    prompts = ["1+1=", "1+1=", *DATA[1:]]
    trainer = make_trainer(prompts=prompts, skip_history_key="prompt", **SKIP)
    trainer.zero_std.skipper.rates.evidence_fade = 0.0
    drawn = trained_groups(trainer, 12)
    rates = trainer.zero_std.skipper.rates
    assert len(rates.successes) == len(set(prompts))  # one history per distinct prompt
    assert trainer.zero_std.skipper.slots.tolist() == [0, 0, 1, 2, 3]
    assert not rates.split[0] and rates.one_sided[0] == 4.0 * drawn.count("1+1=") >= 8


def test_history_key_must_name_a_column_and_needs_skipping(make_trainer, tmp_path):
    from trl_zerostd import ZeroStdGRPOConfig

    with pytest.raises(ValueError, match="skip_history_key='level' is not a column"):
        make_trainer(prompts=DATA, skip_history_key="level", **SKIP)
    with pytest.raises(ValueError, match="skip_history_key"):
        ZeroStdGRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, skip_history_key="level")


def test_a_prior_skips_the_never_drawn_rows_of_a_tied_group(make_trainer):
    """skip_prior_key="prompt" on 24 rows of "1+1=" (always tied) and 6 informative rows: once a few "1+1=" groups
    are recorded, the "1+1=" rows never drawn are drawn at their group's rate (about a fifth), not always. Without the
    prior the first pass over the data draws every one of them."""
    prompts = ["1+1="] * 24 + DATA[1:] * 2
    rows_drawn = {}
    for prior_key in (None, "prompt"):
        trainer = make_trainer(prompts=prompts, skip_prior_key=prior_key, **SKIP)
        while trainer.zero_std.refiller.stream.epoch == 0:
            trained_groups(trainer, 1)
        rows_drawn[prior_key] = int((trainer.zero_std.skipper.rates.rows[:24] > 0).sum())
    assert rows_drawn[None] == 24 and rows_drawn["prompt"] <= 12
    never_drawn = (trainer.zero_std.skipper.rates.rows[:24] == 0).nonzero().view(-1)
    probs = trainer.zero_std.skipper.draw_prob(never_drawn).tolist()
    assert len(probs) >= 12 and probs == [probs[0]] * len(probs) and probs[0] < 0.25


def test_prior_key_must_name_a_column_of_a_map_style_dataset(make_trainer, tmp_path):
    from trl_zerostd import ZeroStdGRPOConfig

    with pytest.raises(ValueError, match="skip_prior_key='level' is not a column"):
        make_trainer(prompts=DATA, skip_prior_key="level", **SKIP)
    with pytest.raises(ValueError, match="skip_prior_key='prompt' needs a map-style"):
        make_trainer(prompts=DATA, streaming=True, skip_prior_key="prompt", **SKIP, dynamic_sampling=True)
    config = dict(output_dir=str(tmp_path), use_cpu=True, bf16=False)
    with pytest.raises(ValueError, match="skip_prior_key='prompt' sets the prior of prompt skipping's success rates"):
        ZeroStdGRPOConfig(**config, skip_prior_key="prompt")
    with pytest.raises(ValueError, match="Set one of them"):
        ZeroStdGRPOConfig(**config, skip_zero_std_prompts=True, skip_prior_key="prompt", skip_history_key="prompt")
