"""The contract with TRL: each test states one thing the package relies on in TRL's own trainers (a method and its
signature, a returned tuple's layout, a store the adapter reads or writes) and checks it on TRL's classes or on
base TRL's trainer (never ours), so a failure names the reliance that a TRL release broke, not a symptom of it.

Try a new TRL: ``pip install trl==X`` in a fresh environment (``make test-trl TRL=X`` makes one), run
``pytest tests/trl_contract``, mend ``trl_zerostd/trainer/trl_layout.py`` (and the override named in the failing
test's docstring), then run the whole suite. Each test's docstring says which of our code reads what it pins.
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Mapping

import pytest
import torch
from trl import GRPOConfig, GRPOTrainer, RLOOTrainer
from trl.generation.vllm_generation import VLLMGeneration
from trl.trainer import utils as trl_utils

from tests.support.trainers import MIXED_PROMPTS, rows_of, stub_generation
from trl_zerostd import core
from trl_zerostd.trainer import trl_layout

pytestmark = pytest.mark.every_trl  # the contract is what each release is checked against

TRAINERS = {"grpo": GRPOTrainer, "rloo": RLOOTrainer}
COMPLETIONS = ["2", "2 a", "2 bb", "2", "5 x", "3", "5", "9 yy"]  # a tied group and an informative one


def parameters(method) -> list[str]:
    return list(inspect.signature(method).parameters)


@pytest.fixture(params=["grpo", "rloo"])
def base_trainer(request, make_trainer):
    """Base TRL's trainer of each kind on the tiny model, its token generation stubbed (``stub_generation``), the
    policy in training mode."""
    trainer = stub_generation(make_trainer(request.param, ours=False), COMPLETIONS)
    trainer.model.train()
    return trainer


# The methods the adapter overrides, called back through super() with these arguments


@pytest.mark.parametrize("kind", ["grpo", "rloo"])
def test_generate_and_score_completions_takes_the_batchs_rows(kind):
    """``adapter._generate_and_score_completions`` calls TRL's with this rank's dataset rows."""
    assert parameters(TRAINERS[kind]._generate_and_score_completions) == ["self", "inputs"]


@pytest.mark.parametrize("kind", ["grpo", "rloo"])
def test_generate_takes_the_prepared_prompts(kind):
    """``adapter._generate`` calls TRL's ``_generate(prompts)``."""
    assert parameters(TRAINERS[kind]._generate) == ["self", "prompts"]


@pytest.mark.parametrize("kind", ["grpo", "rloo"])
def test_calculate_rewards_takes_rows_prompts_completions_and_ids(kind):
    """``adapter._score_generation`` scores a generation with TRL's ``_calculate_rewards``, positionally."""
    expected = ["self", "inputs", "prompts", "completions", "completion_ids_list"]
    assert parameters(TRAINERS[kind]._calculate_rewards) == expected


def test_grpo_generate_single_turn_takes_a_number_of_copies_and_tool_images():
    """``grpo.ZeroStdGRPOTrainer._generate_single_turn`` decodes in calls with the copies per prompt it chooses."""
    expected = ["self", "prompt_ids", "images", "multimodal_fields", "num_generations", "has_tool_images"]
    assert parameters(GRPOTrainer._generate_single_turn) == expected


def test_rloo_generate_single_turn_asks_for_num_generations_copies_itself():
    """``rloo.ZeroStdRLOOTrainer._generate_single_turn`` sets ``num_generations`` around TRL's call instead."""
    assert parameters(RLOOTrainer._generate_single_turn) == ["self", "prompt_ids", "images", "multimodal_fields"]


@pytest.mark.parametrize("kind", ["grpo", "rloo"])
def test_log_prob_forward_takes_model_ids_mask_and_logits_to_keep_first(kind):
    """``adapter._get_per_token_logps_and_entropies`` reads its first four arguments and passes the rest on."""
    trainer_cls = TRAINERS[kind]
    names = parameters(trainer_cls._get_per_token_logps_and_entropies)
    assert names[:2] == ["self", "model"]
    if "args" not in names:
        assert names[2:5] == ["input_ids", "attention_mask", "logits_to_keep"]
        return
    # TRL 1.14: ``(self, model, *args, ...)``, passed on to the full-logits path (and Liger's chunked one, if any)
    paths = [
        getattr(trainer_cls, name) for name in ("_full_logits_logps", "_chunked_logps") if hasattr(trainer_cls, name)
    ]
    assert paths, "a log-prob forward of (model, *args) passes them on to _full_logits_logps"
    for path in paths:
        assert parameters(path)[:5] == ["self", "model", "input_ids", "attention_mask", "logits_to_keep"], path


