"""Prompt skipping through the trainers (``trl_zerostd/skipping.py``, ``refill.py``): skip decisions and the
per-prompt history, the predictors, reproducibility, resume, history and prior keys."""

from __future__ import annotations

import pytest
import torch

from tests.support.refill import DATA, DYNAMIC, SKIP, tied_or_informative, trained_groups
from tests.support.trainers import stub_generation, train_batch
from trl_zerostd.sampling import PromptStream
from trl_zerostd.skipping import Outcome
from trl_zerostd.state import SKIP_STATE_FILE


@pytest.mark.parametrize("kind", ["grpo", "rloo"])
def test_a_prompt_tied_before_is_skipped_and_its_history_says_why(make_trainer, kind):
    """ "1+1=" is always all right: after its first draws it is skipped (at p ** streak), the others never are."""
    steps = 24
    trainer = make_trainer(kind, prompts=DATA, **SKIP)
    drawn = trained_groups(trainer, steps)  # without dynamic sampling: every group generated
    assert len(drawn) == 2 * steps
    assert drawn.count("1+1=") < steps * 2 / 4 / 2  # a quarter of the draws without skipping
    history, metrics = trainer.zero_std.skipper.history, trainer._metrics["train"]
    assert history.kind.tolist() == [Outcome.ALL_HIGH, 0, 0, 0]  # DATA's rows; 0: informative
    assert int(history.streak[0]) == drawn.count("1+1=")
    assert sum(metrics["prompt_skip/skipped_frac"]) > 0 and len(metrics["prompt_skip/prompts_drawn"]) == steps
    explore = (
        trainer.zero_std.skipper.predictor.explore
    )  # each kind steered by its own share: no group was ever all-low
    assert explore.share_all_low == 0.0 < explore.share_all_high
    assert metrics["prompt_skip/explore_prob_all_low"][-1] == pytest.approx(0.5 + 0.01 * steps)


@pytest.mark.parametrize("kind", ["grpo", "rloo"])
def test_the_success_rate_skips_a_prompt_always_right_and_counts_every_row(make_trainer, kind):
    """skip_predictor="success_rate": "1+1=" (4 right of 4 each time) is drawn in fewer than half of the quarter of
    the groups it would get without skipping; the others' rates count 2 right of 4 per group, "1+1="'s 4 of 4."""
    steps = 24
    trainer = make_trainer(kind, prompts=DATA, **{**SKIP, "skip_predictor": "success_rate"})
    drawn = trained_groups(trainer, steps)
    assert len(drawn) == 2 * steps and drawn.count("1+1=") < steps * 2 / 4 / 2
    rates, metrics = trainer.zero_std.skipper.predictor.rates, trainer._metrics["train"]
    assert rates.successes[0] == rates.rows[0] > 0
    torch.testing.assert_close(rates.successes[1:], rates.rows[1:] / 2)
    assert "prompt_skip/explore_prob_all_low" not in metrics and len(metrics["prompt_skip/prompts_drawn"]) == steps


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
    assert torch.equal(runs[0][1]["history"]["streak"], runs[1][1]["history"]["streak"])
    assert runs[0][1]["predictor"] == runs[1][1]["predictor"]


@pytest.mark.parametrize(
    "prior_key, predictor",
    [(None, "streak"), ("prompt", "streak"), ("prompt", "success_rate")],
)
def test_resume_restores_the_history_and_the_exploration_probabilities(make_trainer, prior_key, predictor):
    config = {**SKIP, "max_steps": 4, "skip_prior_key": prior_key, "skip_predictor": predictor}
    trainer = make_trainer(prompts=DATA, save_strategy="steps", save_steps=3, **config)
    stub_generation(trainer, tied_or_informative)
    trainer.train()
    checkpoint = f"{trainer.args.output_dir}/checkpoint-3"
    saved = torch.load(f"{checkpoint}/{SKIP_STATE_FILE}")
    assert saved["history"]["streak"].sum() > 0
    resumed = make_trainer(prompts=DATA, **config)
    stub_generation(resumed, tied_or_informative)
    resumed.train(resume_from_checkpoint=checkpoint)
    assert torch.equal(resumed.zero_std.skipper.history.streak, trainer.zero_std.skipper.history.streak)
    assert torch.equal(resumed.zero_std.skipper.history.kind, trainer.zero_std.skipper.history.kind)
    assert resumed.zero_std.refiller.stream.state_dict() == trainer.zero_std.refiller.stream.state_dict()
    if predictor == "streak":
        assert resumed.zero_std.skipper.predictor.explore == trainer.zero_std.skipper.predictor.explore
    if predictor == "success_rate":
        assert saved["predictor"]["rates"]["rows"].sum() > 0
        for name, value in resumed.zero_std.skipper.predictor.rates.state_dict().items():
            assert torch.equal(value, trainer.zero_std.skipper.predictor.rates.state_dict()[name]), name
    elif prior_key is not None:
        assert saved["predictor"]["prior"]["counts"].sum() > 0
        assert torch.equal(
            resumed.zero_std.skipper.predictor.prior.counts, trainer.zero_std.skipper.predictor.prior.counts
        )


