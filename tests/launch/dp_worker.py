"""Worker of tests/launch/test_distributed.py and test_sharded.py, launched by ``accelerate launch -m
tests.launch.dp_worker`` with 2 processes from the repository root (or called in-process).

Trains ``max_steps`` steps of ZeroStdGRPOTrainer or ZeroStdRLOOTrainer on a stubbed global batch of 8 rows (two
groups of 4) and writes, per rank, the rows it trained on (prompt, completion, advantage, loss tokens), parameter
checksums before and after, and rank 0's logs. Scenarios:

- ``masking``: prompts "1+1=" (tied) and "2+3=" (informative), one step; ``masking_exclude`` the same with
  ``zero_std_normalization="exclude"`` (one rank's rows all leave its loss, the other's all stay);
- ``dynamic``: dynamic sampling over four prompts, "1+1=" tied, two steps;
- ``dynamic_cap``: dynamic sampling with a constant reward, so every group is zero-variance and the cap is reached;
- ``skipping``: dynamic sampling and prompt skipping over four prompts, "1+1=" tied, three steps;
  ``skipping_streaming`` the same over a streaming dataset (histories keyed by hashed prompts);
- ``skipping_alone``: prompt skipping without dynamic sampling (a skipped prompt's place goes to the next prompt
  drawn), six steps;
- ``entropy``: ``masking``'s batch with ``tied_group_entropy_scale=0.2`` (the tied group trains on RL-ZVP's token
  advantages), two steps.

Usage: python -m tests.launch.dp_worker MODEL_DIR OUT_ROOT RUN [RUN ...], where RUN is ``KIND-SCENARIO`` (our
trainer) or ``KIND-SCENARIO-base`` (TRL's own), written to ``OUT_ROOT/RUN/rank{r}.json``. One launch runs every RUN in
turn, each a trainer of its own: a launch's cost is mostly its processes importing torch, transformers and TRL.
"""

import contextlib
import json
import os
import sys

import torch
from datasets import Dataset
from torch import distributed

from demo.tiny_model import build_tokenizer
from demo.train_cli import end_run
from tests.support.launching import train_each
from tests.support.trainers import (
    BASE_CLASSES,
    OUR_CLASSES,
    answer_reward,
    constant_reward,
    move_policy_away,
    stub_generation,
)
from trl_zerostd.core.settings import ZERO_STD_FIELDS
from trl_zerostd.trainer.adapter import ZeroStdAdapter

GLOBAL_BATCH = 8
# Completions cycle with period 2 over the rows of a generation call in their global order (this rank's call is its
# slice of the round: the rows before it are RANK times as many), so they do not depend on how a round's rows are
# split over ranks, even a prompt's rows cut at an odd place, as long as every rank decodes its rows in one call.
COMPLETIONS = {"1+1=": ["2", "2 a"], "2+3=": ["5 x", "3"], "4+4=": ["8", "1 x"], "3+5=": ["9", "8 y"]}
SCENARIOS = {
    "masking": {"prompts": ["1+1=", "2+3="], "config": {}, "reward": answer_reward},
    "masking_exclude": {
        "prompts": ["1+1=", "2+3="],
        "config": {"zero_std_normalization": "exclude"},
        "reward": answer_reward,
    },  # fmt: skip
    "dynamic": {
        "prompts": list(COMPLETIONS),
        "config": {"dynamic_sampling": True, "max_steps": 2},
        "reward": answer_reward,
    },
    "dynamic_cap": {
        "prompts": list(COMPLETIONS),
        "config": {"dynamic_sampling": True, "dynamic_sampling_max_rounds": 3},
        "reward": constant_reward,
    },
    "skipping": {
        "prompts": list(COMPLETIONS),
        "config": {"dynamic_sampling": True, "skip_zero_std_prompts": True, "max_steps": 3},
        "reward": answer_reward,
    },
    "skipping_alone": {  # no dynamic sampling: a skipped prompt's place goes to the next prompt drawn
        "prompts": list(COMPLETIONS),
        "config": {"skip_zero_std_prompts": True, "max_steps": 6},
        "reward": answer_reward,
    },
}
# the train set as an IterableDataset: histories keyed by hashed prompts
SCENARIOS["skipping_streaming"] = {**SCENARIOS["skipping"], "streaming": True}
# "1+1=" always right trains on its tie: entropy-shaped token advantages at the loss
SCENARIOS["entropy"] = {**SCENARIOS["masking"], "config": {"tied_group_entropy_scale": 0.2, "max_steps": 2}}


