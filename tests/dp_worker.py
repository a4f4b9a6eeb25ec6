"""Worker of tests/test_distributed.py, launched by ``accelerate launch --multi_gpu --num_processes 2``.

Trains one step of ZeroStdGRPOTrainer (or TRL's GRPOTrainer) on a fixed stubbed global batch and writes, per rank,
the rows it trained on (prompt, completion, advantage, loss tokens), a parameter checksum and rank 0's logs.
Usage: dp_worker.py MODEL_DIR OUT_DIR [grpo|rloo]
"""

import json
import os
import sys

import torch
from datasets import Dataset
from torch import distributed

TESTS = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [TESTS, os.path.join(os.path.dirname(TESTS), "examples")]
from conftest import OUR_CLASSES, answer_reward, stub_generation
from tiny_model import build_tokenizer

GLOBAL_BATCH = 8  # one tied group and one informative group of 4
COMPLETIONS = {"1+1=": ["2", "2 a", "2 bb", "2"], "2+3=": ["5 x", "3", "5", "9 yy"]}


def completions_for(prompts):
    """Rank-independent: the i-th row of a prompt in this call gets COMPLETIONS[prompt][i]."""
    seen = {}
    texts = []
    for prompt in prompts:
        texts.append(COMPLETIONS[prompt][seen.get(prompt, 0)])
        seen[prompt] = seen.get(prompt, 0) + 1
    return texts


def main(model_dir, out_dir, kind="grpo"):
    trainer_cls, config_cls = OUR_CLASSES[kind]
    args = config_cls(
        output_dir=out_dir, per_device_train_batch_size=GLOBAL_BATCH // int(os.environ.get("WORLD_SIZE", "1")),
        num_generations=4, max_completion_length=6, beta=0.1,
        max_steps=1, logging_steps=1, save_strategy="no", report_to="none", use_cpu=True, bf16=False, seed=0,
    )  # fmt: skip
    tokenizer = build_tokenizer()
    trainer = trainer_cls(
        model=model_dir,
        reward_funcs=answer_reward,
        args=args,
        train_dataset=Dataset.from_dict({"prompt": list(COMPLETIONS)}),
        processing_class=tokenizer,
    )
    stub_generation(trainer, completions_for)
    trained_rows = []
    generate_and_score = trainer._generate_and_score_completions

    def recording(inputs):
        output = generate_and_score(inputs)
        texts = tokenizer.batch_decode(output["completion_ids"], skip_special_tokens=True)
        for example, text, advantage, mask in zip(
            inputs, texts, output["advantages"].tolist(), output["completion_mask"].sum(1).tolist(), strict=True
        ):
            trained_rows.append(
                {"prompt": example["prompt"], "completion": text, "advantage": advantage, "tokens": mask}
            )
        return output

    trainer._generate_and_score_completions = recording
    trainer.train()
    rank = distributed.get_rank() if distributed.is_initialized() else 0
    checksum = sum(p.double().sum().item() for p in trainer.model.parameters())
    result = {
        "rank": rank,
        "world_size": trainer.accelerator.num_processes,
        "rows": trained_rows,
        "checksum": checksum,
    }
    if rank == 0:
        result["logs"] = [entry for entry in trainer.state.log_history if "zero_std/masked_group_frac" in entry]
    with open(f"{out_dir}/rank{rank}.json", "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    torch.manual_seed(0)
    main(*sys.argv[1:])
