"""ZeroStdGRPOTrainer against TRL's GRPOTrainer on the same stubbed batches: gradients, advantages, eval identity."""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import pytest
import torch
from trl import GRPOConfig

from tests.support.trainers import (
    INFORMATIVE,
    LOSS_TYPES,
    MIXED_PROMPTS,
    TIED,
    VLM_INFORMATIVE,
    answer_or_not,
    assert_all_zero,
    assert_eval_is_trls,
    assert_grads_close,
    clipped_loss_metrics,
    constant_reward,
    grad_norm,
    loss_and_grads,
    move_policy_away,
    moved_by_train,
    prompt_image,
    rows_of,
    stub_generation,
    table_reward,
    train_batch,
    vlm_batch,
    vlm_trainer,
)
from trl_zerostd import ZeroStdGRPOTrainer

# ---------------------------------------------------------------------------------------------------------------
# The KL leak
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.every_trl
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


@pytest.mark.every_trl
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


@pytest.mark.every_trl
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


@pytest.mark.every_trl
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


@pytest.mark.every_trl
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
def test_all_masked_batch_gives_zero_loss_and_gradient(make_trainer, normalization):
    trainer = make_trainer(beta=0.1, zero_std_normalization=normalization)
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


@pytest.mark.every_trl
def test_base_metrics_keep_their_meaning(make_trainer):
    base = make_trainer(ours=False)
    ours = make_trainer()
    train_batch(base, MIXED_PROMPTS, TIED + INFORMATIVE)
    train_batch(ours, MIXED_PROMPTS, TIED + INFORMATIVE)
    for key in ("reward", "reward_std", "frac_reward_zero_std", "completions/mean_length"):
        assert ours._metrics["train"][key] == base._metrics["train"][key], key


@pytest.mark.every_trl
def test_truncated_outlier_does_not_move_siblings(make_trainer):
    """A truncated row (no EOS, masked by TRL) with an outlier reward leaves its siblings' advantages alone; in TRL's
    own statistics the outlier leaks into their baseline."""
    advantages = {}
    for ours, outlier in itertools.product((True, False), (100.0, -50.0)):
        reward = table_reward({"5 x": outlier, "3": 0.0, "5": 1.0, "9 yy": 0.0})
        trainer = make_trainer(ours=ours, reward_funcs=reward, mask_truncated_completions=True)
        batch = train_batch(trainer, ["2+3="], ["5 x|", "3", "5", "9 yy"])
        assert batch["completion_mask"][0].sum() == 0
        advantages[ours, outlier] = batch["advantages"]
        if ours:
            assert batch["advantages"][0] == 0.0
            assert trainer._metrics["train"]["masked/row_frac/truncated"][-1] == 0.25
    assert torch.equal(advantages[True, 100.0][1:], advantages[True, -50.0][1:])
    torch.testing.assert_close(advantages[True, 100.0][1:], expected_group_advantages([0.0, 1.0, 0.0]))
    assert not torch.equal(advantages[False, 100.0][1:], advantages[False, -50.0][1:])  # TRL's baseline: it leaks


@pytest.mark.every_trl
def test_truncated_row_trains_as_in_trl_without_mask_truncated_completions(make_trainer):
    """TRL's default ``mask_truncated_completions=False`` trains truncated rows: so do we, in every statistic."""
    reward = table_reward({"5 x": 100.0, "3": 0.0, "5": 1.0, "9 yy": 0.0})
    batches = [
        train_batch(make_trainer(reward_funcs=reward, ours=ours), ["2+3="], ["5 x|", "3", "5", "9 yy"])
        for ours in (True, False)
    ]
    assert batches[0]["completion_mask"][0].sum() > 0
    torch.testing.assert_close(batches[0]["advantages"], batches[1]["advantages"])


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


@pytest.mark.every_trl
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


@pytest.mark.every_trl
@pytest.mark.parametrize("num_generations_eval", [None, 1])
def test_eval_is_bit_identical(make_trainer, num_generations_eval):
    config = dict(beta=0.1, num_generations_eval=num_generations_eval)
    base, ours = make_trainer(ours=False, **config), make_trainer(**config)
    for trainer in (base, ours):
        move_policy_away(trainer.model)
    assert_eval_is_trls(base, ours, answer_or_not, ["1+1=", "2+3="])