@pytest.mark.parametrize("num_iterations", [1, 2])
def test_each_generation_batch_enters_the_history_once_under_num_iterations(make_trainer, num_iterations):
    """num_iterations=2 (TRL's mu): a generation batch trains two optimizer steps; its groups are drawn and recorded
    once, not once per step, and every step updates the model."""
    config = {**SKIP, "max_steps": 4, "skip_predictor": "success_rate", "num_iterations": num_iterations}
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
        ("skip_target_zero_std_frac", -0.1),
        ("skip_predictor", "streaks"),
        ("skip_predictor", "streak"),  # with skipping off
        ("skip_refill", False),  # with skipping off
    ],
)
def test_bad_skip_settings_are_named(tmp_path, setting, value):
    from trl_zerostd import ZeroStdGRPOConfig

    with pytest.raises(ValueError, match=setting):
        ZeroStdGRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, **{setting: value})


def test_history_key_column_pools_the_rows_that_share_it(make_trainer):
    """skip_history_key="prompt": the two "1+1=" rows share one history, whose streak counts both rows' draws."""
    prompts = ["1+1=", "1+1=", *DATA[1:]]
    trainer = make_trainer(prompts=prompts, skip_history_key="prompt", **SKIP)
    drawn = trained_groups(trainer, 12)
    history = trainer.zero_std.skipper.history
    assert len(history.kind) == len(set(prompts))  # one history per distinct prompt
    assert trainer.zero_std.skipper.slots.tolist() == [0, 0, 1, 2, 3]
    assert int(history.kind[0]) == Outcome.ALL_HIGH and int(history.streak[0]) == drawn.count("1+1=") >= 2


def test_history_key_must_name_a_column_and_needs_skipping(make_trainer, tmp_path):
    from trl_zerostd import ZeroStdGRPOConfig

    with pytest.raises(ValueError, match="skip_history_key='level' is not a column"):
        make_trainer(prompts=DATA, skip_history_key="level", **SKIP)
    with pytest.raises(ValueError, match="skip_history_key"):
        ZeroStdGRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, skip_history_key="level")


def test_a_prior_skips_the_never_drawn_rows_of_a_tied_group(make_trainer):
    """skip_prior_key="prompt" on 24 rows of "1+1=" (always tied) and 6 informative rows: once a few "1+1=" groups
    are recorded, the "1+1=" rows never drawn are drawn at the floor rate, not always. Without the prior the first
    pass over the data draws every one of them."""
    prompts = ["1+1="] * 24 + DATA[1:] * 2
    rows_drawn = {}
    for prior_key in (None, "prompt"):
        trainer = make_trainer(prompts=prompts, skip_prior_key=prior_key, **SKIP)
        while trainer.zero_std.refiller.stream.epoch == 0:
            trained_groups(trainer, 1)
        rows_drawn[prior_key] = int((trainer.zero_std.skipper.history.streak[:24] > 0).sum())
    assert rows_drawn[None] == 24 and rows_drawn["prompt"] <= 12
    never_drawn = (trainer.zero_std.skipper.history.streak[:24] == 0).nonzero().view(-1)
    assert trainer.zero_std.skipper.draw_prob(never_drawn).tolist() == [
        trainer.zero_std.settings.skip_min_draw_prob
    ] * len(never_drawn)


def test_prior_key_must_name_a_column_of_a_map_style_dataset(make_trainer, tmp_path):
    from trl_zerostd import ZeroStdGRPOConfig

    with pytest.raises(ValueError, match="skip_prior_key='level' is not a column"):
        make_trainer(prompts=DATA, skip_prior_key="level", **SKIP)
    with pytest.raises(ValueError, match="skip_prior_key='prompt' needs a map-style"):
        make_trainer(prompts=DATA, streaming=True, skip_prior_key="prompt", **SKIP, dynamic_sampling=True)
    config = dict(output_dir=str(tmp_path), use_cpu=True, bf16=False)
    with pytest.raises(ValueError, match="skip_prior_key='prompt' sets the prior of the prompt histories, which are"):
        ZeroStdGRPOConfig(**config, skip_prior_key="prompt")
    with pytest.raises(ValueError, match="Set one of them"):
        ZeroStdGRPOConfig(**config, skip_zero_std_prompts=True, skip_prior_key="prompt", skip_history_key="prompt")
