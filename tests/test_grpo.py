"""ZeroStdGRPOTrainer against TRL's GRPOTrainer on the same stubbed batches: gradients, advantages, eval identity."""

from __future__ import annotations

import pytest
import torch
from conftest import (
    INFORMATIVE,
    LOSS_TYPES,
    MIXED_PROMPTS,
    TIED,
    answer_or_not,
    assert_all_zero,
    assert_grads_close,
    grad_norm,
    loss_and_grads,
    move_policy_away,
    rows_of,
    stub_generation,
    table_reward,
    train_batch,
)
from trl import GRPOConfig

from trl_zerostd import ZeroStdGRPOTrainer

# ---------------------------------------------------------------------------------------------------------------
# The KL leak
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("scale_rewards", ["group", "batch", "none"])
def test_zero_variance_rows_put_no_kl_gradient(make_trainer, scale_rewards):
    """beta > 0, policy != reference: TRL's tied rows pull the policy (KL); ours put exactly zero gradient, and the
    informative group still trains, exactly as TRL would train it with the tied rows' tokens masked."""
    base = make_trainer(ours=False, beta=0.1, scale_rewards=scale_rewards)
    ours = make_trainer(beta=0.1, scale_rewards=scale_rewards)
    for trainer in (base, ours):
        move_policy_away(trainer.model)

    _, base_tied = loss_and_grads(base, train_batch(base, ["1+1="], TIED))
    _, ours_tied = loss_and_grads(ours, train_batch(ours, ["1+1="], TIED))
    assert grad_norm(base_tied) > 1e-4
    assert_all_zero(ours_tied)

    ours_batch = train_batch(ours, MIXED_PROMPTS, TIED + INFORMATIVE)
    _, ours_mixed = loss_and_grads(ours, ours_batch)
    assert grad_norm(ours_mixed) > 1e-4

    base_batch = train_batch(base, MIXED_PROMPTS, TIED + INFORMATIVE)
    _, base_mixed = loss_and_grads(base, base_batch)
    if scale_rewards != "batch":  # under "batch" our batch std leaves the tied rows out (rule 2), TRL's does not
        assert torch.equal(ours_batch["advantages"], base_batch["advantages"])
    # TRL's loss with our advantages and the tied rows' tokens masked, normalisers unchanged ("keep"):
    base_batch["advantages"] = ours_batch["advantages"]
    base_batch["completion_mask"][:4] = 0
    _, base_without_tied = loss_and_grads(base, base_batch)
    assert_grads_close(ours_mixed, base_without_tied, rtol=1e-5, atol=1e-7)
    for key in ("kl", "entropy"):  # logged means over the trained tokens, as TRL's over its loss mask
        assert ours._metrics["train"][key][-1] == pytest.approx(base._metrics["train"][key][-1], rel=1e-6), key
    assert grad_norm({k: base_mixed[k] - ours_mixed[k] for k in ours_mixed}) > 1e-5


def test_masked_rows_of_every_reason_put_no_kl_gradient(make_trainer):
    """Unscorable rows get advantage 0 in TRL 1.16 but keep their KL term; ours put no gradient at all."""
    reward = table_reward({"5 x": 1.0, "3": 0.0})  # the other completions are unscorable (None)
    base = make_trainer(ours=False, beta=0.1, reward_funcs=reward)
    ours = make_trainer(beta=0.1, reward_funcs=reward)
    for trainer in (base, ours):
        move_policy_away(trainer.model)
    completions = ["9 yy", "2 a", "2 bb", "2"]
    _, base_grads = loss_and_grads(base, train_batch(base, ["2+3="], completions))
    ours_batch = train_batch(ours, ["2+3="], completions)
    _, ours_grads = loss_and_grads(ours, ours_batch)
    assert grad_norm(base_grads) > 1e-4
    assert_all_zero(ours_grads)
    assert ours._metrics["train"]["masked/row_frac/unscorable"][-1] == 1.0


