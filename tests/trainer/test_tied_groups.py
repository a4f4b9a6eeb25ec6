"""``tied_group_entropy_scale`` (RL-ZVP's entropy-shaped advantages on tied groups) against a hand computation
of its loss on a policy moved off the reference (the formula is written out here, from the model's logits); eval
untouched."""

from __future__ import annotations

import pytest
import torch

from tests.support.trainers import (
    INFORMATIVE,
    LOSS_TYPES,
    TIED,
    assert_eval_is_trls,
    assert_grads_close,
    grad_norm,
    loss_and_grads,
    move_policy_away,
    table_reward,
    train_batch,
)
from trl_zerostd import core

FAILED = ["9", "1", "1 a", "0 b"]  # every answer to "1+1=" wrong: a group tied at the low end
THREE_PROMPTS = ["1+1=", "1+1=", "2+3="]  # failed, all-correct, informative
REWARDS = torch.tensor([0.0] * 4 + [1.0] * 4 + [1.0, 0.0, 1.0, 0.0])  # of FAILED + TIED + INFORMATIVE
SCALE, BETA = 0.5, 0.1


UNSCORABLE = "5 u"  # an answer to "2+3=" the reward function cannot score (None): a row this package masks
# the answers' rewards as answer_reward gives them; UNSCORABLE is missing from the table, so it scores None
ANSWER_OR_NONE = table_reward(dict(zip(FAILED + TIED + INFORMATIVE, REWARDS.tolist(), strict=True)))


def tied_batch(trainer, informative=INFORMATIVE):
    trainer.zero_std.reward_range = (0.0, 1.0)  # as seen earlier in training: the first group failed
    return train_batch(trainer, THREE_PROMPTS, FAILED + TIED + informative)


def shape_tied_rows(advantages: torch.Tensor, entropy: torch.Tensor, scale: float) -> None:
    """RL-ZVP's token advantages written into rows 0-3 (all wrong: -scale * (max_k H(k) - H(t))) and 4-7 (all right:
    +scale * H(t)) of the ``(B, T)`` ``advantages``, from the ``(B, T)`` entropy over the loss tokens (0 elsewhere)."""
    advantages[4:8] = scale * entropy[4:8]
    advantages[:4] = -scale * (entropy[:4].amax(dim=1, keepdim=True) - entropy[:4])


def hand_loss(
    trainer, batch, loss_type: str, tied_scale: float, rewards=REWARDS, normalization="keep"
) -> torch.Tensor:  # fmt: skip
    """GRPO's loss (one optimizer step, num_iterations=1: importance ratio exp(logp - logp.detach()) = 1) on the
    three groups: informative rows get (r - mean) / (std + 1e-4) over their group's scored rows, the tied rows
    RL-ZVP's token advantages, +scale * H(t) (all right) and -scale * (max_k H(k) - H(t)) (all wrong), H the policy's
    token entropy read as a constant; every scored row adds beta * ratio * KL(t) against the reference (TRL 1.16's
    default use_bias_correction_kl: the ratio's gradient makes it the unbiased reverse-KL gradient). An unscorable
    row (NaN in ``rewards``) is out of the loss; under "keep" it still counts in the normalisers (a row of the mean
    for grpo, its tokens in num_items_in_batch for dapo), under "exclude" it leaves them."""
    prompt_ids, completion_ids = batch["prompt_ids"], batch["completion_ids"]
    all_tokens = batch["base_loss_mask"].float()  # every row's completion tokens, the masked row's included
    scored = ~torch.isnan(rewards)
    mask = all_tokens * scored.unsqueeze(1)
    input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
    attention_mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
    length = completion_ids.shape[1]

    def token_logps(model):
        logits = model(input_ids=input_ids, attention_mask=attention_mask).logits[:, -length - 1 : -1]
        log_probs = torch.log_softmax(logits.float() / trainer.temperature, dim=-1)
        return log_probs.gather(-1, completion_ids.unsqueeze(-1)).squeeze(-1), log_probs

    logps, log_probs = token_logps(trainer.model)
    with torch.no_grad():
        ref_logps, _ = token_logps(trainer.ref_model)
        entropy = -(log_probs.exp() * log_probs).sum(-1) * mask
    informative = rewards[8:][scored[8:]]
    advantages = torch.zeros_like(mask)
    advantages[8:][scored[8:]] = ((informative - informative.mean()) / (informative.std() + 1e-4)).unsqueeze(1)
    shape_tied_rows(advantages, entropy, tied_scale)
    ratio = torch.exp(logps - logps.detach())
    kl = torch.exp(ref_logps - logps) - (ref_logps - logps) - 1
    per_token = -ratio * advantages + BETA * ratio * kl
    rows = scored if normalization == "exclude" else torch.ones_like(scored)
    if loss_type == "grpo":
        return ((per_token * mask).sum(1) / mask.sum(1).clamp(min=1))[rows].mean()
    return (per_token * mask).sum() / all_tokens[rows].sum()  # dapo: num_items_in_batch, one micro-batch


