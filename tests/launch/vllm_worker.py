"""Worker of tests/launch/test_vllm_two_processes.py: TRL's vLLM code (server or colocate) over the stand-in engine
(``tests/support/fake_vllm.py``), launched from the repository root: ``accelerate launch -m
tests.launch.vllm_worker`` with 2 processes, ``python -m tests.launch.vllm_worker`` with one.

Trains ``max_steps`` steps on a global batch of 8 rows (two groups of 4) and writes, per rank, the rows it trained
(prompt, completion, advantage, loss tokens), the scored rows whose completion came from another prompt, the engine's
calls and syncs, and a parameter checksum.

Usage: python -m tests.launch.vllm_worker MODEL_DIR OUT_ROOT RUN [RUN ...], where RUN is ``KIND-MODE-FEATURE``,
written to ``OUT_ROOT/RUN/rank{r}.json``: one launch runs every RUN in turn, each a trainer and an engine of its own.
"""

import json
import os
import sys

import pytest
import torch
from datasets import Dataset

from demo.tiny_model import build_tokenizer
from demo.train_cli import end_run
from tests.launch.dp_worker import checksum, record_trained_rows
from tests.support.fake_vllm import Engine, completions_by_index, install
from tests.support.launching import train_each
from tests.support.trainers import OUR_CLASSES, move_policy_away
from tests.support.vllm_cases import DATA, FEATURES, GLOBAL_BATCH, TEXTS, VLLM, OriginReward


def main(model_dir, out_root, *runs):
    """Every run of ``runs`` in turn; returns the accelerator (its state is the process's, shared by the runs)."""
    return train_each(train_one, model_dir, out_root, runs)


def train_one(model_dir, out_dir, kind, mode, feature):
    """One run: our ``kind`` trainer on TRL's vLLM code in ``mode`` with ``feature`` on; writes this rank's result."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    tokenizer = build_tokenizer()
    with pytest.MonkeyPatch.context() as monkeypatch:
        engine = install(monkeypatch, Engine(tokenizer, completions_by_index(TEXTS)))
        trainer_cls, config_cls = OUR_CLASSES[kind]
        settings = dict(
            output_dir=out_dir, per_device_train_batch_size=GLOBAL_BATCH // world, num_generations=4,
            learning_rate=1e-2, max_steps=3, logging_steps=1, save_strategy="no", report_to="none", use_cpu=True,
            bf16=False, seed=0, vllm_mode=mode, **VLLM, **FEATURES[feature],
        )  # fmt: skip
        if kind == "grpo":
            settings["vllm_importance_sampling_correction"] = False
        reward = OriginReward()
        trainer = trainer_cls(
            model=model_dir, reward_funcs=reward, args=config_cls(**settings),
            train_dataset=Dataset.from_dict({"prompt": DATA}), processing_class=tokenizer,
        )  # fmt: skip
        engine.policy = trainer.model
        with torch.no_grad():
            move_policy_away(trainer.model)
        trained = record_trained_rows(trainer, tokenizer)
        trainer.train()
    rank = trainer.accelerator.process_index
    result = {
        "world_size": trainer.accelerator.num_processes,
        "rows": trained,
        "scored_rows": reward.rows,
        "foreign": reward.foreign,
        "calls": [[call.prompts, call.n, call.weights_current] for call in engine.calls],
        "syncs": engine.syncs,
        "checksum": checksum(trainer.model),
    }
    with open(f"{out_dir}/rank{rank}.json", "w") as f:
        json.dump(result, f)
    return trainer.accelerator


if __name__ == "__main__":
    torch.manual_seed(0)
    end_run(main(*sys.argv[1:]))
