"""Dynamic sampling and prompt skipping through the trainers (``trl_zerostd/refill.py``): refill rounds, the cap,
reproducibility, resume, eval identity, the trained batch against TRL's on the same groups, skip decisions and the
per-prompt history."""

from __future__ import annotations

import json
import math

import pytest
import torch
from conftest import (
    assert_all_zero,
    assert_grads_close,
    constant_reward,
    grad_norm,
    loss_and_grads,
    move_policy_away,
    rows_of,
    stub_generation,
    train_batch,
)

from trl_zerostd.sampling import PromptStream
from trl_zerostd.skipping import Outcome, history_key
from trl_zerostd.state import SKIP_STATE_FILE, STATE_FILE

DATA = ["1+1=", "2+3=", "4+4=", "3+5="]  # "1+1=" is always answered right: a tied group; the others are informative
DYNAMIC = {"dynamic_sampling": True, "beta": 0.1}


def tied_or_informative(prompts):
    """Right on every "1+1=" row; elsewhere right and wrong in turn, so a group of 4 has 2 of each."""
    answers = {"1+1=": "2", "2+3=": "5", "4+4=": "8", "3+5=": "8"}
    return [answers[p] if p == "1+1=" or i % 2 else "9 z" for i, p in enumerate(prompts)]


def group_prompts(trainer, batch):
    prompts = trainer.processing_class.batch_decode(batch["prompt_ids"], skip_special_tokens=True)
    return [prompts[i] for i in range(0, len(prompts), trainer.num_generations)]


def assert_trains_as_trl(ours, ours_batch, base, base_batch):
    """Our loss and gradients on ``ours_batch`` equal TRL's on ``base_batch``, and the gradient is not zero."""
    ours_loss, ours_grads = loss_and_grads(ours, ours_batch)
    base_loss, base_grads = loss_and_grads(base, base_batch)
    assert grad_norm(base_grads) > 1e-4
    torch.testing.assert_close(ours_loss, base_loss)
    assert_grads_close(ours_grads, base_grads, rtol=1e-5, atol=1e-7)


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


@pytest.mark.parametrize("kind,screen", [("grpo", 0), ("rloo", 0), ("grpo", 2), ("rloo", 2)])
def test_the_trained_batch_is_trls_on_the_same_groups(make_trainer, kind, screen):
    """The refilled batch trains exactly as TRL trains a batch of the same groups (beta > 0, policy moved); with a
    screen, each group is its 2 screen rows and the 2 generated after them, in that order."""
    ours = make_trainer(kind, prompts=DATA, dynamic_sampling_screen=screen, **DYNAMIC)
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


@pytest.mark.parametrize("kind,screen", [("grpo", 0), ("rloo", 0), ("grpo", 2)])
def test_at_the_cap_the_batch_trains_masked_and_warns_once(make_trainer, kind, screen, caplog):
    """Every group zero-variance: the cap is reached, the batch is completed with masked groups (with a screen, the
    last round generates whole groups for them), a warning names the cap and the informative rate once, and the step
    puts zero gradient (beta > 0, policy moved)."""
    trainer = make_trainer(
        kind, prompts=DATA, reward_funcs=constant_reward, dynamic_sampling_max_rounds=3,
        dynamic_sampling_screen=screen, **DYNAMIC,
    )  # fmt: skip
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


def test_the_cap_can_raise_naming_both_settings(make_trainer):
    trainer = make_trainer(
        prompts=DATA, reward_funcs=constant_reward, dynamic_sampling_max_rounds=2, dynamic_sampling_on_cap="error",
        **DYNAMIC,
    )  # fmt: skip
    with pytest.raises(RuntimeError, match="dynamic_sampling_max_rounds=2.*dynamic_sampling_on_cap='mask'"):
        train_batch(trainer, ["2+3=", "4+4="], tied_or_informative)


def test_a_full_batch_of_informative_groups_is_trls_own(make_trainer):
    """Nothing to refill: one round, the dataloader's groups, as with dynamic_sampling off."""
    on, off = make_trainer(prompts=DATA, **DYNAMIC), make_trainer(prompts=DATA, beta=0.1)
    on_batch = train_batch(on, ["2+3=", "4+4="], tied_or_informative)
    off_batch = train_batch(off, ["2+3=", "4+4="], tied_or_informative)
    assert on._metrics["train"]["dynamic_sampling/rounds"][-1] == 1
    for key in off_batch:
        assert torch.equal(on_batch[key], off_batch[key]), key