@pytest.mark.parametrize("kind", ["grpo", "rloo"])
def test_compute_loss_hook_takes_the_model_and_a_micro_batch(kind):
    """``adapter._compute_loss`` wraps TRL's per-micro-batch loss."""
    assert parameters(TRAINERS[kind]._compute_loss) == ["self", "model", "inputs"]


def test_high_entropy_mask_takes_entropies_mask_and_threshold():
    """``grpo.get_high_entropy_mask`` narrows the mask TRL passes to the rows with a policy term."""
    assert parameters(GRPOTrainer.get_high_entropy_mask) == ["self", "entropies", "mask", "threshold"]


@pytest.mark.parametrize("kind", ["grpo", "rloo"])
def test_checkpoint_hooks_are_the_trainers(kind):
    """``adapter._save_checkpoint`` and ``_load_optimizer_and_scheduler`` carry the package's state."""
    assert parameters(TRAINERS[kind]._save_checkpoint) == ["self", "model", "trial"]
    assert parameters(TRAINERS[kind]._load_optimizer_and_scheduler) == ["self", "checkpoint"]


# What TRL's methods return and read, on base TRL's trainer


def test_generate_returns_the_per_row_fields_of_its_layout(base_trainer):
    """``trl_layout.GRPOGenerated`` (8 fields) and ``RLOOGenerated`` (3): what ``_generate`` returns, split per row
    by the refill."""
    generated = base_trainer._generate(MIXED_PROMPTS * 4)
    layout = trl_layout.GRPOGenerated if isinstance(base_trainer, GRPOTrainer) else trl_layout.RLOOGenerated
    assert len(generated) == len(layout._fields)
    out = layout(*generated)
    assert len(out.prompt_ids) == len(out.completion_ids) == len(out.completions) == 8
    assert all(isinstance(ids, list) and all(isinstance(t, int) for t in ids) for ids in out.completion_ids)
    if isinstance(out, trl_layout.GRPOGenerated):
        assert out.tool_mask is None and out.sampling_per_token_logps is None  # no tools, no vLLM
        assert isinstance(out.extra_fields, dict) and out.images is None and out.tool_images == []


def test_the_method_reads_after_generate_the_lists_it_gave_it(base_trainer):
    """``refill_passes.RefillPasses._hand_over`` rewrites, in the last round, the ``prompts`` list TRL handed to
    ``_generate`` and the ``inputs`` it was called with: TRL must score and log those same lists afterwards."""
    seen = {}
    generate, calculate_rewards = base_trainer._generate, base_trainer._calculate_rewards

    def recording_generate(prompts):
        seen["prompts"] = prompts
        return generate(prompts)

    def recording_rewards(inputs, prompts, completions, completion_ids_list):
        seen["rewards"] = (inputs, prompts)
        return calculate_rewards(inputs, prompts, completions, completion_ids_list)

    base_trainer._generate, base_trainer._calculate_rewards = recording_generate, recording_rewards
    rows = rows_of(base_trainer, MIXED_PROMPTS)
    base_trainer._generate_and_score_completions(rows)
    assert seen["rewards"][0] is rows and seen["rewards"][1] is seen["prompts"]


def test_an_exception_from_generate_ends_the_method_with_nothing_after_it_kept(base_trainer):
    """``refill_passes.RoundGenerated``: a refill round that more rounds follow ends TRL's method by raising from
    ``_generate``; TRL must let it through (no handler in its method), log nothing of that pass after the call, and
    run its next call as ever."""

    class Ended(Exception):
        pass

    generate = base_trainer._generate

    def generate_then_end(prompts):
        generate(prompts)
        raise Ended

    base_trainer._generate = generate_then_end
    with pytest.raises(Ended):
        base_trainer._generate_and_score_completions(rows_of(base_trainer, MIXED_PROMPTS))
    assert "reward" not in base_trainer._metrics["train"] and not base_trainer._logs["prompt"]
    assert "num_tokens" in base_trainer._metrics["train"]  # what TRL's _generate logs itself stays
    base_trainer._generate = generate
    output = base_trainer._generate_and_score_completions(rows_of(base_trainer, MIXED_PROMPTS))
    assert output["advantages"].shape == (8,) and len(base_trainer._logs["prompt"]) == 8


