"""ZeroStdRLOOTrainer against TRL's RLOOTrainer on the same stubbed batches: gradients, advantages, eval identity."""

from __future__ import annotations

import pytest
import torch

from tests.support.trainers import (
    INFORMATIVE,
    MIXED_PROMPTS,
    TIED,
    answer_or_not,
    assert_all_zero,
    assert_eval_is_trls,
    assert_grads_close,
    constant_reward,
    grad_norm,
    loss_and_grads,
    move_policy_away,
    moved_by_train,
    table_reward,
    train_batch,
)


def make_pair(make_trainer, move=True, **config):
    """TRL's RLOOTrainer and ours on the same weights; with ``move`` the policy differs from the reference."""
    base = make_trainer("rloo", ours=False, **config)
    ours = make_trainer("rloo", **config)
    if move:
        for trainer in (base, ours):
            move_policy_away(trainer.model)
    return base, ours


# ---------------------------------------------------------------------------------------------------------------
# The KL leak
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.every_trl
@pytest.mark.parametrize("normalize_advantages", [False, True])
def test_tied_group_puts_no_kl_gradient(make_trainer, normalize_advantages):
    """beta > 0, policy != reference: TRL trains the tied group on differences of KL terms; ours puts exactly zero
    gradient there, and on the mixed batch trains the informative group exactly as TRL trains it alone."""
    config = {"beta": 0.1, "normalize_advantages": normalize_advantages, "zero_std_normalization": "exclude"}
    base, ours = make_pair(make_trainer, **config)

    _, base_tied = loss_and_grads(base, train_batch(base, ["1+1="], TIED))
    ours_tied_batch = train_batch(ours, ["1+1="], TIED)
    ours_tied_loss, ours_tied = loss_and_grads(ours, ours_tied_batch)
    assert grad_norm(base_tied) > 1e-4
    assert ours_tied_loss.item() == 0.0
    assert_all_zero(ours_tied)
    assert torch.equal(ours_tied_batch["advantages"], torch.zeros(4))
    assert torch.equal(ours_tied_batch["old_logps"], torch.zeros(4))

    ours_mixed_loss, ours_mixed = loss_and_grads(ours, train_batch(ours, MIXED_PROMPTS, TIED + INFORMATIVE))
    assert grad_norm(ours_mixed) > 1e-4
    # 'exclude': the tied rows leave every normaliser, and RLOO's baseline is group-local: TRL on the group alone.
    base_informative_loss, base_informative = loss_and_grads(base, train_batch(base, ["2+3="], INFORMATIVE))
    torch.testing.assert_close(ours_mixed_loss, base_informative_loss)
    assert_grads_close(ours_mixed, base_informative, rtol=1e-5, atol=1e-7)
    _, base_mixed = loss_and_grads(base, train_batch(base, MIXED_PROMPTS, TIED + INFORMATIVE))
    assert grad_norm({k: base_mixed[k] - ours_mixed[k] for k in ours_mixed}) > 1e-5  # TRL does leak


@pytest.mark.every_trl
@pytest.mark.parametrize("normalize_advantages", [False, True])
def test_keep_divides_by_every_row(make_trainer, normalize_advantages):
    """'keep': RLOO's per-sequence mean still counts the 4 tied rows, so ours on the mixed batch of 8 rows is exactly
    half of TRL on the informative group of 4 rows (beta > 0, policy moved)."""
    base, ours = make_pair(make_trainer, beta=0.1, normalize_advantages=normalize_advantages)
    ours_loss, ours_grads = loss_and_grads(ours, train_batch(ours, MIXED_PROMPTS, TIED + INFORMATIVE))
    base_loss, base_grads = loss_and_grads(base, train_batch(base, ["2+3="], INFORMATIVE))
    assert grad_norm(ours_grads) > 1e-4
    torch.testing.assert_close(ours_loss, base_loss / 2)
    assert_grads_close(ours_grads, {k: g / 2 for k, g in base_grads.items()}, rtol=1e-5, atol=1e-7)