@pytest.mark.parametrize("screen", [0, 2])
def test_resume_restores_the_prompt_stream(make_trainer, screen):
    """Resuming from checkpoint-1 restores the refill stream (and the decayed rate that sizes rounds), so step 2
    draws what the uninterrupted run drew."""
    trainer = make_trainer(
        prompts=DATA, max_steps=2, save_strategy="steps", save_steps=1, dynamic_sampling_screen=screen, **DYNAMIC
    )  # fmt: skip
    stub_generation(trainer, tied_or_informative)
    trainer.train()
    checkpoint = f"{trainer.args.output_dir}/checkpoint-1"
    with open(f"{checkpoint}/{STATE_FILE}") as f:
        assert json.load(f)["prompt_stream"] != {"epoch": 0, "position": 0}
    resumed = make_trainer(prompts=DATA, max_steps=2, dynamic_sampling_screen=screen, **DYNAMIC)
    stub_generation(resumed, tied_or_informative)
    resumed.train(resume_from_checkpoint=checkpoint)
    assert resumed.zero_std.refiller.stream.state_dict() == trainer.zero_std.refiller.stream.state_dict()
    assert resumed.zero_std.refiller.informative_history == trainer.zero_std.refiller.informative_history
    for resumed_parameter, parameter in zip(resumed.model.parameters(), trainer.model.parameters(), strict=True):
        torch.testing.assert_close(resumed_parameter, parameter)


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

    with pytest.raises(ValueError, match="dynamic_sampling_max_rounds"):
        ZeroStdGRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, dynamic_sampling_max_rounds=0)
    with pytest.raises(ValueError, match="dynamic_sampling_on_cap"):
        ZeroStdGRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, dynamic_sampling_on_cap="drop")
    screen_errors = {
        "dynamic_sampling_screen=2 screens the prompts of dynamic sampling, which is off": {},
        "dynamic_sampling_screen must be 0 .off. or >= 2": {"dynamic_sampling": True, "dynamic_sampling_screen": 1},
        "dynamic_sampling_screen=2 must be below num_generations=2": {
            "dynamic_sampling": True, "num_generations": 2, "per_device_train_batch_size": 2,
        },
        "dynamic_sampling_screen needs dynamic_sampling_max_rounds >= 2": {
            "dynamic_sampling": True, "dynamic_sampling_max_rounds": 1,
        },
    }  # fmt: skip
    for message, settings in screen_errors.items():
        with pytest.raises(ValueError, match=message):
            ZeroStdGRPOConfig(
                output_dir=str(tmp_path), use_cpu=True, bf16=False, **{"dynamic_sampling_screen": 2, **settings}
            )


def test_a_screen_tied_prompt_gets_no_more_rows(make_trainer):
    """With a screen of 2 (of 4): "1+1=" (always right) is generated 2 rows per draw and never trained; every other
    prompt drawn gets its 2 more rows and trains, in batches of informative groups only."""
    generated = []

    def recording(prompts):
        generated.extend(prompts)
        return tied_or_informative(prompts)

    trainer = make_trainer(prompts=DATA, dynamic_sampling_screen=2, **DYNAMIC)
    trained = []
    for _ in range(6):
        batch = train_batch(trainer, ["1+1=", "2+3="], recording)
        trained += group_prompts(trainer, batch)
        assert trainer._metrics["train"]["zero_std/masked_group_frac"][-1] == 0.0
    assert "1+1=" in generated and "1+1=" not in trained
    leftover = len(generated) - 4 * len(trained)  # rows of screens only: tied, or passed beyond the batch's need
    assert leftover % 2 == 0 and all((generated.count(p) - 4 * trained.count(p)) % 2 == 0 for p in DATA)
    metrics = trainer._metrics["train"]
    assert sum(metrics["dynamic_sampling/generated_groups"]) == len(trained) + leftover // 2
    pass_fracs = metrics["dynamic_sampling/screen_pass_frac"]
    assert len(pass_fracs) == 6 and all(0 < frac <= 1 for frac in pass_fracs) and min(pass_fracs) < 1


def test_a_tied_screen_counts_in_the_skip_history(make_trainer):
    """Under prompt skipping a tied screen is an outcome of its kind: "1+1=" is all-high, once per screen."""
    generated = []

    def recording(prompts):
        generated.extend(prompts)
        return tied_or_informative(prompts)

    trainer = make_trainer(
        prompts=DATA, dynamic_sampling_screen=2, **DYNAMIC, skip_zero_std_prompts=True, skip_predictor="streak"
    )
    for _ in range(6):
        train_batch(trainer, ["2+3=", "4+4="], recording)
    history = trainer.zero_std.skipper.history
    assert history.kind.tolist() == [Outcome.ALL_HIGH, 0, 0, 0]
    assert int(history.streak[0]) == generated.count("1+1=") // 2 > 0