def test_the_batch_output_holds_what_the_adapter_rewrites(base_trainer):
    """``adapter._apply_plan`` and ``loss.mark_rows`` rewrite these keys of the method's output, one row per dataset
    row; GRPO's ``num_items_in_batch`` is the gathered loss-mask token count, which ``zero_std_normalization=
    "exclude"`` recomputes; RLOO's ``old_logps`` is per row (``rloo._finish_output`` zeroes the masked rows')."""
    output = base_trainer._generate_and_score_completions(rows_of(base_trainer, MIXED_PROMPTS))
    for key in ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "advantages"):
        assert key in output, key
    assert output["advantages"].shape == (8,)
    assert output["completion_ids"].shape == output["completion_mask"].shape
    if isinstance(base_trainer, GRPOTrainer):
        assert int(output["num_items_in_batch"]) == int(output["completion_mask"].sum())
    else:
        assert output["old_logps"].shape == (8,)


def test_log_prob_forward_returns_logps_entropies_and_an_aux_loss(base_trainer):
    """``adapter._get_per_token_logps_and_entropies`` (and ``loss.rows_forward``) read a 3-tuple, ``(B, T)`` first."""
    ids = torch.tensor([[5, 6, 7, 8], [5, 6, 9, 1]])
    with torch.no_grad():
        result = base_trainer._get_per_token_logps_and_entropies(
            base_trainer.model, ids, torch.ones_like(ids), 2, compute_entropy=True
        )
    assert len(result) == 3 and result[0].shape == (2, 2) and result[1].shape == (2, 2)


def test_the_metric_store_and_logs_are_lists_per_name(base_trainer):
    """``trl_layout.log_metrics`` appends to ``_metrics["train"][name]``; ``replace_logged_advantages`` replaces the
    last rows of ``_logs["advantages"]``."""
    base_trainer._generate_and_score_completions(rows_of(base_trainer, MIXED_PROMPTS))
    assert isinstance(base_trainer._metrics, Mapping) and set(base_trainer._metrics) >= {"train", "eval"}
    assert all(isinstance(values, list) for values in base_trainer._metrics["train"].values())
    base_trainer._metrics["train"]["new/metric"].append(1.0)  # a new name starts a list (defaultdict)
    assert len(base_trainer._logs["advantages"]) == 8 and len(base_trainer._logs["prompt"]) == 8


def test_reward_functions_logs_wait_in_pending_stores(base_trainer):
    """``trl_layout.take_logged_columns`` / ``take_pending_metrics`` take what reward functions logged
    (``log_extra``, ``log_metric``: TRL's ``_log_completion_extra`` and ``_log_metric``) from
    ``_pending_extra_logs`` (a list of values per column) and ``_pending_metrics`` (a list per name)."""
    base_trainer._log_completion_extra("column", ["a", "b"])
    base_trainer._log_metric("scalar", 0.5)
    assert list(base_trainer._pending_extra_logs["column"]) == ["a", "b"]
    assert list(base_trainer._pending_metrics["scalar"]) == [0.5]
    taken = trl_layout.take_logged_columns(base_trainer, 2)
    assert taken == [{"column": "a"}, {"column": "b"}] and not base_trainer._pending_extra_logs


@pytest.mark.parametrize("kind", ["grpo", "rloo"])
def test_the_truncation_check_reads_the_stop_tokens_the_layout_names(kind, base_trainer):
    """``trl_layout.stop_token_ids``: TRL's truncation check (``mask_truncated_completions``) ends a completion at
    ``eos_token_ids`` where the trainer has it (1.15 on), else at the tokenizer's ``eos_token_id`` (1.14), then pad."""
    source = inspect.getsource(TRAINERS[kind]._generate_and_score_completions)
    if hasattr(base_trainer, "eos_token_ids"):
        assert "[*self.eos_token_ids, self._tokenizer.pad_token_id]" in source
    else:
        assert "[self._tokenizer.eos_token_id, self._tokenizer.pad_token_id]" in source
    assert trl_layout.end_token_ids(base_trainer)[-1] == base_trainer._tokenizer.pad_token_id