# ---------------------------------------------------------------------------------------------------------------
# End to end
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.every_trl
def test_zero_variance_step_leaves_the_parameters_untouched(make_trainer):
    """A real train() step (real generation, beta > 0, policy moved away from the reference) on a reward that ties
    every group: TRL's step moves the parameters through the KL term alone; ours leaves every one bit-identical."""
    moved = moved_by_train(make_trainer, "grpo", beta=0.1, reward_funcs=constant_reward, temperature=1.0)
    assert moved[False]  # TRL: the KL term of the tied groups trains
    assert moved[True] == []


def test_plain_grpo_config_gets_the_defaults(make_trainer, tmp_path, tiny_model_dir):
    args = GRPOConfig(
        output_dir=str(tmp_path),
        num_generations=4,
        per_device_train_batch_size=8,
        report_to="none",
        use_cpu=True,
        bf16=False,
    )
    trainer = ZeroStdGRPOTrainer(
        model=tiny_model_dir,
        reward_funcs=lambda completions, **kw: [0.0] * len(completions),
        args=args,
        train_dataset=make_trainer().train_dataset,
    )
    assert (trainer.zero_std.settings.mask_zero_std_groups, trainer.zero_std.settings.zero_std_normalization) == (
        True,
        "keep",
    )
    assert trainer.zero_std.settings.zero_std_atol == 1e-6


def test_completions_table_shows_the_advantages_that_train(make_trainer):
    trainer = make_trainer(mask_truncated_completions=True)
    batch = train_batch(trainer, MIXED_PROMPTS, TIED + ["5 x|"] + INFORMATIVE[1:])
    assert list(trainer._logs["advantages"]) == batch["advantages"].tolist()
    assert batch["advantages"][4] == 0.0  # truncated: TRL itself gives it a non-zero advantage


# ---------------------------------------------------------------------------------------------------------------
# Entropy statistics cover the trained rows only (SEMANTICS rule 3)
# ---------------------------------------------------------------------------------------------------------------


def recording_entropy_masks(trainer):
    """Record every token selection TRL's ``get_high_entropy_mask`` returns (test instrumentation)."""
    selected, select = [], trainer.get_high_entropy_mask

    def record(entropies, mask, threshold):
        selected.append(select(entropies, mask, threshold))
        return selected[-1]

    trainer.get_high_entropy_mask = record
    return selected


@pytest.mark.every_trl
@pytest.mark.parametrize("normalization, zero_std_kl", [("keep", "mask"), ("exclude", "mask"), ("keep", "keep")])
def test_entropy_quantile_selects_the_tokens_trl_selects_on_the_trained_rows(make_trainer, normalization, zero_std_kl):
    """top_entropy_quantile < 1: the high-entropy tokens that train are those TRL selects on the informative group
    alone; masked rows' tokens (and those of rows kept for their KL term) would otherwise enter the quantile. Under
    'exclude' the gradients (entropy bonus included) are TRL's on the informative group alone too."""
    config = {"beta": 0.1, "top_entropy_quantile": 0.5, "entropy_coef": 0.05}
    base = make_trainer(ours=False, **config)
    ours = make_trainer(zero_std_normalization=normalization, zero_std_kl=zero_std_kl, **config)
    for trainer in (base, ours):
        move_policy_away(trainer.model)
    base_selected, ours_selected = recording_entropy_masks(base), recording_entropy_masks(ours)
    _, base_grads = loss_and_grads(base, train_batch(base, ["2+3="], INFORMATIVE))
    _, ours_grads = loss_and_grads(ours, train_batch(ours, MIXED_PROMPTS, TIED + INFORMATIVE))
    informative = slice(4, 8) if normalization == "keep" else slice(0, 4)
    assert base_selected[0].any() and not base_selected[0].all()
    assert torch.equal(ours_selected[0][informative], base_selected[0])
    assert not ours_selected[0][:4].any() or normalization == "exclude"
    if normalization == "exclude":
        assert_grads_close(ours_grads, base_grads, rtol=1e-5, atol=1e-7)


