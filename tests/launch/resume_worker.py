"""Worker of tests/launch/test_killed_and_resumed.py: 6 steps of real generation (the tiny model's own ``generate``)
with a checkpoint at step 3, in one of three modes, launched as a subprocess from the repository root (``python -m
tests.launch.resume_worker``; ``accelerate launch -m`` for 2 processes):

- ``full``: the uninterrupted run;
- ``kill``: the same run, killed with SIGKILL by every rank right after checkpoint-3 is written;
- ``resume``: a run in a new launch resumed from the killed run's checkpoint-3.

``ours`` trains ZeroStdGRPOTrainer with masking, dynamic sampling, prompt skipping and ``zero_std_kl="keep_failed"``;
``ours-streaming`` the same on the train set as a streaming ``IterableDataset`` (refills and skip decisions read
the stream, the history is keyed by hashed prompts); ``ours-prior`` the same as ``ours`` with the success rates'
prior by prompt text; ``ours-skipping`` prompt skipping (prior by prompt text) and ``keep_failed`` without dynamic
sampling; ``ours-entropy`` tied groups training on their entropy-shaped advantages; ``base`` TRL's GRPOTrainer (the
control). Rank 0 writes ``result.json``: a hash of every parameter's bytes and the logged metrics of each step
(timings dropped).

Usage: python -m tests.launch.resume_worker MODEL_DIR OUT_ROOT full|kill|resume KIND [KIND ...]
       (KIND: ours, ours-streaming, ours-prior, ours-skipping, ours-entropy, base)
Each KIND runs in turn in ``OUT_ROOT/MODE/KIND`` (a resume from ``OUT_ROOT/kill/KIND``'s checkpoint-3); ``kill`` takes
one KIND, since the kill ends the process.
"""

import hashlib
import json
import os
import signal
import sys

from transformers import TrainerCallback

from demo.addition_task import addition_dataset, correct_sum_reward
from demo.tiny_model import build_tokenizer
from demo.train_cli import end_run
from tests.support.trainers import BASE_CLASSES, OUR_CLASSES

CHECKPOINT_STEP, MAX_STEPS, GLOBAL_BATCH = 3, 6, 32
TIMING_KEYS = ("step_time",)
OURS = {"dynamic_sampling": True, "skip_zero_std_prompts": True, "zero_std_kl": "keep_failed"}
SETTINGS = {
    "ours": OURS,
    "ours-streaming": OURS,
    "ours-prior": {**OURS, "skip_prior_key": "prompt"},
    "ours-skipping": {"skip_zero_std_prompts": True, "skip_prior_key": "prompt", "zero_std_kl": "keep_failed"},
    "ours-entropy": {"tied_group_entropy_scale": 0.2},
    "base": {},
}


class KillAfterCheckpoint(TrainerCallback):
    """SIGKILL this process once checkpoint-3 is on disk on every rank (a hard crash: no cleanup runs)."""

    def __init__(self, accelerator):
        self.accelerator = accelerator

    def on_save(self, args, state, control, **kwargs):
        if state.global_step == CHECKPOINT_STEP:
            self.accelerator.wait_for_everyone()
            os.kill(os.getpid(), signal.SIGKILL)


def parameter_hash(model) -> str:
    digest = hashlib.sha256()
    for name, parameter in sorted(model.named_parameters()):
        digest.update(name.encode() + parameter.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


def main(model_dir, out_root, mode, *kinds):
    """Every kind of ``kinds`` in turn in ``mode``; returns the accelerator (the state the runs share)."""
    assert mode != "kill" or len(kinds) == 1, "a killed run ends its process: one kind per launch"
    for kind in kinds:
        run_dir = os.path.join(out_root, mode, kind)
        killed_run_dir = os.path.join(out_root, "kill", kind) if mode == "resume" else None
        accelerator = train_one(model_dir, run_dir, mode, kind, killed_run_dir)
    return accelerator


def train_one(model_dir, run_dir, mode, trainer_kind="ours", killed_run_dir=None):
    """One run of ``trainer_kind`` in ``mode``; rank 0 writes ``run_dir/result.json`` (a killed run never does)."""
    ours = trainer_kind.startswith("ours")
    trainer_cls, config_cls = (OUR_CLASSES if ours else BASE_CLASSES)["grpo"]
    settings = dict(
        output_dir=run_dir, per_device_train_batch_size=GLOBAL_BATCH // int(os.environ.get("WORLD_SIZE", "1")),
        num_generations=4, max_completion_length=4, learning_rate=1e-3, beta=0.04, max_steps=MAX_STEPS,
        save_strategy="steps", save_steps=CHECKPOINT_STEP, logging_steps=1, report_to="none", use_cpu=True,
        bf16=False, seed=0, disable_tqdm=True, **SETTINGS[trainer_kind],
    )  # fmt: skip
    dataset = addition_dataset(64, seed=0)
    trainer = trainer_cls(
        model=model_dir,
        reward_funcs=correct_sum_reward,
        args=config_cls(**settings),
        train_dataset=dataset.to_iterable_dataset() if trainer_kind == "ours-streaming" else dataset,
        processing_class=build_tokenizer(),
    )
    if mode == "kill":
        trainer.add_callback(KillAfterCheckpoint(trainer.accelerator))
    checkpoint = os.path.join(killed_run_dir, f"checkpoint-{CHECKPOINT_STEP}") if mode == "resume" else None
    trainer.train(resume_from_checkpoint=checkpoint)
    if trainer.accelerator.is_main_process:
        steps = [
            {key: value for key, value in entry.items() if key not in TIMING_KEYS}
            for entry in trainer.state.log_history
            if "reward" in entry
        ]
        result = {"parameters": parameter_hash(trainer.model), "steps": steps}
        with open(os.path.join(run_dir, "result.json"), "w") as f:
            json.dump(result, f)
    return trainer.accelerator


if __name__ == "__main__":
    end_run(main(*sys.argv[1:]))