# -- prompt skipping -------------------------------------------------------------------------------------------

SKIP = {"skip_zero_std_prompts": True, "skip_predictor": "streak", "beta": 0.1}


def trained_groups(trainer, steps):
    """The prompts of every group trained in ``steps`` batches (under skipping the dataloader's are not used)."""
    prompts = []
    for _ in range(steps):
        prompts += group_prompts(trainer, train_batch(trainer, ["2+3=", "4+4="], tied_or_informative))
    return prompts


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
    [(None, "streak"), ("prompt", "streak"), ("prompt", "success_rate"), ("prompt", "informative_share")],
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
    if predictor in ("success_rate", "informative_share"):
        assert saved["predictor"]["rates"]["rows"].sum() > 0
        for name, value in resumed.zero_std.skipper.predictor.rates.state_dict().items():
            assert torch.equal(value, trainer.zero_std.skipper.predictor.rates.state_dict()[name]), name
        if predictor == "informative_share":
            assert saved["predictor"]["shares"][:, 1].sum() > 0
            assert torch.equal(
                resumed.zero_std.skipper.predictor.shares.counts, trainer.zero_std.skipper.predictor.shares.counts
            )
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
    with pytest.raises(ValueError, match="skip_prior_key='prompt' sets the prior of prompt skipping, which is off"):
        ZeroStdGRPOConfig(**config, skip_prior_key="prompt")
    with pytest.raises(ValueError, match="Set one of them"):
        ZeroStdGRPOConfig(**config, skip_zero_std_prompts=True, skip_prior_key="prompt", skip_history_key="prompt")


# ---------------------------------------------------------------------------------------------------------------
# skip_refill=False: a skipped prompt's place stays an empty slot
# ---------------------------------------------------------------------------------------------------------------

EMPTY_SLOTS = {**SKIP, "skip_refill": False}


def draw_only(trainer, prompt):
    """The skipper draws ``prompt`` always and every other prompt of DATA never; the stream's next two places are
    ``prompt`` and another (in the stream's order), so the batch of two groups has one empty slot."""
    trainer.zero_std.skipper.draw_prob = lambda rows: (rows == DATA.index(prompt)).double()
    stream = trainer.zero_std.refiller.stream
    place = stream._pass()[0].tolist().index(DATA.index(prompt))
    stream.position = max(place - 1, 0)


@pytest.mark.parametrize("kind", ["grpo", "rloo"])
@pytest.mark.parametrize("normalization", ["keep", "exclude"])
def test_an_empty_slot_trains_as_trl_on_the_groups_generated(make_trainer, kind, normalization):
    """Two places, one skipped: only "2+3=" is generated (TRL's token count), and loss and gradients equal TRL's on
    the batch of that group alone (beta > 0, policy moved; every normaliser, both modes); the empty slot's rows have
    advantage 0, an all-zero mask and no statistic."""
    ours = make_trainer(kind, prompts=DATA, zero_std_normalization=normalization, **EMPTY_SLOTS)
    base = make_trainer(kind, ours=False, prompts=DATA, per_device_train_batch_size=4, beta=0.1)
    for trainer in (ours, base):
        move_policy_away(trainer.model)
    draw_only(ours, "2+3=")
    ours_batch = train_batch(ours, ["2+3=", "4+4="], tied_or_informative)
    base_batch = train_batch(base, ["2+3="], tied_or_informative)
    slot = 0 if ours.zero_std.refiller.stream.position == 1 else 1  # which place held "2+3="
    generated = slice(4 * slot, 4 * slot + 4)
    for key in ("prompt_ids", "completion_ids", "completion_mask", "advantages"):
        torch.testing.assert_close(ours_batch[key][generated], base_batch[key], rtol=0, atol=0, msg=key)
    empty = slice(4 * (1 - slot), 4 * (1 - slot) + 4)
    assert not ours_batch["completion_mask"][empty].any() and not ours_batch["advantages"][empty].any()
    metrics, base_metrics = ours._metrics["train"], base._metrics["train"]
    assert metrics["num_tokens"] == base_metrics["num_tokens"]
    assert metrics["prompt_skip/empty_slot_frac"][-1] == 0.5 and metrics["prompt_skip/skipped_frac"][-1] == 0.5
    assert metrics["zero_std/masked_group_frac"][-1] == 0.0 and metrics["masked/row_frac/unscorable"][-1] == 0.0
    assert metrics["reward"][-1] == base_metrics["reward"][-1]
    logged = list(ours._logs["rewards"]["answer_reward"])[-8:]  # the completions table: no reward for an empty slot
    assert (
        all(math.isnan(reward) for reward in logged[empty])
        and logged[generated] == list(base._logs["rewards"]["answer_reward"])[-4:]
    )
    assert_trains_as_trl(ours, ours_batch, base, base_batch)