@pytest.mark.parametrize("loss_type", ["grpo", "dapo"])
def test_entropy_signal_gradient_is_the_hand_computed_one(make_trainer, loss_type):
    ours = make_trainer(
        beta=BETA, loss_type=loss_type, per_device_train_batch_size=12,
        tied_group_entropy_scale=SCALE,
    )  # fmt: skip
    move_policy_away(ours.model)
    batch = tied_batch(ours)
    assert batch["tied_sign"].tolist() == [-1.0] * 4 + [1.0] * 4 + [0.0] * 4
    assert torch.equal(batch["advantages"][:8], torch.zeros(8))  # filled at the loss, from its forward's entropies
    assert (batch["row_role"] == 3).all()  # every row trains
    _, ours_grads = loss_and_grads(ours, dict(batch))

    expected = {}
    for tied_scale in (SCALE, 0.0):
        ours.model.zero_grad(set_to_none=True)
        hand_loss(ours, batch, loss_type, tied_scale).backward()
        expected[tied_scale] = {name: p.grad.clone() for name, p in ours.model.named_parameters()}
    assert_grads_close(ours_grads, expected[SCALE], rtol=1e-4, atol=1e-7)
    without = {name: expected[SCALE][name] - expected[0.0][name] for name in ours_grads}
    assert grad_norm(without) > 1e-3 * grad_norm(expected[SCALE])  # the tied rows' signal is in the gradient


@pytest.mark.every_trl
@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_entropy_signal_trains_as_trl_on_the_shaped_token_advantages(make_trainer, loss_type):
    """Under each of TRL's losses, the gradient is TRL's own on the same batch once its tied rows' advantages are the
    ``(B, T)`` entropy-shaped ones (TRL 1.16's loss takes token advantages): +scale * H(t) all right,
    -scale * (max_k H(k) - H(t)) all wrong, H the entropy of TRL's policy forward over the loss tokens."""
    config = dict(beta=BETA, loss_type=loss_type, per_device_train_batch_size=12)
    ours = make_trainer(tied_group_entropy_scale=SCALE, **config)
    base = make_trainer(ours=False, **config)
    for trainer in (ours, base):
        move_policy_away(trainer.model)
    batch = tied_batch(ours)
    base_batch = train_batch(base, THREE_PROMPTS, FAILED + TIED + INFORMATIVE)
    assert torch.equal(base_batch["advantages"], batch["advantages"])  # the tied rows' 0 in both
    prompt_completion = torch.cat([base_batch["prompt_ids"], base_batch["completion_ids"]], dim=1)
    attention = torch.cat([base_batch["prompt_mask"], base_batch["completion_mask"]], dim=1)
    with torch.no_grad():
        _, entropy, _ = base._get_per_token_logps_and_entropies(
            base.model, prompt_completion, attention, base_batch["completion_ids"].shape[1], compute_entropy=True
        )
    entropy = entropy * base_batch["completion_mask"]
    advantages = base_batch["advantages"].unsqueeze(1).expand_as(entropy).clone()
    shape_tied_rows(advantages, entropy, SCALE)
    base_batch["advantages"] = advantages
    ours_loss, ours_grads = loss_and_grads(ours, dict(batch))
    base_loss, base_grads = loss_and_grads(base, base_batch)
    assert grad_norm(base_grads) > 1e-4
    torch.testing.assert_close(ours_loss, base_loss, rtol=1e-5, atol=1e-7)
    assert_grads_close(ours_grads, base_grads, rtol=1e-5, atol=1e-7)


@pytest.mark.every_trl
@pytest.mark.parametrize("level", ["token", "sequence"])
def test_without_a_tied_group_the_signal_trains_and_logs_as_trl(make_trainer, level):
    """A batch of informative groups only, off-policy so that the clipping acts: the loss, the gradient and every
    metric TRL logs are TRL's, so TRL's row-shaped metrics (sequence-level clip ratios) keep their meaning where no
    row is shaped."""
    prompts, completions = ["2+3=", "1+1="], INFORMATIVE + ["2", "9", "2 a", "1"]
    config = dict(beta=BETA, loss_type="grpo", importance_sampling_level=level)
    ours = make_trainer(tied_group_entropy_scale=SCALE, **config)
    base = make_trainer(ours=False, **config)
    results = []
    for trainer in (ours, base):
        move_policy_away(trainer.model)
        batch = train_batch(trainer, prompts, completions)
        batch["old_per_token_logps"] = torch.full(batch["completion_ids"].shape, -2.0)  # ratios far from 1
        results.append(loss_and_grads(trainer, batch))
    assert not batch["advantages"].eq(0).any()  # every row informative
    torch.testing.assert_close(results[0][0], results[1][0], rtol=0, atol=0)
    assert_grads_close(results[0][1], results[1][1], rtol=0, atol=0)
    logged = {name: ours._metrics["train"][name] for name in base._metrics["train"]}
    assert logged == base._metrics["train"] and logged["clip_ratio/region_mean"][-1] > 0
    assert ours._metrics["train"]["zero_std/informative_adv_abs_mean"] == [pytest.approx(0.866, abs=1e-3)]