# the runs the tests launch data-parallel, all in one launch: test_distributed's, and test_sharded's reference
DDP_RUNS = [
    *(f"{kind}-{scenario}" for kind in ("grpo", "rloo") for scenario in ("masking", "masking_exclude")),
    *(f"grpo-{scenario}" for scenario in ("entropy", "dynamic", "dynamic_cap", "skipping", "skipping_alone")),
    "grpo-skipping_streaming",
]


def completions_for(prompts):
    """Rank-independent: the row at global place ``k`` of the call gets COMPLETIONS[prompt][k % 2]."""
    offset = int(os.environ.get("RANK", "0")) * len(prompts)
    return [COMPLETIONS[prompt][(offset + i) % 2] for i, prompt in enumerate(prompts)]


def force_cpu_fsdp():
    """Test harness: accelerate (1.15) enables FSDP only from a GPU-like distributed type, so under ``use_cpu`` an FSDP
    config silently runs as DDP (``MULTI_CPU``). PyTorch's FSDP2 itself shards over gloo on CPU; switching
    accelerate's state to FSDP when the launch asked for it makes the trainer wrap the model with FSDP2."""
    import accelerate.state
    from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin

    init = accelerate.state.AcceleratorState.__init__

    def init_with_fsdp(self, *args, **kwargs):
        init(self, *args, **kwargs)
        if self.distributed_type == DistributedType.MULTI_CPU and os.environ.get("ACCELERATE_USE_FSDP") == "true":
            self.distributed_type = DistributedType.FSDP
            self.fsdp_plugin = getattr(self, "fsdp_plugin", None) or FullyShardedDataParallelPlugin()
        if self.distributed_type == DistributedType.MULTI_CPU and os.environ.get("ACCELERATE_USE_DEEPSPEED") == "true":
            from accelerate.utils import DeepSpeedPlugin

            plugin = DeepSpeedPlugin()
            plugin.set_mixed_precision("no")
            plugin.select(_from_accelerator_state=True)
            self.distributed_type, self.deepspeed_plugins = DistributedType.DEEPSPEED, plugin

    accelerate.state.AcceleratorState.__init__ = init_with_fsdp


def reduce_over_gloo():
    """Test harness: DeepSpeed's CPU accelerator reduces through a shared-memory kernel that it compiles on first use,
    one to three minutes on 2 cores, and again in each environment (the build is keyed by where its sources live).
    Marking the kernel unavailable makes DeepSpeed reduce through ``torch.distributed`` over gloo, as DDP does."""
    import deepspeed.ops
    from deepspeed.accelerator import get_accelerator

    deepspeed.ops.__compatible_ops__[get_accelerator().create_op_builder("ShareMemCommBuilder").NAME] = False


def whole_parameters(model):
    """A context in which every parameter is whole: ZeRO-3 partitions them from construction on (gathered here, every
    rank calls; rank 0's changes are kept)."""
    from transformers.integrations import is_deepspeed_zero3_enabled

    if not is_deepspeed_zero3_enabled():
        return contextlib.nullcontext()
    import deepspeed

    return deepspeed.zero.GatheredParameters(list(model.parameters()), modifier_rank=0)


def record_trained_rows(trainer, tokenizer) -> list[dict]:
    """The rows of every training batch the trainer scores (prompt, completion, advantage, loss tokens), filled in as
    it trains: its ``_generate_and_score_completions`` is wrapped on the instance."""
    rows: list[dict] = []
    generate_and_score = trainer._generate_and_score_completions

    def record(inputs):
        output = generate_and_score(inputs)
        texts = tokenizer.batch_decode(output["completion_ids"], skip_special_tokens=True)
        prompts = tokenizer.batch_decode(output["prompt_ids"], skip_special_tokens=True)
        for prompt, text, advantage, tokens in zip(
            prompts, texts, output["advantages"].tolist(), output["completion_mask"].sum(1).tolist(), strict=True
        ):
            rows.append({"prompt": prompt, "completion": text, "advantage": advantage, "tokens": tokens})
        return output

    trainer._generate_and_score_completions = record
    return rows