@pytest.mark.every_trl
@pytest.mark.parametrize("normalization", ["keep", "exclude"])
def test_adaptive_entropy_controller_reads_the_trained_rows(make_trainer, normalization):
    """use_adaptive_entropy: the mean entropy the controller reads, and so the coefficient it sets, are those of
    TRL run on the informative group alone (the tied rows' tokens would pull the mean down)."""
    config = {"beta": 0.1, "use_adaptive_entropy": True, "entropy_coef": 0.01, "entropy_target": 0.5}
    base = make_trainer(ours=False, **config)
    ours = make_trainer(zero_std_normalization=normalization, **config)
    for trainer in (base, ours):
        move_policy_away(trainer.model)
    _, base_grads = loss_and_grads(base, train_batch(base, ["2+3="], INFORMATIVE))
    _, ours_grads = loss_and_grads(ours, train_batch(ours, MIXED_PROMPTS, TIED + INFORMATIVE))
    assert ours._last_world_entropy == pytest.approx(base._last_world_entropy, rel=1e-6)
    assert ours.entropy_coef == base.entropy_coef
    if normalization == "exclude":
        assert_grads_close(ours_grads, base_grads, rtol=1e-5, atol=1e-7)


@pytest.mark.every_trl
def test_clip_ratio_extremes_cover_the_trained_rows(make_trainer):
    """clip_ratio/low_min and high_max are per-row extremes: masked rows (never clipped) must not enter them."""
    base, ours = clipped_loss_metrics(make_trainer, MIXED_PROMPTS, TIED + INFORMATIVE)
    for key in ("clip_ratio/low_min", "clip_ratio/high_max"):
        assert ours._metrics["train"][key][-1] == base._metrics["train"][key][-1], key


def known_limits() -> set[str]:
    """The metric names docs/flow.md's known limits give (in backticks; the README links them)."""
    flow = (Path(__file__).resolve().parents[2] / "docs" / "flow.md").read_text()
    paragraph = flow[flow.index("## TRL's logged token statistics") :].split("\n\n")[1]
    return set(re.findall(r"`([\w/]+)`", paragraph))


@pytest.mark.every_trl
@pytest.mark.parametrize("config", [{"loss_type": "bnpo"}, {"zero_std_kl": "keep"}], ids=["bnpo-keep", "kl-kept"])
def test_the_known_limits_name_every_logged_token_mean_with_untrained_tokens(make_trainer, config):
    """Under bnpo with 'keep' (the masked rows' tokens stay in TRL's mask for its normaliser) and for rows kept for
    their KL term, TRL's logged token statistics count those rows' tokens: every metric that then differs from TRL's
    on the trained rows alone is named in docs/flow.md's known limits (entropy among them: it reads low)."""
    base, ours = clipped_loss_metrics(make_trainer, MIXED_PROMPTS, TIED + INFORMATIVE, **config)
    ours_metrics, base_metrics = ours._metrics["train"], base._metrics["train"]
    differing = {
        key for key in base_metrics if ours_metrics[key][-1] != pytest.approx(base_metrics[key][-1], rel=1e-5)
    }
    assert "entropy" in differing
    assert differing <= known_limits(), differing - known_limits()


# ---------------------------------------------------------------------------------------------------------------
# Image inputs (a vision-language processor has no pad_token_id of its own; TRL reads its tokenizer's)
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.every_trl
def test_image_inputs_train_end_to_end(tiny_vlm, tmp_path):
    """Real generation with a local vision-language model: the tied group is masked on every step and training
    runs through the image path."""
    trainer = vlm_trainer(tiny_vlm, tmp_path)
    trainer.train()
    logged = [entry for entry in trainer.state.log_history if "zero_std/masked_group_frac" in entry]
    assert len(logged) == 2 and all(entry["zero_std/masked_group_frac"] >= 0.5 for entry in logged)


@pytest.mark.every_trl
def test_image_inputs_tied_group_puts_no_kl_gradient(tiny_vlm, tmp_path):
    grads = {}
    for ours in (True, False):
        trainer = vlm_trainer(tiny_vlm, tmp_path / str(ours), ours=ours)
        move_policy_away(trainer.model)
        batch = vlm_batch(trainer, ["1+1="], TIED)
        assert "pixel_values" in batch
        grads[ours] = loss_and_grads(trainer, batch)[1]
    assert grad_norm(grads[False]) > 1e-4
    assert_all_zero(grads[True])


