"""Stress the 2-process launches of the test suite: run ``tests/launch/dp_worker.py`` many times over DDP, FSDP2 and
ZeRO-3, both trainers, masking on/off, dynamic sampling and prompt skipping, and count the launches that did not exit
cleanly (non-zero exit code, or the C++ abort message ``terminate called`` anywhere in their output).

    python -m tests.tools.stress_launches --launches 50          # about 7 minutes on 2 CPU cores
    python -m tests.tools.stress_launches --launches 10 --kinds ddp-grpo-masking fsdp2-rloo
    python -m tests.tools.stress_launches --launches 20 --kinds torch-gloo-no-destroy torch-gloo-destroy
    python -m tests.tools.stress_launches --launches 52 --kinds user-ddp-grpo-skipping user-ddp-rloo-masking \
        user-fsdp2-grpo user-zero3-grpo    # scripts without end_run: the trainer's exit handler alone

The two ``torch-gloo-*`` kinds run no TRL and no code of this package: a gloo all-gather over 2 processes, then exit
with or without ``torch.distributed.destroy_process_group()``; they show where the abort comes from.

Not a test (the suite launches each kind a few times, several runs to a launch); the tool that issue 21's fix was
measured with. Run from the repository root; every launch runs its worker as a module from there
(``tests/support/launching.py``). Exits 1 if any launch failed, and prints the tail of each failed launch's output.
"""

from __future__ import annotations

import argparse
import itertools
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.support.launching import DP_WORKER, ROOT, free_port, scripts_on_path

SCRIPTS = ROOT / "scripts"
ABORT_MESSAGE = "terminate called"
DDP = ["--multi_gpu", "--num_machines", "1", "--dynamo_backend", "no"]
FSDP2 = ["--config_file", str(SCRIPTS / "accelerate" / "fsdp2.yaml")]
ZERO3 = ["--config_file", str(SCRIPTS / "accelerate" / "deepspeed_zero3.yaml")]
FSDP_ENV = {"ACCELERATE_USE_CPU": "true", "ZEROSTD_TEST_CPU_FSDP": "1"}
ZERO3_ENV = {"DS_ACCELERATOR": "cpu", "ACCELERATE_USE_CPU": "false"}
# name -> (launch flags, worker arguments after MODEL_DIR OUT_ROOT, extra environment); "example-*": a user's run
KINDS = {
    "example-train-grpo": (DDP, [], {}),
    "ddp-grpo-masking": (DDP, ["grpo-masking"], {}),
    "ddp-rloo-masking": (DDP, ["rloo-masking"], {}),
    "ddp-grpo-base-trl": (DDP, ["grpo-masking-base"], {}),
    "ddp-grpo-dynamic": (DDP, ["grpo-dynamic"], {}),
    "ddp-grpo-dynamic-cap": (DDP, ["grpo-dynamic_cap"], {}),
    "ddp-grpo-skipping": (DDP, ["grpo-skipping"], {}),
    "fsdp2-grpo": (FSDP2, ["grpo-masking"], FSDP_ENV),
    "fsdp2-rloo": (FSDP2, ["rloo-masking"], FSDP_ENV),
    "zero3-grpo": (ZERO3, ["grpo-masking"], ZERO3_ENV),
    "zero3-rloo": (ZERO3, ["rloo-masking"], ZERO3_ENV),
}
NO_END_RUN = {"ZEROSTD_WORKER_END_RUN": "0"}  # a user's script: no end_run, our trainer's exit handler alone
USER_KINDS = {
    "user-ddp-grpo-skipping": (DDP, ["grpo-skipping"], NO_END_RUN),
    "user-ddp-rloo-masking": (DDP, ["rloo-masking"], NO_END_RUN),
    "user-fsdp2-grpo": (FSDP2, ["grpo-masking"], {**FSDP_ENV, **NO_END_RUN}),
    "user-zero3-grpo": (ZERO3, ["grpo-masking"], {**ZERO3_ENV, **NO_END_RUN}),
    "user-ddp-base-trl": (DDP, ["grpo-masking-base"], NO_END_RUN),  # TRL's trainer: no handler (control)
}
TORCH_KINDS = {  # not in the default --kinds: plain torch, this module as the worker
    "torch-gloo-no-destroy": (DDP, ["--gloo-worker", "no-destroy"], {}),
    "torch-gloo-destroy": (DDP, ["--gloo-worker", "destroy"], {}),
}