def test_an_empty_slot_is_out_of_every_loss_normaliser(make_trainer):
    """Under "keep", each of TRL's GRPO losses normalises by the rows generated only: the gradient equals TRL's on
    the group generated (a normaliser that counted the empty slot's 4 copied rows would halve it)."""
    from conftest import LOSS_TYPES

    for loss_type in LOSS_TYPES:
        ours = make_trainer(prompts=DATA, loss_type=loss_type, **EMPTY_SLOTS)
        base = make_trainer(ours=False, prompts=DATA, loss_type=loss_type, per_device_train_batch_size=4, beta=0.1)
        for trainer in (ours, base):
            move_policy_away(trainer.model)
        draw_only(ours, "4+4=")
        ours_grads = loss_and_grads(ours, train_batch(ours, DATA[:2], tied_or_informative))[1]
        base_grads = loss_and_grads(base, train_batch(base, ["4+4="], tied_or_informative))[1]
        assert grad_norm(base_grads) > 1e-4, loss_type
        assert_grads_close(ours_grads, base_grads, rtol=1e-5, atol=1e-7)


def test_a_step_whose_places_are_all_skipped_generates_its_first(make_trainer):
    """Every place skipped: the first generates (a step trains on something), the second stays empty, and only the
    group generated enters the skip history."""
    trainer = make_trainer(prompts=DATA, **EMPTY_SLOTS)
    skipper, recorded = trainer.zero_std.skipper, []
    skipper.draw_prob = lambda rows: torch.zeros(len(rows), dtype=torch.float64)
    record = skipper.record
    skipper.record = lambda keys, *args: recorded.append(list(keys)) or record(keys, *args)
    first = trainer.zero_std.refiller.stream._pass()[0][0].item()
    batch = train_batch(trainer, DATA[:2], tied_or_informative)
    assert group_prompts(trainer, batch)[0] == DATA[first] and recorded == [[first]]
    assert trainer._metrics["train"]["prompt_skip/empty_slot_frac"][-1] == 0.5