@pytest.mark.every_trl
def test_image_inputs_exclude_gradients_equal_trl_on_the_informative_group(tiny_vlm, tmp_path):
    """'exclude' with images (each prompt its own image): the masked group's rows leave the micro-batch, images
    included, and the gradients are TRL's on the informative group alone (beta > 0, policy moved)."""
    ours = vlm_trainer(tiny_vlm, tmp_path / "ours", zero_std_normalization="exclude")
    base = vlm_trainer(tiny_vlm, tmp_path / "base", ours=False)
    results = {}
    for trainer, prompts, completions in ((ours, MIXED_PROMPTS, TIED + VLM_INFORMATIVE),
                                          (base, ["2+3="], VLM_INFORMATIVE)):  # fmt: skip
        move_policy_away(trainer.model)
        results[trainer is ours] = loss_and_grads(trainer, vlm_batch(trainer, prompts, completions))
    assert grad_norm(results[False][1]) > 1e-4
    torch.testing.assert_close(results[True][0], results[False][0])
    assert_grads_close(results[True][1], results[False][1], rtol=1e-5, atol=1e-7)


@pytest.mark.every_trl
def test_image_inputs_masked_rows_are_not_forwarded(tiny_vlm, tmp_path):
    """With images, the loss forward gets the informative group's rows and their images only, and the gradients
    equal TRL's forwarding every row with our advantages and the tied rows' tokens masked ("keep", beta > 0)."""
    results, batches = {}, {}
    for ours in (True, False):
        trainer = vlm_trainer(tiny_vlm, tmp_path / str(ours), ours=ours)
        move_policy_away(trainer.model)
        batches[ours] = vlm_batch(trainer, MIXED_PROMPTS, TIED + VLM_INFORMATIVE)
        if not ours:
            batches[False]["advantages"] = batches[True]["advantages"]
            batches[False]["completion_mask"][:4] = 0
        forwarded = []
        forward = trainer.model.forward

        def counting_forward(*args, forwarded=forwarded, forward=forward, **kwargs):
            forwarded.append((kwargs["input_ids"].shape[0], kwargs["pixel_values"].shape[0]))
            return forward(*args, **kwargs)

        trainer.model.forward = counting_forward
        results[ours] = (forwarded, loss_and_grads(trainer, batches[ours]))
    per_image = len(trainer.processing_class.image_processor(prompt_image("1+1="))["pixel_values"])  # rows of one
    assert results[True][0] == [(4, 4 * per_image)] and results[False][0] == [(8, 8 * per_image)]
    (ours_loss, ours_grads), (base_loss, base_grads) = results[True][1], results[False][1]
    assert grad_norm(ours_grads) > 1e-4
    torch.testing.assert_close(ours_loss, base_loss)
    assert_grads_close(ours_grads, base_grads, rtol=1e-5, atol=1e-7)


# ---------------------------------------------------------------------------------------------------------------
# zero_std_kl: the KL term of groups that failed together can be kept (issue: KL pull-back)
# ---------------------------------------------------------------------------------------------------------------

FAILED = ["9", "1", "1 a", "0 b"]  # every answer to "1+1=" wrong: a group tied at the low end
THREE_PROMPTS = ["1+1=", "1+1=", "2+3="]  # failed, all-correct (TIED), informative


def three_groups(trainer):
    trainer.zero_std.reward_range = (0.0, 1.0)  # as seen earlier in training
    return train_batch(trainer, THREE_PROMPTS, FAILED + TIED + INFORMATIVE)