@pytest.mark.parametrize("loss_type", ["grpo", "dapo"])
@pytest.mark.parametrize("normalization", ["keep", "exclude"])
def test_entropy_signal_beside_an_unscorable_row_under_both_normalisers(make_trainer, loss_type, normalization):
    """The informative group's first row is unscorable: it is masked, its group's advantages come from the other
    three, and the tied rows that train count in the normalisers while the masked row counts only under "keep".
    GRPO's loss (a mean over rows) and DAPO's (num_items_in_batch) are the normalisers the modes tell apart."""
    ours = make_trainer(
        beta=BETA, loss_type=loss_type, per_device_train_batch_size=12, reward_funcs=ANSWER_OR_NONE,
        tied_group_entropy_scale=SCALE, zero_std_normalization=normalization,
    )  # fmt: skip
    move_policy_away(ours.model)
    batch = tied_batch(ours, [UNSCORABLE, *INFORMATIVE[1:]])
    assert batch["tied_sign"].tolist() == [-1.0] * 4 + [1.0] * 4 + [0.0] * 4
    assert batch["completion_mask"][8].sum() == 0 and batch["base_loss_mask"][8].sum() > 0
    _, ours_grads = loss_and_grads(ours, dict(batch))
    ours.model.zero_grad(set_to_none=True)
    rewards = REWARDS.clone()
    rewards[8] = float("nan")  # the unscorable row
    hand_loss(ours, batch, loss_type, SCALE, rewards, normalization).backward()
    expected = {name: p.grad.clone() for name, p in ours.model.named_parameters()}
    assert grad_norm(expected) > 1e-4
    assert_grads_close(ours_grads, expected, rtol=1e-4, atol=1e-7)


def test_informative_advantages_and_metrics(make_trainer):
    masked = make_trainer(beta=BETA, per_device_train_batch_size=12)
    ours = make_trainer(beta=BETA, per_device_train_batch_size=12, tied_group_entropy_scale=0.2)
    ours_batch, masked_batch = tied_batch(ours), tied_batch(masked)
    assert torch.equal(ours_batch["advantages"], masked_batch["advantages"])
    assert ours._metrics["train"]["zero_std/tied_trained_group_frac"][-1] == pytest.approx(2 / 3)
    assert ours._metrics["train"]["zero_std/masked_group_frac"][-1] == 0.0
    move_policy_away(ours.model)
    loss_and_grads(ours, ours_batch)
    metrics = {name: values[-1] for name, values in ours._metrics["train"].items()}
    assert metrics["zero_std/tied_high_adv_abs_mean"] > 0 and metrics["zero_std/tied_low_adv_abs_mean"] > 0
    assert metrics["zero_std/informative_adv_abs_mean"] == pytest.approx(0.866, abs=1e-3)  # +-(0.5 / 0.577)


def test_rloo_refuses_the_signal_naming_it(make_trainer):
    with pytest.raises(ValueError, match="tied_group_entropy_scale=0.2 needs GRPO's loss"):
        make_trainer("rloo", tied_group_entropy_scale=0.2)


def three_outcomes(prompts):
    """ "1+1=" always right, "4+4=" always wrong, "2+3=" right on every other row: one group of each kind."""
    seen: dict[str, int] = {}
    completions = []
    for prompt in prompts:
        seen[prompt] = seen.get(prompt, -1) + 1
        completions.append({"1+1=": "2", "4+4=": "3 x"}.get(prompt, ["5", "9 a"][seen[prompt] % 2]))
    return completions


@pytest.mark.every_trl
def test_eval_is_untouched(make_trainer):
    """In eval mode the batch TRL scores (tied groups included), its loss and ``evaluate()``'s metrics are TRL's own:
    the entropy rule acts in the training loss only."""
    prompts = ["1+1=", "2+3=", "4+4="]
    config = dict(beta=BETA, per_device_train_batch_size=12, per_device_eval_batch_size=12, prompts=prompts)
    base, ours = make_trainer(ours=False, **config), make_trainer(tied_group_entropy_scale=0.2, **config)
    for trainer in (base, ours):
        move_policy_away(trainer.model)
    assert_eval_is_trls(base, ours, three_outcomes, prompts)


@pytest.mark.parametrize("scale", [0.0, 0.2])
def test_failed_groups_that_train_on_their_tie_are_not_a_stall(make_trainer, scale):
    """Every group all wrong, batch after batch: a stall under masking (the monitor warns), not when they train."""
    state = make_trainer(beta=BETA, tied_group_entropy_scale=scale).zero_std
    rewards, no = torch.tensor([0.0] * 8), torch.zeros(8, dtype=torch.bool)
    plan = core.decide_row_plan(
        rewards, 4, truncated=no, unscorable=no, rejected=no, reward_range=(0.0, 1.0),
        tied_groups_train=scale > 0,
    )  # fmt: skip
    notices = [state.observe_plan(plan, torch.ones(8))[1] for _ in range(25)]
    assert any(notices) == (scale == 0)
    metrics, _ = state.observe_plan(plan, torch.ones(8))
    assert ("zero_std/tied_trained_group_frac" in metrics) == (scale > 0)
