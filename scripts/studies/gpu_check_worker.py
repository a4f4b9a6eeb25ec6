"""One case of ``scripts/studies/gpu_check.py``, launched by it (``accelerate launch --num_processes 1``): trains the
real model a few steps and writes what the checks read to ``--record`` (JSON); it asserts nothing itself.

Recorded without changing TRL's logic: ``trainer.vllm_generation.generate`` and ``.sync_weights`` are wrapped with
functions that call through. Per generation round: the optimizer step, the prompt ids TRL sent and the prompt ids
vLLM returned (TRL discards them); per sync: the step and, in colocate mode, whether the engine's weights equal the
policy's right after it. After training, where the case asks, one micro-batch of the tied prompts' rows (all masked)
is scored by the trainer in train mode and its loss backpropagated: the gradients it leaves, per parameter. Last the
time ``trainer.train()`` returned, so the parent can time the exit.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch
from datasets import Dataset
from transformers import AutoTokenizer

if __package__ in (None, ""):  # run by path (python scripts/studies/<name>.py): scripts/ holds demo/ and studies/
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from demo.chat_arith_task import QUESTION, final_answer, stop_token_ids
from studies.gpu_check import CASES_BY_NAME, MAX_STEPS, Case, free_port
from trl_zerostd import ZeroStdGRPOConfig, ZeroStdGRPOTrainer, ZeroStdRLOOConfig, ZeroStdRLOOTrainer

NUM_GENERATIONS = 4
PROMPTS_PER_STEP = 4
PROBED = ".layers.0.mlp.down_proj.weight"  # unmerged in vLLM's Llama, and trained at every step


def check_dataset() -> Dataset:
    """8 one-digit sums the model sometimes gets right and 8 three-digit products whose reward is constant (level
    ``tied``): the groups to mask, and a prior for prompt skipping to learn."""
    rows = [(1 + i, 2 + (3 * i) % 7, "+", "1") for i in range(8)]
    rows += [(101 + 37 * i, 203 + 53 * i, "*", "tied") for i in range(8)]
    rows = [row for pair in zip(rows[:8], rows[8:]) for row in pair]
    return Dataset.from_dict(
        {
            "prompt": [[{"role": "user", "content": QUESTION.format(a=a, op=op, b=b)}] for a, b, op, _ in rows],
            "answer": [a + b if op == "+" else a * b for a, b, op, _ in rows],
            "level": [level for *_, level in rows],
        }
    )


class CheckReward:
    """Tied prompts: 0.0. Others: 1.0 for an ended completion whose last number is right, 0.5 for an ended wrong
    one, 0.0 for a truncated one (most groups of 4 differ)."""

    __name__ = "check_reward"

    def __init__(self, stop_ids: list[int]):
        self.stop_ids = frozenset(stop_ids)

    def __call__(self, completions, completion_ids, answer, level, **kwargs) -> list[float]:
        rewards = []
        for completion, ids, expected, lv in zip(completions, completion_ids, answer, level, strict=True):
            text = completion if isinstance(completion, str) else completion[-1]["content"]
            ended = len(ids) > 0 and int(ids[-1]) in self.stop_ids
            rewards.append(0.0 if lv == "tied" else float(ended) * (0.5 + 0.5 * (final_answer(text) == expected)))
        return rewards


def settings(case: Case, output_dir: str, server_url: str | None) -> dict:
    common = dict(
        output_dir=output_dir, per_device_train_batch_size=PROMPTS_PER_STEP * NUM_GENERATIONS,
        num_generations=NUM_GENERATIONS, max_completion_length=16, max_steps=MAX_STEPS, learning_rate=1e-5, beta=0.04,
        bf16=True, gradient_accumulation_steps=1, logging_steps=1, save_strategy="no", report_to="none", seed=0,
    )  # fmt: skip
    if case.generation != "hf":
        common.update(use_vllm=True, vllm_mode=case.generation, vllm_max_model_length=512)
        if case.generation == "colocate":
            common["vllm_gpu_memory_utilization"] = 0.2
        else:
            common.update(vllm_server_base_url=server_url, vllm_group_port=free_port())
        if case.kind == "grpo":  # TRL's default is on; the case that wants it says so
            common["vllm_importance_sampling_correction"] = False
    return {**common, **case.config}


class Recorder:
    """Wraps the trainer's vLLM generation (calls through) and records rounds, syncs and weight probes."""

    def __init__(self, trainer):
        self.trainer, self.events, self.calls, self.probes = trainer, [], [], []
        generation = trainer.vllm_generation
        generate, sync_weights = generation.generate, generation.sync_weights

        def recorded_generate(prompts, *args, **kwargs):
            output = generate(prompts, *args, **kwargs)
            step = trainer.state.global_step
            self.events.append(("generate", step))
            sent, returned = [list(map(int, ids)) for ids in prompts], [list(map(int, ids)) for ids in output[0]]
            self.calls.append({"step": step, "prompts": sent, "returned": returned})
            return output

        def recorded_sync_weights(*args, **kwargs):
            output = sync_weights(*args, **kwargs)
            self.events.append(("sync", trainer.state.global_step))
            if generation.mode == "colocate":
                self.probes.append(self.engine_matches_policy())
            return output

        generation.generate, generation.sync_weights = recorded_generate, recorded_sync_weights
        if generation.mode == "colocate":  # the engine's own sleep: what the package holds until a batch ends
            llm, sleep = generation.llm, generation.llm.sleep

            def recorded_sleep(*args, **kwargs):
                self.events.append(("sleep", trainer.state.global_step))
                return sleep(*args, **kwargs)

            llm.sleep = recorded_sleep

    def engine_matches_policy(self) -> bool | str:
        """Whether one trained weight in the colocated engine equals the policy's, cast to the engine's dtype (what
        the sync's copy does); the path is the one TRL's own sync loads through."""
        try:
            engine_model = self.trainer.vllm_generation.llm.llm_engine.model_executor.driver_worker.model_runner.model
            engine = next(p for name, p in engine_model.named_parameters() if name.endswith(PROBED))
            policy_model = self.trainer.accelerator.unwrap_model(self.trainer.model)
            policy = next(p for name, p in policy_model.named_parameters() if name.endswith(PROBED))
            return bool(torch.equal(engine.detach(), policy.detach().to(engine.device, engine.dtype)))
        except Exception as error:  # reported as a failed probe, with its reason
            return f"probe failed: {error!r}"


