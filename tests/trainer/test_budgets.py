"""Per-prompt budgets (``per_prompt_budgets``): a tied prompt stops early and its group keeps empty slots, which train
exactly as TRL trains the rows generated (every loss type, both normaliser modes, GRPO and RLOO)."""

from __future__ import annotations

import pytest
import torch

from tests.support.refill import DATA, assert_trains_as_trl, tied_or_informative
from tests.support.trainers import (
    LOSS_TYPES,
    assert_grads_close,
    grad_norm,
    loss_and_grads,
    move_policy_away,
    train_batch,
)

BUDGETS = {"per_prompt_budgets": True, "budget_continue_prob": 1.0}  # a tie stops at its first 2 rows


def stream_in_order(trainer, prompts):
    """The prompt stream's pass starts with ``prompts`` (then the rest of DATA): a budgeted batch draws them."""
    stream = trainer.zero_std.refiller.stream
    order = [DATA.index(p) for p in prompts] + [i for i, p in enumerate(DATA) if p not in prompts]
    stream._cached_epoch, stream._cached = 0, (torch.tensor(order), torch.zeros(len(order)))
    stream.epoch = stream.position = 0


def budgeted_batch(trainer):
    """The batch of a tied prompt ("1+1=": 2 rows, 2 empty slots) and an informative one ("2+3=": 4 rows)."""
    stream_in_order(trainer, ["1+1=", "2+3="])
    return train_batch(trainer, ["1+1=", "2+3="], tied_or_informative)


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_a_budgeted_batch_trains_as_trl_on_the_rows_generated(make_trainer, loss_type):
    """Under "keep", beta = 0 and scale_rewards="none": loss, gradient and tokens equal TRL's on the 6 rows generated
    (TRL with groups of 2: "1+1=" x 2 then "2+3=" x 4, whose advantages are the same), so an empty slot is in no
    normaliser and the tied rows are in TRL's."""
    config = {"beta": 0.0, "scale_rewards": "none", "loss_type": loss_type}
    ours = make_trainer(prompts=DATA, **BUDGETS, **config)
    base = make_trainer(ours=False, prompts=DATA, num_generations=2, per_device_train_batch_size=6, **config)
    for trainer in (ours, base):
        move_policy_away(trainer.model)
    ours_batch = budgeted_batch(ours)
    base_batch = train_batch(base, ["1+1=", "2+3=", "2+3="], tied_or_informative)
    generated = [0, 1, 4, 5, 6, 7]
    for key in ("prompt_ids", "completion_ids", "advantages"):
        torch.testing.assert_close(ours_batch[key][generated], base_batch[key], rtol=0, atol=0, msg=key)
    assert not ours_batch["completion_mask"][2:4].any() and not ours_batch["advantages"][2:4].any()
    assert ours._metrics["train"]["num_tokens"] == base._metrics["train"]["num_tokens"]
    metrics = ours._metrics["train"]
    assert metrics["budget/completions_per_prompt"][-1] == 3.0 and metrics["budget/full_group_frac"][-1] == 0.5
    assert metrics["zero_std/masked_group_frac"][-1] == 0.5  # of the 2 groups, each with a row generated
    ours_loss, ours_grads = loss_and_grads(ours, ours_batch)
    base_loss, base_grads = loss_and_grads(base, base_batch)
    assert grad_norm(base_grads) > 1e-4
    torch.testing.assert_close(ours_loss, base_loss)
    assert_grads_close(ours_grads, base_grads, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("kind", ["grpo", "rloo"])
def test_under_exclude_a_budgeted_batch_trains_as_trl_on_its_informative_group(make_trainer, kind):
    """beta > 0, policy moved, "exclude": the tied prompt's 2 rows and 2 empty slots leave every normaliser and
    statistic, so loss and gradient equal TRL's on "2+3=" alone."""
    ours = make_trainer(kind, prompts=DATA, zero_std_normalization="exclude", beta=0.1, **BUDGETS)
    base = make_trainer(kind, ours=False, prompts=DATA, per_device_train_batch_size=4, beta=0.1)
    for trainer in (ours, base):
        move_policy_away(trainer.model)
    ours_batch = budgeted_batch(ours)
    base_batch = train_batch(base, ["2+3="], tied_or_informative)
    torch.testing.assert_close(ours_batch["advantages"][4:], base_batch["advantages"], rtol=0, atol=0)
    assert_trains_as_trl(ours, ours_batch, base, base_batch)


def test_a_tie_that_goes_on_and_breaks_is_completed(make_trainer):
    """A prompt right on its first 2 rows and wrong on its next: under a uniform prior (P(break) 0.4 >= 0.3) it
    gets 2 more, they differ, and its group of 4 trains; 2 rounds."""

    def late_failure(prompts):
        late_failure.calls += 1
        return ["5" if late_failure.calls == 1 else ("9 z" if i % 2 else "5") for i, _ in enumerate(prompts)]

    late_failure.calls = 0
    trainer = make_trainer(prompts=DATA, per_prompt_budgets=True, budget_continue_prob=0.3)
    stream_in_order(trainer, ["2+3=", "4+4="])
    batch = train_batch(trainer, ["2+3="], late_failure)
    metrics = trainer._metrics["train"]
    assert metrics["budget/rounds"][-1] == 2 and metrics["budget/full_group_frac"][-1] == 1.0
    assert batch["completion_mask"][:4].any(dim=1).all()  # "2+3=": 5, 5, then 9 z, 5: informative, trained


def test_budgets_are_refused_with_dynamic_sampling_and_check_their_step(make_trainer):
    with pytest.raises(ValueError, match="per_prompt_budgets with dynamic_sampling"):
        make_trainer(per_prompt_budgets=True, dynamic_sampling=True)
    with pytest.raises(ValueError, match="budget_step=4 must be below num_generations=4"):
        make_trainer(per_prompt_budgets=True, budget_step=4)
    with pytest.raises(ValueError, match="budget_continue_prob"):
        make_trainer(per_prompt_budgets=True, budget_continue_prob=1.5)
    with pytest.raises(ValueError, match="set per_prompt_budgets=True"):
        make_trainer(budget_step=3)
    with pytest.raises(ValueError, match="budget_continue_prob=0.5 with budget_stop_rule=.yield."):
        make_trainer(per_prompt_budgets=True, budget_stop_rule="yield", budget_continue_prob=0.5)


def test_budgets_read_the_success_rates_without_skipping(make_trainer):
    """``skip_prior_key`` under budgets alone: the histories record every group (its generated rows) and give the
    prior, and no prompt is skipped."""
    trainer = make_trainer(prompts=DATA, skip_prior_key="prompt", **BUDGETS)
    rates = trainer.zero_std.skipper.predictor.rates
    trainer.zero_std.skipper.draw_prob = lambda keys: torch.zeros(len(keys), dtype=torch.float64)  # would skip all
    budgeted_batch(trainer)
    metrics = trainer._metrics["train"]
    assert metrics["prompt_skip/skipped_frac"][-1] == 0.0 and metrics["prompt_skip/prompts_drawn"][-1] == 2
    assert sorted(rates.rows[rates.rows > 0].tolist()) == [2.0, 4.0]  # "1+1=": 2 rows generated; "2+3=": 4


def test_budget_settings_that_cannot_work_are_refused(make_trainer):
    with pytest.raises(ValueError, match="budget_step must be >= 2"):
        make_trainer(per_prompt_budgets=True, budget_step=2.5)
    with pytest.raises(ValueError, match="needs num_generations >= 3"):
        make_trainer(per_prompt_budgets=True, num_generations=2)
    with pytest.raises(ValueError, match="distinct reward function names"):
        make_trainer(zero_std_reward_funcs=["answer_reward", "answer_reward"])