# ---------------------------------------------------------------------------------------------------------------
# Image inputs: refilled rows keep their images
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["grpo", "rloo"])
@pytest.mark.parametrize("skipping", [False, True])
def test_refilled_rows_keep_their_images(tiny_vlm, tmp_path, kind, skipping):
    """Dynamic sampling (and prompt skipping) with images, each prompt its own: the tied group is replaced, and every
    row that trains carries its own prompt's image into the training batch (the pixel values TRL's processor gives
    that image alone), in both VLM layouts (one pixel row per image; patches flat with a grid per image)."""
    from conftest import prompt_image, vlm_batch, vlm_trainer
    from trl.trainer.utils import split_pixel_values_by_grid

    trainer = vlm_trainer(tiny_vlm, tmp_path, kind=kind, prompts=DATA, skip_zero_std_prompts=skipping, **DYNAMIC)
    batch = vlm_batch(trainer, ["1+1=", "2+3="], lambda prompts: VLM_ANSWERS * (len(prompts) // 4))
    tokenizer = trainer.processing_class.tokenizer
    row_prompts = tokenizer.batch_decode(batch["prompt_ids"], skip_special_tokens=True)
    assert "1+1=" not in row_prompts and len(set(row_prompts)) == 2
    assert trainer._metrics["train"]["dynamic_sampling/rounds"][-1] >= 2 or skipping
    image_processor = trainer.processing_class.image_processor
    per_row = split_pixel_values_by_grid(batch)["pixel_values"]
    for prompt, pixels in zip(row_prompts, per_row, strict=True):
        torch.testing.assert_close(pixels, image_processor(prompt_image(prompt), return_tensors="pt")["pixel_values"])


VLM_ANSWERS = ["5 x", "4", "5", "2 yy"]  # the tiny VLM's reward: "1+1=" always right, else odd first character


# ---------------------------------------------------------------------------------------------------------------
# Streaming datasets: refills read the stream; the skip history is keyed by hashed prompts
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["grpo", "rloo"])
def test_streaming_refills_take_the_rows_that_follow_in_the_stream(make_trainer, kind):
    """An IterableDataset (unshuffled): the refill rounds take the stream's rows in order, the tied group is
    replaced, and the stream's position is the count of rows read (what a checkpoint stores)."""
    trainer = make_trainer(kind, prompts=DATA, streaming=True, shuffle_dataset=False, **DYNAMIC)
    batch = train_batch(trainer, ["1+1=", "2+3="], tied_or_informative)
    assert group_prompts(trainer, batch) == ["2+3=", "2+3="]  # the dataloader's, then the stream's 2nd row
    assert trainer.zero_std.refiller.stream.state_dict() == {"epoch": 0, "position": 2}  # round 2 read "1+1=", "2+3="
    batch = train_batch(trainer, ["1+1=", "1+1="], tied_or_informative)
    assert (
        group_prompts(trainer, batch) == ["4+4=", "3+5="]
        and trainer.zero_std.refiller.stream.state_dict()["position"] == 4
    )


@pytest.mark.parametrize("predictor", ["streak", "success_rate"])
def test_streaming_skip_history_is_keyed_by_the_prompt(make_trainer, predictor):
    """Prompt skipping on a stream: outcomes are recorded under the hashed prompt, so a later draw of the same text
    (another pass, or a duplicate row) is skipped by them; nothing is indexed by row."""
    trainer = make_trainer(
        prompts=DATA, streaming=True, shuffle_dataset=False, skip_zero_std_prompts=True, skip_predictor=predictor,
        **DYNAMIC,
    )  # fmt: skip
    train_batch(trainer, ["2+3=", "4+4="], tied_or_informative)  # the stream's first prompt, "1+1=", is tied
    skipper = trainer.zero_std.skipper
    assert skipper.hashed is not None and skipper.slots is None
    key = torch.tensor([history_key("1+1=")])
    assert bool(skipper.hashed.known(key)) and skipper.draw_prob(key).item() < 1.0
    assert skipper.history.kind[skipper.hashed.slots(key)].item() == int(Outcome.ALL_HIGH)
    if predictor == "success_rate":
        slot = skipper.hashed.slots(key)
        assert skipper.predictor.rates.successes[slot].item() == skipper.predictor.rates.rows[slot].item() == 4.0
    assert trainer._metrics["train"]["prompt_skip/hash_evictions"][-1] == 0


def test_streaming_empty_slots_skip_the_hashed_prompt_and_train_the_rest(make_trainer):
    """skip_refill=False on a stream: "1+1=" (the stream's first row, hashed) is skipped and its place stays empty;
    "2+3=" generates and trains; the stream moved by the batch's two places."""
    trainer = make_trainer(prompts=DATA, streaming=True, shuffle_dataset=False, **EMPTY_SLOTS)
    tied = history_key("1+1=")
    trainer.zero_std.skipper.draw_prob = lambda keys: (keys != tied).double()
    batch = train_batch(trainer, ["2+3=", "4+4="], tied_or_informative)
    assert group_prompts(trainer, batch)[1] == "2+3=" and not batch["completion_mask"][:4].any()
    assert batch["completion_mask"][4:].sum() > 0 and trainer.zero_std.refiller.stream.state_dict()["position"] == 2
    assert trainer._metrics["train"]["prompt_skip/empty_slot_frac"][-1] == 0.5


def test_streaming_skipping_names_a_missing_key_field(make_trainer):
    trainer = make_trainer(
        prompts=DATA, streaming=True, skip_zero_std_prompts=True, skip_history_key="level", **DYNAMIC
    )
    with pytest.raises(ValueError, match="'level' field of each streamed row"):
        train_batch(trainer, ["2+3=", "4+4="], tied_or_informative)


# ---------------------------------------------------------------------------------------------------------------
# environment_factory: episodes through TRL's tool loop, refilled
# ---------------------------------------------------------------------------------------------------------------

TASKS = ["win", "lose", "coin", "coin2"]  # "win": always solved, "lose": never (tied groups); "coin*": half the rows


class SubmitEnvironment:
    """One episode per rollout: the prompt gets the task as an observation; the model calls ``submit``; the reward is
    whether the answer (always 5) was right. Which rows submit what is set by the stubbed generation, per task."""

    def reset(self, **row) -> str:
        self.task, self.solved = row["task"], False
        return f" [{row['task']}]"

    def submit(self, answer: int) -> str:
        """Submit the final answer.

        Args:
            answer: The answer to the task.
        """
        self.solved = answer == 5
        return "ok"

    def get_reward(self) -> float:
        return float(self.solved)


def submit_calls(prompts: list[str]) -> list[str]:
    """The stubbed model: a tool call whose answer is right on "win" rows, wrong on "lose" rows, right on every
    other "coin" row; after the tool's response, "done". A prompt without an observation has no task: an error."""
    completions = []
    for i, prompt in enumerate(prompts):
        if '"arguments": {"answer"' in prompt:  # the tool loop's continuation after the tool's response
            completions.append("done")
            continue
        task = next(task for task in ("coin2", "coin", "win", "lose") if f"[{task}]" in prompt)
        answer = 5 if task == "win" or (task.startswith("coin") and i % 2) else 4
        completions.append(f'<tool_call>\n{{"name": "submit", "arguments": {{"answer": {answer}}}}}\n</tool_call>')
    return completions


@pytest.mark.parametrize("skipping", [False, True])
def test_environment_episodes_refill_with_their_environments(tiny_tool_model_dir, tmp_path, skipping):
    """environment_factory with dynamic sampling (and prompt skipping): the refill rounds' prompts get their
    environment's observation, each rollout's tool call reaches its own environment, and the batch that trains holds
    the informative "coin" groups only, with the environment's rewards."""
    from datasets import Dataset
    from transformers import PreTrainedTokenizerFast

    from trl_zerostd import ZeroStdGRPOConfig, ZeroStdGRPOTrainer

    dataset = Dataset.from_dict({"prompt": [[{"role": "user", "content": f"task {t}"}] for t in TASKS], "task": TASKS})
    args = ZeroStdGRPOConfig(
        output_dir=str(tmp_path), per_device_train_batch_size=8, num_generations=4, max_completion_length=96,
        max_steps=1, report_to="none", use_cpu=True, bf16=False, seed=0, shuffle_dataset=False,
        skip_zero_std_prompts=skipping, **DYNAMIC,
    )  # fmt: skip
    trainer = ZeroStdGRPOTrainer(
        model=tiny_tool_model_dir, reward_funcs=[], args=args, train_dataset=dataset,
        processing_class=PreTrainedTokenizerFast.from_pretrained(tiny_tool_model_dir),
        environment_factory=SubmitEnvironment,
    )  # fmt: skip
    stub_generation(trainer, submit_calls)
    trainer.model.train()
    rows = [dict(dataset[i]) for i in (0, 1) for _ in range(4)]  # "win" and "lose": both tied
    batch = trainer._generate_and_score_completions(rows)
    prompts = trainer.processing_class.batch_decode(batch["prompt_ids"], skip_special_tokens=True)
    assert all("[coin" in prompt for prompt in prompts)
    assert trainer._metrics["train"]["zero_std/masked_group_frac"][-1] == 0.0
    rewards = trainer._metrics["train"]["rewards/SubmitEnvironment/mean"][-1]
    assert rewards == 0.5 and (batch["advantages"] != 0).all()
    assert trainer._metrics["train"]["dynamic_sampling/rounds"][-1] >= 2 or skipping


def test_prompt_skipping_refuses_an_environment_that_makes_every_prompt(tiny_tool_model_dir, tmp_path):
    """With no train_dataset the environment's reset() makes every prompt (TRL fills in placeholder rows): there is
    no prompt to keep a history of, and the error says so; dynamic sampling alone is accepted."""
    from transformers import PreTrainedTokenizerFast

    from trl_zerostd import ZeroStdGRPOConfig, ZeroStdGRPOTrainer

    def build(**features):
        args = ZeroStdGRPOConfig(
            output_dir=str(tmp_path), per_device_train_batch_size=8, num_generations=4, max_steps=1,
            report_to="none", use_cpu=True, bf16=False, **features,
        )  # fmt: skip
        return ZeroStdGRPOTrainer(
            model=tiny_tool_model_dir, reward_funcs=[], args=args,
            processing_class=PreTrainedTokenizerFast.from_pretrained(tiny_tool_model_dir),
            environment_factory=SubmitEnvironment,
        )  # fmt: skip

    assert build(dynamic_sampling=True).zero_std.skipper is None
    with pytest.raises(ValueError, match="skip_zero_std_prompts needs a train_dataset that names its prompts"):
        build(dynamic_sampling=True, skip_zero_std_prompts=True)