# ---------------------------------------------------------------------------------------------------------------
# Normalisation modes
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_keep_gradients_equal_trl_without_kl(make_trainer, loss_type):
    """'keep', beta=0, no entropy bonus: the fix removes nothing that had a reward behind it."""
    base = make_trainer(ours=False, beta=0.0, loss_type=loss_type)
    ours = make_trainer(beta=0.0, loss_type=loss_type, zero_std_normalization="keep")
    base_loss, base_grads = loss_and_grads(base, train_batch(base, MIXED_PROMPTS, TIED + INFORMATIVE))
    ours_loss, ours_grads = loss_and_grads(ours, train_batch(ours, MIXED_PROMPTS, TIED + INFORMATIVE))
    assert grad_norm(ours_grads) > 1e-4
    torch.testing.assert_close(ours_loss, base_loss)
    assert_grads_close(ours_grads, base_grads, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_exclude_gradients_equal_trl_on_batch_without_masked_rows(make_trainer, loss_type):
    """'exclude': the gradients are TRL's on the informative group alone (beta > 0, policy moved)."""
    base = make_trainer(ours=False, beta=0.1, loss_type=loss_type)
    ours = make_trainer(beta=0.1, loss_type=loss_type, zero_std_normalization="exclude")
    for trainer in (base, ours):
        move_policy_away(trainer.model)
    base_loss, base_grads = loss_and_grads(base, train_batch(base, ["2+3="], INFORMATIVE))
    ours_loss, ours_grads = loss_and_grads(ours, train_batch(ours, MIXED_PROMPTS, TIED + INFORMATIVE))
    torch.testing.assert_close(ours_loss, base_loss)
    assert_grads_close(ours_grads, base_grads, rtol=1e-5, atol=1e-7)


def test_exclude_recounts_num_items_with_tool_mask(make_trainer):
    """num_items_in_batch under 'exclude' counts the masked loss mask, tool tokens (tool_mask 0) left out."""

    def tool_mask(ids):
        return [1] + [0] * (len(ids) - 2) + [1] if len(ids) > 2 else [1] * len(ids)

    base = make_trainer(ours=False, loss_type="dapo")
    ours = make_trainer(loss_type="dapo", zero_std_normalization="exclude")
    base_batch = train_batch(base, ["2+3="], INFORMATIVE, tool_mask=tool_mask)
    ours_batch = train_batch(ours, MIXED_PROMPTS, TIED + INFORMATIVE, tool_mask=tool_mask)
    assert ours_batch["num_items_in_batch"].item() == base_batch["num_items_in_batch"].item()
    assert base_batch["num_items_in_batch"].item() < base_batch["completion_mask"].sum().item()
    _, base_grads = loss_and_grads(base, base_batch)
    _, ours_grads = loss_and_grads(ours, ours_batch)
    assert_grads_close(ours_grads, base_grads, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("normalization", ["keep", "exclude"])
@pytest.mark.parametrize("skip", [True, False])
def test_all_masked_batch_gives_zero_loss_and_gradient(make_trainer, normalization, skip):
    trainer = make_trainer(beta=0.1, zero_std_normalization=normalization, skip_masked_rows=skip)
    move_policy_away(trainer.model)
    batch = train_batch(trainer, ["1+1=", "4+4="], TIED + ["9", "1", "1 a", "0"])
    assert torch.equal(batch["advantages"], torch.zeros(8))
    loss, grads = loss_and_grads(trainer, batch)
    assert loss.item() == 0.0
    assert_all_zero(grads)


# ---------------------------------------------------------------------------------------------------------------
# Advantages and masks (issue: masked rows leave every baseline)
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("scale_rewards", ["group", "batch", "none"])
@pytest.mark.parametrize("aggregation", ["sum_then_normalize", "normalize_then_sum"])
def test_zero_variance_decision_ignores_reward_scaling(make_trainer, scale_rewards, aggregation):
    trainer = make_trainer(scale_rewards=scale_rewards, multi_objective_aggregation=aggregation)
    batch = train_batch(trainer, MIXED_PROMPTS, TIED + INFORMATIVE)
    assert batch["completion_mask"][:4].sum() == 0 and batch["completion_mask"][4:].sum(dim=1).min() > 0
    assert torch.equal(batch["advantages"][:4], torch.zeros(4))
    assert batch["advantages"][4:].abs().min() > 0
    metrics = trainer._metrics["train"]
    assert metrics["zero_std/masked_group_frac"][-1] == 0.5
    assert metrics["masked/row_frac/zero_std"][-1] == 0.5
    expected_tokens = batch["base_loss_mask"][:4].sum() / batch["base_loss_mask"].sum()
    assert metrics["zero_std/masked_token_frac"][-1] == pytest.approx(expected_tokens.item())


def test_base_metrics_keep_their_meaning(make_trainer):
    base = make_trainer(ours=False)
    ours = make_trainer()
    train_batch(base, MIXED_PROMPTS, TIED + INFORMATIVE)
    train_batch(ours, MIXED_PROMPTS, TIED + INFORMATIVE)
    for key in ("reward", "reward_std", "frac_reward_zero_std", "completions/mean_length"):
        assert ours._metrics["train"][key] == base._metrics["train"][key], key


@pytest.mark.parametrize("exclude_from_baseline", [True, False])
def test_truncated_outlier_does_not_move_siblings(make_trainer, exclude_from_baseline):
    """A truncated row (no EOS, masked by TRL) with an outlier reward leaves its siblings' advantages alone."""
    advantages = {}
    for outlier in (100.0, -50.0):
        reward = table_reward({"5 x": outlier, "3": 0.0, "5": 1.0, "9 yy": 0.0})
        trainer = make_trainer(
            reward_funcs=reward, mask_truncated_completions=True, exclude_masked_from_baseline=exclude_from_baseline
        )
        batch = train_batch(trainer, ["2+3="], ["5 x|", "3", "5", "9 yy"])
        assert batch["completion_mask"][0].sum() == 0 and batch["advantages"][0] == 0.0
        advantages[outlier] = batch["advantages"][1:]
        assert trainer._metrics["train"]["masked/row_frac/truncated"][-1] == 0.25
    if exclude_from_baseline:
        assert torch.equal(advantages[100.0], advantages[-50.0])
        torch.testing.assert_close(advantages[100.0], expected_group_advantages([0.0, 1.0, 0.0]))
    else:  # TRL's own statistics: the outlier leaks into the siblings' baseline
        assert not torch.equal(advantages[100.0], advantages[-50.0])


def expected_group_advantages(rewards):
    rewards = torch.tensor(rewards)
    return (rewards - rewards.mean()) / (rewards.std() + 1e-4)


def vllm_rejecting(trainer, rows):
    """Make ``trainer`` score as under vLLM with importance-sampling correction in ``sequence_mask`` mode, with
    sampling log-probs that get ``rows`` rejected: -30 per token puts their ratio far above the default clip_max 3,
    while 0 per token keeps every other ratio below 1. (vLLM itself is not needed: the log-probs come with the
    stubbed generation, and TRL computes the ratio from them.)"""
    trainer.use_vllm = True
    assert trainer.vllm_importance_sampling_correction and trainer.vllm_importance_sampling_mode == "sequence_mask"
    return lambda row, ids: [-30.0 if row in rows else 0.0] * len(ids)


def vllm_batch(trainer, prompts, completions, rejected):
    stub_generation(trainer, completions, logprobs=vllm_rejecting(trainer, rejected))
    trainer.model.train()
    return trainer._generate_and_score_completions(rows_of(trainer, prompts))


def test_rejected_rows_are_trls_own_and_leave_the_baseline(make_trainer):
    advantages = {}
    for first in ("5 x", "9 yy"):
        trainer, base = make_trainer(), make_trainer(ours=False)
        batch = vllm_batch(trainer, ["2+3="], [first, "3", "5", "9 yy"], rejected=[0])
        base_batch = vllm_batch(base, ["2+3="], [first, "3", "5", "9 yy"], rejected=[0])
        assert base_batch["importance_sampling_ratio"].view(-1).tolist()[0] == 0.0  # TRL rejects row 0 itself
        assert (base_batch["importance_sampling_ratio"].view(-1)[1:] > 0).all()
        assert batch["completion_mask"][0].sum() == 0 and batch["advantages"][0] == 0.0
        assert trainer._metrics["train"]["masked/row_frac/rejected"][-1] == 0.25
        advantages[first] = batch["advantages"][1:]
    assert torch.equal(advantages["5 x"], advantages["9 yy"])
    torch.testing.assert_close(advantages["5 x"], expected_group_advantages([0.0, 1.0, 0.0]))


def test_rejected_rows_put_no_kl_gradient(make_trainer):
    trainer = make_trainer(beta=0.1)
    move_policy_away(trainer.model)
    loss, grads = loss_and_grads(trainer, vllm_batch(trainer, ["2+3="], INFORMATIVE, rejected=[0, 1, 2, 3]))
    assert loss.item() == 0.0
    assert_all_zero(grads)


# ---------------------------------------------------------------------------------------------------------------
# Eval is TRL's, bit for bit
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("num_generations_eval", [None, 1])
def test_eval_is_bit_identical(make_trainer, num_generations_eval):
    trainers = [make_trainer(ours=ours, beta=0.1, num_generations_eval=num_generations_eval) for ours in (False, True)]
    outputs, losses, metrics = [], [], []
    for trainer in trainers:
        move_policy_away(trainer.model)
        stub_generation(trainer, answer_or_not)
        trainer.model.eval()
        generations = trainer.num_generations_eval
        rows = [{"prompt": p} for p in ["1+1=", "2+3="] for _ in range(generations)]
        output = trainer._generate_and_score_completions(rows)
        with torch.no_grad():
            losses.append(trainer.compute_loss(trainer.model, output))
        outputs.append(output)
        metrics.append({k: v for k, v in trainer.evaluate().items() if "runtime" not in k and "per_second" not in k})
    base, ours = outputs
    assert base.keys() == ours.keys()
    for key in base:
        assert torch.equal(base[key], ours[key]), key
    assert torch.equal(losses[0], losses[1])
    assert metrics[0] == metrics[1]
    assert "eval_loss" in metrics[1]


# ---------------------------------------------------------------------------------------------------------------
# End to end
# ---------------------------------------------------------------------------------------------------------------


def test_train_end_to_end_with_real_generation(make_trainer):
    trainer = make_trainer(max_steps=2, beta=0.04, temperature=1.0)
    trainer.train()
    logged = [entry for entry in trainer.state.log_history if "zero_std/masked_group_frac" in entry]
    assert len(logged) == 2
    for entry in logged:
        assert 0.0 <= entry["zero_std/masked_group_frac"] <= 1.0
        assert all(
            f"masked/row_frac/{reason}" in entry for reason in ("zero_std", "truncated", "unscorable", "rejected")
        )


def test_plain_grpo_config_gets_the_defaults(make_trainer, tmp_path, tiny_model_dir):
    args = GRPOConfig(
        output_dir=str(tmp_path), num_generations=4, per_device_train_batch_size=8, report_to="none", use_cpu=True
    )
    trainer = ZeroStdGRPOTrainer(
        model=tiny_model_dir,
        reward_funcs=lambda completions, **kw: [0.0] * len(completions),
        args=args,
        train_dataset=make_trainer().train_dataset,
    )
    assert (trainer.masking.mask_zero_std_groups, trainer.masking.zero_std_normalization) == (True, "keep")
    assert trainer.masking.zero_std_atol == 1e-6 and trainer.masking.exclude_masked_from_baseline


def test_completions_table_shows_the_advantages_that_train(make_trainer):
    trainer = make_trainer(mask_truncated_completions=True)
    batch = train_batch(trainer, MIXED_PROMPTS, TIED + ["5 x|"] + INFORMATIVE[1:])
    assert list(trainer._logs["advantages"]) == batch["advantages"].tolist()
    assert batch["advantages"][4] == 0.0  # truncated: TRL itself gives it a non-zero advantage