def launch(kind: str, model_dir: str, out_dir: str, timeout_s: int) -> tuple[int, str, float]:
    """One 2-process launch of ``kind``: exit code, combined output, seconds."""
    if kind in TORCH_KINDS:
        flags, script_args, env = TORCH_KINDS[kind]
        script = ["-m", __spec__.name, *script_args]
    elif kind == "example-train-grpo":
        flags, _, env = KINDS[kind]
        script = ["scripts/train_grpo.py", "--output_dir", out_dir, "--max_steps", "2", "--plot", "false",
                  "--warm_start_steps", "0", "--num_prompts", "64", "--per_device_train_batch_size", "16"]  # fmt: skip
    else:
        flags, worker_args, env = {**KINDS, **USER_KINDS}[kind]
        script = ["-m", DP_WORKER, model_dir, out_dir, *worker_args]
    command = [
        sys.executable, "-m", "accelerate.commands.launch", *flags, "--num_processes", "2", "--mixed_precision", "no",
        "--main_process_port", free_port(), *script,
    ]  # fmt: skip
    start = time.perf_counter()
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=timeout_s, env=scripts_on_path({**os.environ, **env}),
            check=False, cwd=ROOT,
        )  # fmt: skip
        code, output = done.returncode, done.stdout + done.stderr
    except subprocess.TimeoutExpired as expired:
        code, output = -1, f"timed out after {timeout_s} s\n{expired.stderr or ''}"
    return code, output, time.perf_counter() - start


def gloo_worker(destroy: bool) -> None:
    """Plain torch under ``accelerate launch``: gloo, a few all-gathers, exit (destroying the group or not)."""
    import torch
    from torch import distributed

    distributed.init_process_group("gloo")
    for step in range(8):
        gathered = [torch.zeros(1024) for _ in range(distributed.get_world_size())]
        distributed.all_gather(gathered, torch.full((1024,), float(step)))
    if destroy:
        distributed.destroy_process_group()


def main() -> int:
    if sys.argv[1:2] == ["--gloo-worker"]:
        gloo_worker(destroy=sys.argv[2] == "destroy")
        return 0
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--launches", type=int, default=50, help="Launches in all, cycling over --kinds.")
    parser.add_argument("--kinds", nargs="+", default=list(KINDS), choices=[*KINDS, *USER_KINDS, *TORCH_KINDS])
    parser.add_argument("--timeout", type=int, default=300, help="Seconds before one launch counts as hung.")
    args = parser.parse_args()

    from demo.tiny_model import save_tiny_model

    failures, counts, start = [], dict.fromkeys(args.kinds, 0), time.perf_counter()
    with tempfile.TemporaryDirectory() as scratch:
        model_dir = save_tiny_model(f"{scratch}/model")
        for index, kind in zip(range(args.launches), itertools.cycle(args.kinds)):
            out_dir = Path(scratch) / f"launch{index}"
            out_dir.mkdir()
            code, output, seconds = launch(kind, model_dir, str(out_dir), args.timeout)
            aborted = ABORT_MESSAGE in output
            counts[kind] += 1
            status = "ok" if code == 0 and not aborted else f"FAILED (exit {code}{', abort' if aborted else ''})"
            print(f"[{index + 1}/{args.launches}] {kind}: {status} in {seconds:.1f} s", flush=True)
            if status != "ok":
                failures.append((index, kind, code, aborted, output[-3000:]))
    minutes = (time.perf_counter() - start) / 60
    for index, kind, code, aborted, tail in failures:
        print(f"\n--- launch {index + 1} ({kind}), exit {code}, abort message: {aborted} ---\n{tail}")
    aborts = sum(aborted for *_, aborted, _ in failures)
    print(
        f"\n{args.launches} launches in {minutes:.1f} min ({', '.join(f'{k} x{n}' for k, n in counts.items())}): "
        f"{len(failures)} failed, {aborts} with '{ABORT_MESSAGE}'."
    )
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