@pytest.mark.every_trl
def test_keep_failed_trains_the_failed_group_on_its_kl_term_only(make_trainer):
    """The failed group's gradient is TRL's on that group (its advantage is 0, so TRL's gradient is the KL term
    alone), with no entropy bonus; the all-correct group's gradient is exactly 0."""
    ours = make_trainer(beta=0.1, zero_std_kl="keep_failed", entropy_coef=0.05)
    base = make_trainer(ours=False, beta=0.1)
    for trainer in (base, ours):
        move_policy_away(trainer.model)
    ours.zero_std.reward_range = (0.0, 1.0)
    _, base_grads = loss_and_grads(base, train_batch(base, ["1+1="], FAILED))
    failed_batch = train_batch(ours, ["1+1="], FAILED)
    _, ours_grads = loss_and_grads(ours, failed_batch)
    assert torch.equal(failed_batch["advantages"], torch.zeros(4)) and failed_batch["completion_mask"].all(dim=1).any()
    assert grad_norm(base_grads) > 1e-4
    assert_grads_close(ours_grads, base_grads, rtol=1e-5, atol=1e-7)
    _, correct = loss_and_grads(ours, train_batch(ours, ["1+1="], TIED))
    assert_all_zero(correct)


@pytest.mark.every_trl
@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_keep_failed_leaves_the_informative_rows_as_under_mask(make_trainer, loss_type):
    """On a batch of a failed, an all-correct and an informative group, ours with keep_failed is TRL's loss with the
    all-correct rows masked and our advantages: the failed rows add their KL term, the informative rows train as
    under 'mask' (same advantages, same normalisers), the all-correct rows add nothing."""
    config = {"beta": 0.1, "loss_type": loss_type, "per_device_train_batch_size": 12}
    kept, masked = make_trainer(zero_std_kl="keep_failed", **config), make_trainer(**config)
    base = make_trainer(ours=False, **config)
    for trainer in (base, kept, masked):
        move_policy_away(trainer.model)
    kept_batch, masked_batch = three_groups(kept), three_groups(masked)
    base_batch = train_batch(base, THREE_PROMPTS, FAILED + TIED + INFORMATIVE)
    assert torch.equal(kept_batch["advantages"], masked_batch["advantages"])
    assert (kept_batch["row_role"] == 2).nonzero().view(-1).tolist() == [0, 1, 2, 3]
    base_batch["advantages"] = kept_batch["advantages"]
    base_batch["completion_mask"][4:8] = 0
    _, kept_grads = loss_and_grads(kept, kept_batch)
    _, masked_grads = loss_and_grads(masked, masked_batch)
    _, base_grads = loss_and_grads(base, base_batch)
    if (
        loss_type == "bnpo"
    ):  # its normaliser, the micro-batch's mask tokens, still counts the all-correct rows' ("keep")
        scale = base_batch["completion_mask"].sum() / kept_batch["base_loss_mask"].sum()
        base_grads = {name: grad * scale for name, grad in base_grads.items()}
    assert_grads_close(kept_grads, base_grads, rtol=1e-5, atol=1e-7)
    assert grad_norm({k: kept_grads[k] - masked_grads[k] for k in kept_grads}) > 1e-5  # the KL pull exists


def test_keep_keeps_the_kl_term_of_every_tied_group(make_trainer):
    ours = make_trainer(beta=0.1, zero_std_kl="keep", per_device_train_batch_size=12)
    batch = three_groups(ours)
    assert (batch["row_role"] == 2).nonzero().view(-1).tolist() == list(range(8))
    assert ours._metrics["train"]["zero_std/kl_kept_row_frac"][-1] == pytest.approx(8 / 12)
    assert ours._metrics["train"]["zero_std/all_low_group_frac"][-1] == pytest.approx(1 / 3)
    assert ours._metrics["train"]["zero_std/all_high_group_frac"][-1] == pytest.approx(1 / 3)


def stall_warnings(trainer, caplog) -> list[str]:
    with caplog.at_level("WARNING", logger="trl_zerostd"):
        trainer.train()
    return [r.getMessage() for r in caplog.records if "stalling" in r.getMessage()]


def logged(trainer, key) -> list[float]:
    return [entry[key] for entry in trainer.state.log_history if key in entry]


def right_then_wrong():
    """Completions: the first generation batch all right (every group tied at 1), every later one all wrong (at 0)."""
    batches = itertools.count()

    def complete(prompts):
        right = next(batches) == 0
        return [str(sum(map(int, p.rstrip("=").split("+")))) if right else "0" for p in prompts]

    return complete