def masked_micro_batch_gradients(trainer, dataset: Dataset) -> dict:
    """Score a micro-batch of the tied prompts' rows in train mode (every group ties, so every row is masked), take
    the loss's backward, and count the parameters it reached and those whose gradient is not exactly zero."""
    tied = [row for row in dataset if row["level"] == "tied"][:PROMPTS_PER_STEP]
    rows = [row for row in tied for _ in range(NUM_GENERATIONS)]
    model = trainer.model_wrapped
    model.train()
    if not trainer.is_deepspeed_enabled:  # DeepSpeed's step already cleared its gradients
        trainer.model.zero_grad(set_to_none=True)
    batch = trainer._generate_and_score_completions(rows)
    with trainer.compute_loss_context_manager():
        loss = trainer.compute_loss(model, batch)
    if trainer.is_deepspeed_enabled:
        from deepspeed.utils import safe_get_full_grad

        model.backward(loss)  # the engine's own backward; accelerate's would also step
        grad_of = safe_get_full_grad
    else:
        trainer.accelerator.backward(loss)
        grad_of = lambda param: param.grad  # noqa: E731
    tensors, nonzero = 0, []
    for name, param in trainer.accelerator.unwrap_model(trainer.model).named_parameters():
        grad = grad_of(param)
        if grad is None:
            continue
        grad = grad.full_tensor() if hasattr(grad, "full_tensor") else grad  # FSDP2's DTensor
        tensors += 1
        if torch.count_nonzero(grad).item():
            nonzero.append(name)
    return {"tensors": tensors, "nonzero": nonzero, "loss": float(loss.detach().float()), "dtype": str(loss.dtype)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", choices=list(CASES_BY_NAME), required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--record", type=Path, required=True)
    parser.add_argument("--output-dir", required=True)
    parser.add_argument("--server-url")
    args = parser.parse_args()
    case = CASES_BY_NAME[args.case]
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    dataset = check_dataset()
    trainer_cls, config_cls = (
        (ZeroStdGRPOTrainer, ZeroStdGRPOConfig) if case.kind == "grpo" else (ZeroStdRLOOTrainer, ZeroStdRLOOConfig)
    )
    trainer = trainer_cls(
        model=args.model,
        reward_funcs=CheckReward(stop_token_ids(tokenizer)),
        args=config_cls(**settings(case, args.output_dir, args.server_url)),
        train_dataset=dataset,
        processing_class=tokenizer,
    )
    recorder = Recorder(trainer) if case.generation != "hf" else None
    trainer.train()
    train_end = time.time()
    record = {"case": case.name, "global_step": trainer.state.global_step, "train_end": train_end}
    if case.zero_grad:
        record["zero_grad"] = masked_micro_batch_gradients(trainer, dataset)
    if recorder is not None:
        record.update(events=recorder.events, calls=recorder.calls, probes=recorder.probes)
    key = "zero_std/masked_group_frac"
    record["masked_group_frac"] = [entry[key] for entry in trainer.state.log_history if key in entry]
    if trainer.accelerator.is_main_process:
        partial = args.record.with_suffix(".partial")
        partial.write_text(json.dumps(record))
        os.replace(partial, args.record)
    print(f"gpu-check worker: {case.name} done, {time.time() - train_end:.1f} s after training", flush=True)


if __name__ == "__main__":
    main()