@pytest.mark.parametrize("kind", ["grpo", "rloo"])
def test_a_second_declared_eos_ends_a_completion_where_the_layout_says(kind, make_trainer, base_model, tokenizer):
    """``trl_layout.end_token_ids`` on real completions: with a model that declares a second eos id (as many chat
    models do), each completion TRL's ``mask_truncated_completions`` masks is one the package calls truncated, and no
    other. From 1.15 a completion ending in the second id is whole; 1.14 reads the tokenizer's eos alone."""
    second = tokenizer.convert_tokens_to_ids("x")
    model = copy.deepcopy(base_model)
    model.generation_config.eos_token_id = [tokenizer.eos_token_id, second]
    completions = ["2x|", "2|", "2", "5 x|"]  # "|": cut there, no eos (tests.support.trainers.encode_completion)
    trainer = make_trainer(kind, ours=False, model=model, mask_truncated_completions=True)
    trainer = stub_generation(trainer, completions)
    trainer.model.train()
    output = trainer._generate_and_score_completions(rows_of(trainer, MIXED_PROMPTS))
    masked_by_trl = output["completion_mask"].sum(dim=1) == 0
    completion_ids = [[t for t in row if t != tokenizer.pad_token_id] for row in output["completion_ids"].tolist()]
    ends_in_second = torch.tensor([ids[-1] == second for ids in completion_ids])
    assert ends_in_second.any() and masked_by_trl.any()
    assert torch.equal(core.truncated_rows(completion_ids, trl_layout.end_token_ids(trainer)), masked_by_trl)
    assert (second in trl_layout.stop_token_ids(trainer)) == hasattr(trainer, "eos_token_ids")


@pytest.mark.parametrize("kind", ["grpo", "rloo"])
def test_the_trainer_attributes_the_adapter_reads(kind):
    """``adapter``, ``grpo`` and ``rloo`` read these attributes of TRL's trainer, set in its ``__init__``."""
    common = ["num_generations", "reward_func_names", "reward_weights", "use_vllm", "vllm_mode", "shuffle_dataset",
              "mask_truncated_completions", "_tokenizer", "_metrics", "_logs", "_pending_extra_logs",
              "_pending_metrics", "beta", "vllm_generation"]  # fmt: skip
    own = {"grpo": ["scale_rewards", "multi_objective_aggregation", "loss_type", "vllm_importance_sampling_correction",
                    "vllm_importance_sampling_mode", "vllm_importance_sampling_clip_min",
                    "vllm_importance_sampling_clip_max", "rollout_func", "environment_factories"],
           "rloo": ["normalize_advantages", "reward_clip_range"]}  # fmt: skip
    source = inspect.getsource(TRAINERS[kind].__init__)
    missing = [name for name in common + own[kind] if f"self.{name} =" not in source and f"self.{name}:" not in source]
    assert not missing, f"{TRAINERS[kind].__name__}.__init__ no longer sets {missing}"


def test_environments_are_drawn_from_a_pool_per_name():
    """``trl_layout.EnvironmentDraws`` shows each refill round the pool's undrawn instances (``_environment_pool``:
    name -> list, handed out from the start at each call of the method; ``environments``: the batch's instances);
    ``set_batch_environments`` writes ``_batch_environments`` under ``_multi_environment``."""
    init = inspect.getsource(GRPOTrainer.__init__)
    method = inspect.getsource(GRPOTrainer._generate_and_score_completions)
    assert "self._environment_pool = {}" in init and "self._multi_environment" in init
    assert "pool_cursor = {}" in method and "self._environment_pool[" in method
    assert "self.environments" in method and "self._batch_environments" in method


def test_vllm_generation_exposes_its_engine_mode_and_sleep_flag():
    """``engine.HeldSleep`` stands in for ``VLLMGeneration.llm`` and clears ``_llm_weights_sleeping``; it reads
    ``mode`` and ``enable_sleep_mode``."""
    source = inspect.getsource(VLLMGeneration)
    for name in ("self.llm =", "self.mode =", "self.enable_sleep_mode =", "self._llm_weights_sleeping ="):
        assert name in source, name
    generate = inspect.getsource(VLLMGeneration.generate)  # what HeldSleep intercepts: a sleep after each call
    assert "self._llm_weights_sleeping" in generate and "self.llm.sleep(" in generate