def checksum(model):
    """Sum of every parameter, whole: FSDP2's DTensor shards and ZeRO-3's partitions are gathered (all ranks call)."""
    with whole_parameters(model):
        return sum(
            (p.full_tensor() if hasattr(p, "full_tensor") else p).double().sum().item() for p in model.parameters()
        )


def run_name(kind, scenario, trainer="ours"):
    """The name of a run, as the worker's command line and the results' directory give it."""
    return f"{kind}-{scenario}" + ("" if trainer == "ours" else f"-{trainer}")


def main(model_dir, out_root, *runs):
    """Every run of ``runs`` (``run_name``s) in turn, each writing ``out_root/run/rank{r}.json``; returns the
    accelerator (its state is the process's, shared by the runs)."""
    deepspeed_launch = os.environ.get("ACCELERATE_USE_DEEPSPEED") == "true"
    if deepspeed_launch:
        reduce_over_gloo()  # before accelerate's state starts DeepSpeed's communication
    if os.environ.get("ZEROSTD_TEST_CPU_FSDP") == "1" or deepspeed_launch:
        force_cpu_fsdp()
    return train_each(train_one, model_dir, out_root, runs)


def train_one(model_dir, out_dir, kind="grpo", scenario="masking", trainer="ours"):
    """One run: trains ``scenario`` with our ``kind`` trainer (``trainer="base"``: TRL's) and writes this rank's
    result to ``out_dir/rank{r}.json``."""
    trainer_cls, config_cls = (OUR_CLASSES if trainer == "ours" else BASE_CLASSES)[kind]
    setup = SCENARIOS[scenario]
    settings = dict(
        output_dir=out_dir, per_device_train_batch_size=GLOBAL_BATCH // int(os.environ.get("WORLD_SIZE", "1")),
        num_generations=4, max_completion_length=6, beta=0.1, learning_rate=1e-2, max_steps=1, logging_steps=1,
        save_strategy="no",
        report_to="none", use_cpu=True, bf16=False, seed=0,
    )  # fmt: skip
    tokenizer = build_tokenizer()
    settings = {**settings, **setup["config"]}
    if trainer != "ours":
        settings = {key: value for key, value in settings.items() if key not in ZERO_STD_FIELDS}
    dataset = Dataset.from_dict({"prompt": setup["prompts"]})
    trainer = trainer_cls(
        model=model_dir,
        reward_funcs=setup["reward"],
        args=config_cls(**settings),
        train_dataset=dataset.to_iterable_dataset() if setup.get("streaming") else dataset,
        processing_class=tokenizer,
    )
    stub_generation(trainer, completions_for)
    with torch.no_grad(), whole_parameters(trainer.model):  # policy != reference, so the KL gradient is non-zero
        move_policy_away(trainer.model)
    trained_rows = record_trained_rows(trainer, tokenizer)
    before = checksum(trainer.model)
    trainer.train()
    rank = distributed.get_rank() if distributed.is_initialized() else 0
    result = {
        "rank": rank,
        "world_size": trainer.accelerator.num_processes,
        "rows": trained_rows,
        "checksum_before": before,
        "checksum": checksum(trainer.model),
        "sharded": any(hasattr(p, "full_tensor") for p in trainer.model.parameters()),  # FSDP2's DTensor shards
        "distributed_type": str(trainer.accelerator.distributed_type),
    }
    skipper = trainer.zero_std.skipper if isinstance(trainer, ZeroStdAdapter) else None  # TRL's own: no skipper
    if skipper is not None:
        slots = list(range(len(skipper.rates.successes)))
        if skipper.hashed is not None:  # the slots in use, by the key that holds each
            slots = skipper.hashed.keys.nonzero().view(-1).tolist()
            result["skip_keys"] = skipper.hashed.keys[slots].tolist()
        rates = skipper.rates.state_dict()  # per slot, but group_counts: per group of slots
        result["skip_rates"] = {
            name: (value if name == "group_counts" else value[slots]).tolist() for name, value in rates.items()
        }
    if rank == 0:
        result["logs"] = [entry for entry in trainer.state.log_history if "zero_std/masked_group_frac" in entry]
    with open(f"{out_dir}/rank{rank}.json", "w") as f:
        json.dump(result, f)
    return trainer.accelerator


if __name__ == "__main__":
    torch.manual_seed(0)
    accelerator = main(*sys.argv[1:])
    if os.environ.get("ZEROSTD_WORKER_END_RUN", "1") == "1":  # "0": a user's script, ended by our exit handler
        end_run(accelerator)