@pytest.mark.every_trl
def test_keep_gradients_equal_trl_without_kl(make_trainer):
    """'keep', beta=0 (no batch statistic: normalize_advantages=False): TRL already gives the tied rows advantage 0,
    so the fix removes nothing that had a reward behind it and the gradients are TRL's."""
    base, ours = make_pair(make_trainer, move=False, beta=0.0, zero_std_normalization="keep")
    base_loss, base_grads = loss_and_grads(base, train_batch(base, MIXED_PROMPTS, TIED + INFORMATIVE))
    ours_batch = train_batch(ours, MIXED_PROMPTS, TIED + INFORMATIVE)
    ours_loss, ours_grads = loss_and_grads(ours, ours_batch)
    assert ours_batch["completion_mask"][:4].sum() == 0  # our masking did act
    assert grad_norm(ours_grads) > 1e-4
    torch.testing.assert_close(ours_loss, base_loss)
    assert_grads_close(ours_grads, base_grads, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("normalization", ["keep", "exclude"])
def test_all_masked_batch_gives_zero_loss_and_gradient(make_trainer, normalization):
    trainer = make_trainer("rloo", beta=0.1, normalize_advantages=True, zero_std_normalization=normalization)
    move_policy_away(trainer.model)
    batch = train_batch(trainer, ["1+1=", "4+4="], TIED + ["9", "1", "1 a", "0"])
    assert torch.equal(batch["advantages"], torch.zeros(8))
    loss, grads = loss_and_grads(trainer, batch)
    assert loss.item() == 0.0
    assert_all_zero(grads)


def test_masked_long_completions_keep_a_finite_loss(make_trainer):
    """A masked row's old_logps is zeroed with its mask: were it TRL's sum of ~40 token log-probs, its ratio
    exp(0 - old_logps) would overflow to inf and inf * advantage 0 would make the loss NaN."""
    long_tied = ["2" + " abcdefghij" * 4, "2" + " klmnopqrst" * 4, "2" + " uvwxyz" * 6, "2" + " 1234567890" * 4]
    trainer = make_trainer("rloo", beta=0.1, max_completion_length=48)
    move_policy_away(trainer.model)
    batch = train_batch(trainer, MIXED_PROMPTS, long_tied + INFORMATIVE)
    loss, grads = loss_and_grads(trainer, batch)
    assert torch.isfinite(loss) and grad_norm(grads) > 1e-4
    assert all(torch.isfinite(g).all() for g in grads.values())


# ---------------------------------------------------------------------------------------------------------------
# Advantages and masks
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.every_trl
@pytest.mark.parametrize("normalize_advantages", [False, True])
def test_advantages_are_trls_when_nothing_is_masked(make_trainer, normalize_advantages):
    """With masking off and every row scorable (nothing masked), the recomputed advantages (KL penalty recorded from
    TRL's own forwards) are TRL's bit for bit; so the KL this package subtracts is TRL's."""
    reward = table_reward({"2": 1.0, "2 a": 0.5, "2 bb": 1.0, "5 x": 3.0, "3": 0.0, "5": 1.0, "9 yy": -0.5})
    config = {
        "beta": 0.1,
        "reward_funcs": reward,
        "normalize_advantages": normalize_advantages,
        "reward_clip_range": (-1.0, 2.0),
    }
    base = make_trainer("rloo", ours=False, **config)
    ours = make_trainer("rloo", mask_zero_std_groups=False, **config)
    for trainer in (base, ours):
        move_policy_away(trainer.model)
    base_batch = train_batch(base, MIXED_PROMPTS, TIED + INFORMATIVE)
    ours_batch = train_batch(ours, MIXED_PROMPTS, TIED + INFORMATIVE)
    assert torch.equal(ours_batch["advantages"], base_batch["advantages"])
    assert base_batch["advantages"].abs().min() > 0
    assert torch.equal(ours_batch["old_logps"], base_batch["old_logps"])
    assert base._metrics["train"]["kl"][-1] != 0.0  # the KL term is really there


@pytest.mark.every_trl
def test_kl_is_recorded_from_the_adapter_free_reference_under_peft(make_trainer):
    """Under PEFT TRL gets the reference log-probs from the policy with its adapter disabled, not from a ref_model:
    the recorded KL is still TRL's (masking off: advantages bit-identical), and the tied rows still put no
    gradient on the LoRA weights (masking on)."""
    from peft import LoraConfig

    def lora():
        return LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")

    base = make_trainer("rloo", ours=False, beta=0.1, peft_config=lora())
    off = make_trainer("rloo", beta=0.1, peft_config=lora(), mask_zero_std_groups=False)
    ours = make_trainer("rloo", beta=0.1, peft_config=lora())
    for trainer in (base, off, ours):
        assert trainer.ref_model is None
        move_policy_away(trainer.model)
    base_batch = train_batch(base, MIXED_PROMPTS, TIED + INFORMATIVE)
    assert torch.equal(train_batch(off, MIXED_PROMPTS, TIED + INFORMATIVE)["advantages"], base_batch["advantages"])
    _, base_tied = loss_and_grads(base, train_batch(base, ["1+1="], TIED))
    _, ours_tied = loss_and_grads(ours, train_batch(ours, ["1+1="], TIED))
    assert grad_norm(base_tied) > 1e-5
    assert_all_zero(ours_tied)


def test_zero_variance_is_decided_before_the_kl_penalty(make_trainer):
    trainer = make_trainer("rloo", beta=0.1)
    move_policy_away(trainer.model)
    batch = train_batch(trainer, MIXED_PROMPTS, TIED + INFORMATIVE)
    assert batch["completion_mask"][:4].sum() == 0 and batch["completion_mask"][4:].sum(dim=1).min() > 0
    assert torch.equal(batch["advantages"][:4], torch.zeros(4)) and batch["advantages"][4:].abs().min() > 0
    assert torch.equal(batch["old_logps"][:4], torch.zeros(4)) and batch["old_logps"][4:].abs().min() > 0
    metrics = trainer._metrics["train"]
    assert metrics["zero_std/masked_group_frac"][-1] == 0.5
    assert metrics["masked/row_frac/zero_std"][-1] == 0.5
    expected_tokens = batch["base_loss_mask"][:4].sum() / batch["base_loss_mask"].sum()
    assert metrics["zero_std/masked_token_frac"][-1] == pytest.approx(expected_tokens.item())


@pytest.mark.parametrize("clip", [None, (0.0, 1.0)])
def test_zero_variance_is_decided_on_the_clipped_reward(make_trainer, clip):
    """Task rewards 2, 3, 4, 5 all clip to 1: no signal left, the group is masked."""
    reward = table_reward({"5 x": 2.0, "3": 3.0, "5": 4.0, "9 yy": 5.0})
    trainer = make_trainer("rloo", beta=0.0, reward_funcs=reward, reward_clip_range=clip)
    batch = train_batch(trainer, ["2+3="], INFORMATIVE)
    masked = batch["completion_mask"].sum() == 0
    assert masked == (clip is not None)
    if clip is None:
        torch.testing.assert_close(batch["advantages"], torch.tensor([-2.0, -2.0 / 3, 2.0 / 3, 2.0]))


@pytest.mark.every_trl
def test_base_metrics_keep_their_meaning(make_trainer):
    # The tied rows skip the scoring forwards, so TRL's kl and frac_reward_zero_std see their KL as 0
    # (tests/trainer/test_adapter.py::test_scoring_forwards_skip_masked_rows_and_change_nothing_else)
    base, ours = make_pair(make_trainer, beta=0.1)
    train_batch(base, MIXED_PROMPTS, TIED + INFORMATIVE)
    train_batch(ours, MIXED_PROMPTS, TIED + INFORMATIVE)
    for key in ("reward", "reward_std", "completions/mean_length"):
        assert ours._metrics["train"][key] == base._metrics["train"][key], key


@pytest.mark.every_trl
@pytest.mark.parametrize("normalize_advantages", [False, True])
def test_truncated_outlier_does_not_move_siblings(make_trainer, normalize_advantages):
    """A truncated row (no EOS, masked by TRL) with an outlier reward leaves its siblings' advantages alone; in TRL
    it moves them through the leave-one-out baseline."""
    advantages = {}
    for ours in (True, False):
        for outlier in (100.0, -50.0):
            reward = table_reward({"5 x": outlier, "3": 0.0, "5": 1.0, "9 yy": 0.0})
            trainer = make_trainer(
                "rloo",
                ours=ours,
                beta=0.0,
                reward_funcs=reward,
                mask_truncated_completions=True,
                normalize_advantages=normalize_advantages,
            )
            batch = train_batch(trainer, ["2+3="], ["5 x|", "3", "5", "9 yy"])
            assert batch["completion_mask"][0].sum() == 0
            advantages[ours, outlier] = batch["advantages"]
    assert torch.equal(advantages[True, 100.0], advantages[True, -50.0])
    assert advantages[True, 100.0][0] == 0.0
    assert not torch.equal(advantages[False, 100.0][1:], advantages[False, -50.0][1:])  # TRL leaks
    expected = torch.tensor([-0.5, 1.0, -0.5])  # leave-one-out over the siblings' rewards 0, 1, 0
    if normalize_advantages:
        expected = (expected - expected.mean()) / (expected.std() + 1e-4)
    torch.testing.assert_close(advantages[True, 100.0][1:], expected)


# ---------------------------------------------------------------------------------------------------------------
# Eval is TRL's, bit for bit
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.every_trl
@pytest.mark.parametrize("num_generations_eval", [None, 1])
def test_eval_is_bit_identical(make_trainer, num_generations_eval):
    base, ours = make_pair(
        make_trainer, beta=0.1, normalize_advantages=True, num_generations_eval=num_generations_eval
    )
    metrics = assert_eval_is_trls(base, ours, answer_or_not, ["1+1=", "2+3="])
    assert "eval_kl" in metrics
    assert not any(k.startswith(("eval_zero_std/", "eval_masked/")) for k in metrics)


# ---------------------------------------------------------------------------------------------------------------
# End to end
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.every_trl
def test_zero_variance_step_leaves_the_parameters_untouched(make_trainer):
    """A real train() step (real generation, beta > 0, policy moved away from the reference) on a reward that ties
    every group: TRL's step moves the parameters through the KL term alone; ours leaves every one bit-identical."""
    moved = moved_by_train(make_trainer, "rloo", beta=0.1, reward_funcs=constant_reward, temperature=1.0)
    assert moved[False]  # TRL: the KL term of the tied groups trains
    assert moved[True] == []