def test_the_batch_is_shuffled_and_split_with_its_extra_per_row_keys():
    """``loss.mark_rows`` adds ``row_role``, ``base_loss_mask`` and ``tied_sign`` to the method's output; TRL's
    ``_prepare_inputs`` shuffles and splits every per-row tensor with TRL's own (``shuffle_sequence_dict``,
    ``split_tensor_dict``), so each micro-batch's extra keys stay with its rows."""
    assert "shuffle_sequence_dict(" in inspect.getsource(GRPOTrainer._prepare_inputs)
    assert "split_tensor_dict(" in inspect.getsource(GRPOTrainer._prepare_inputs)
    rows = torch.arange(6)
    batch = {"prompt_ids": rows.unsqueeze(1), "row_role": rows * 10, "num_items_in_batch": torch.tensor(9)}
    torch.manual_seed(0)
    shuffled = trl_utils.shuffle_sequence_dict(batch)
    assert torch.equal(shuffled["row_role"], shuffled["prompt_ids"].squeeze(1) * 10)
    for part in trl_utils.split_tensor_dict(shuffled, 2):
        assert torch.equal(part["row_role"], part["prompt_ids"].squeeze(1) * 10)


@pytest.mark.parametrize("kind", ["grpo", "rloo"])
def test_the_loss_reads_the_scoring_forwards_by_these_keys(kind):
    """``loss.py`` and ``grpo._loss_inputs`` read and fill the scoring forwards' log-probs by these batch keys; RLOO's
    loss reads its per-row ``old_logps`` (``rloo._finish_output``)."""
    source = inspect.getsource(TRAINERS[kind]._compute_loss)
    keys = {"grpo": ("old_per_token_logps", "ref_per_token_logps"), "rloo": ('inputs["old_logps"]',)}[kind]
    for key in (*keys, 'inputs["advantages"]'):
        assert key in source, key


def test_pixel_values_split_and_unsplit_by_image_grid():
    """``loss.py`` selects the rows a forward reads of a Qwen2-VL batch with TRL's pixel-value helpers."""
    grid = torch.tensor([[1, 2, 2], [1, 2, 2]])
    batch = {"pixel_values": torch.arange(8.0).reshape(8, 1), "image_grid_thw": grid, "num_images": [1, 1]}
    split = trl_utils.split_pixel_values_by_grid(batch)
    assert len(split["pixel_values"]) == 2
    assert torch.equal(trl_utils.unsplit_pixel_values_by_grid(split)["pixel_values"], batch["pixel_values"])


def test_the_config_sizes_a_generation_batch():
    """``trl_layout.generation_batch_rows`` sizes an engine call by TRL's ``steps_per_generation``."""
    args = GRPOConfig(output_dir="unused", per_device_train_batch_size=8, num_generations=4, use_cpu=True)
    assert args.steps_per_generation == args.gradient_accumulation_steps


def test_repeat_sampler_draws_each_pass_from_its_seeded_generator_alone():
    """``trl_layout.seeded_sampler_randomness`` reads ``RepeatSampler``'s ``shuffle``, ``seed`` and ``generator``, and
    ``sampling.passes.ReplayedPasses`` replays a pass by reseeding that generator and drawing the passes before it: a
    pass's order must come from that generator alone, and a fresh sampler of the same seed must not go on from
    where another left off (the fault the replay mends: it draws the first pass again)."""
    dataset = list(range(8))
    sampler = trl_utils.RepeatSampler(dataset, mini_repeat_count=2, batch_size=4, repeat_count=2, seed=7)
    assert sampler.shuffle and sampler.seed == 7 and isinstance(sampler.generator, torch.Generator)
    passes = [list(sampler) for _ in range(3)]
    assert passes[1] != passes[0]
    sampler.generator.manual_seed(7)
    assert [list(sampler) for _ in range(3)] == passes
    fresh = trl_utils.RepeatSampler(dataset, mini_repeat_count=2, batch_size=4, repeat_count=2, seed=7)
    assert list(fresh) == passes[0]


@pytest.mark.parametrize("kind", ["grpo", "rloo"])
def test_step_counts_the_micro_batches_trained_and_a_generation_batch_spans_num_iterations_of_them(kind, make_trainer):
    """``trl_layout.generation_phase`` reads ``_step`` (micro-batches trained, not checkpointed) against
    ``steps_per_generation x num_iterations``: after one step of two under num_iterations 2, one micro-batch of the
    generation batch has trained and its completions are buffered (``_buffered_inputs``, in memory only)."""
    trainer = make_trainer(kind, ours=False, num_iterations=2, max_steps=1)
    trainer.train()
    assert trainer._step == 1 and trainer._buffered_inputs is not None
    assert trl_layout.generation_phase(trainer) == 1