@pytest.mark.parametrize("beta", [0.1, 0.0])
def test_stalled_training_warns_once_naming_the_options_that_would_help(make_trainer, caplog, beta):
    """Three optimizer steps in a row that train no row, the last on groups that all failed: one warning that names
    the ways out; keep_failed only together with beta > 0, since with beta=0 it has no KL term to keep."""
    trainer = stub_generation(make_trainer(max_steps=4, beta=beta), right_then_wrong())
    warnings = stall_warnings(trainer, caplog)
    assert len(warnings) == 1
    assert "3 optimizer steps in a row trained no row" in warnings[0] and "all fail" in warnings[0]
    for option in ("learning_rate", "zero_std_kl='keep_failed'", "dynamic_sampling=True"):
        assert option in warnings[0]
    assert ("beta > 0 with zero_std_kl='keep_failed'" in warnings[0]) == (beta == 0.0)
    assert logged(trainer, "zero_std/untrained_step_frac") == [1.0] * 4
    assert logged(trainer, "zero_std/all_low_group_frac") == [0.0, 1.0, 1.0, 1.0]


def test_a_constant_reward_is_not_all_low_and_its_stall_is_not_called_a_failure(make_trainer, caplog):
    """A reward of 1.0 for every completion: the lowest reward seen is the highest, so no group failed (nor
    succeeded) against another, keep_failed would keep nothing, and the warning says so."""
    trainer = make_trainer(reward_funcs=constant_reward, max_steps=4)
    warnings = stall_warnings(trainer, caplog)
    assert logged(trainer, "zero_std/all_low_group_frac") == [0.0] * 4
    assert logged(trainer, "zero_std/untrained_step_frac") == [1.0] * 4
    assert len(warnings) == 1 and "keep_failed" not in warnings[0] and "all fail" not in warnings[0]
    assert "tell completions apart" in warnings[0]


def test_a_stall_of_truncated_rows_advises_a_longer_max_completion_length(make_trainer, caplog):
    """Every row truncated and masked (mask_truncated_completions): keep_failed cannot help, a longer
    max_completion_length can."""
    trainer = stub_generation(make_trainer(max_steps=3, mask_truncated_completions=True), ["2 a|"])
    warnings = stall_warnings(trainer, caplog)
    assert logged(trainer, "masked/row_frac/truncated") == [1.0] * 3
    assert len(warnings) == 1 and "max_completion_length" in warnings[0]
    assert "keep_failed" not in warnings[0] and "all fail" not in warnings[0]


@pytest.mark.parametrize("zero_std_kl", ["keep_failed", "keep"])
def test_keeping_the_kl_term_with_beta_0_is_refused_naming_both(make_trainer, zero_std_kl):
    """beta=0 (TRL's default) has no KL term: the kept rows would train nothing while their metrics say they do."""
    with pytest.raises(ValueError, match=f"zero_std_kl='{zero_std_kl}' with beta=0"):
        make_trainer(beta=0.0, zero_std_kl=zero_std_kl)


@pytest.mark.every_trl
def test_get_high_entropy_mask_on_a_spec_mock_is_trls():
    """TRL's own TestGetHighEntropyMask calls the method on ``Mock(spec=GRPOTrainer)``, where every attribute of the
    class, our class-level ``_loss_call = None`` too, reads as a child Mock: the override must then be TRL's."""
    from unittest.mock import Mock

    from trl import GRPOTrainer

    def mock(cls):
        trainer = Mock(spec=cls)
        trainer.accelerator = Mock()
        trainer.accelerator.pad_across_processes = lambda tensor, dim, pad_index: tensor
        trainer.accelerator.gather = lambda tensor: tensor
        return trainer

    torch.manual_seed(0)
    entropies, mask = torch.rand(3, 5), (torch.rand(3, 5) > 0.3).float()
    base = GRPOTrainer.get_high_entropy_mask(mock(GRPOTrainer), entropies, mask, 0.5)
    ours = ZeroStdGRPOTrainer.get_high_entropy_mask(mock(ZeroStdGRPOTrainer), entropies, mask, 0.5)
    assert torch.equal(ours, base)
