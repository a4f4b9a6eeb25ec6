"""Peak memory of HF ``generate`` calls: base TRL against this package, with and without dynamic sampling (CPU).

    python scripts/studies/generation_memory.py                      # 3 arms, 3 steps each: under 3 minutes on 2 cores
    python scripts/studies/generation_memory.py --steps 2 --out /tmp/genmem

A dynamic-sampling round can hold up to 2 generation batches of rows; the package decodes it in calls of at most
TRL's own generation batch (``per_device_train_batch_size * steps_per_generation`` rows), so that generate's peak
memory (KV cache) stays what the user tuned for under TRL. Each arm trains a tiny local Qwen2 with real generation in
its own process (peaks do not mix) and wraps ``trainer.model.generate`` to record, per call: its rows, its completion
tokens, and its peak RSS above the RSS at the call's start, both sampled every ~1 ms in a thread and read as the
kernel's high-water mark (VmHWM, reset through /proc/self/clear_refs). The child runs with a fixed glibc mmap
threshold so that freed tensors go back to the OS and RSS follows live memory. Writes ``table.md`` and ``runs.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shlex
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

ARMS = {  # name: (trainer, ZeroStd config options)
    "trl": ("GRPOTrainer", None),
    "zerostd": ("ZeroStdGRPOTrainer", {}),
    "dynamic": ("ZeroStdGRPOTrainer", {"dynamic_sampling": True}),
}
MODEL = {"hidden_size": 512, "num_layers": 4, "num_heads": 8}  # KV cache of a 32-row, 68-token fp32 call: 34 MB
MB = 2**20


def half_tied_reward(seed: int):
    """1.0 on prompts "a+b=" with a < 5 (their groups tie: no signal), a seeded random 0/1 elsewhere, so that about
    half the groups are zero-variance and dynamic sampling refills."""
    rng = random.Random(seed)

    def reward(completions, prompts, **kwargs):
        return [1.0 if int(prompt[0]) < 5 else float(rng.random() < 0.5) for prompt in prompts]

    return reward


def high_water_mark() -> int | None:
    """The kernel's peak RSS of this process since the last reset, in bytes (None where /proc cannot tell)."""
    try:
        return next(int(line.split()[1]) * 1024 for line in open("/proc/self/status") if line.startswith("VmHWM"))
    except (OSError, StopIteration):
        return None


def probe_generate(model, eos_id: int, calls: list[dict]) -> None:
    """Wrap ``model.generate`` on the instance: per call, rows, completion tokens (to the first EOS, as TRL counts),
    the KV cache its longest sequence holds (computed), and peak RSS above the call's start (sampled and VmHWM)."""
    generate, process = model.generate, psutil.Process()
    config = model.config

    def wrapped(*args, **kwargs):
        try:
            Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to the current RSS
        except OSError:
            pass
        start_rss, peak, stop = process.memory_info().rss, [0], threading.Event()

        def sample():
            while not stop.is_set():
                peak[0] = max(peak[0], process.memory_info().rss)
                time.sleep(0.001)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        try:
            output = generate(*args, **kwargs)
        finally:
            stop.set()
            sampler.join()
        hwm = high_water_mark()
        prompt_len = kwargs["input_ids"].shape[1]
        is_eos = output[:, prompt_len:] == eos_id
        lengths = is_eos.int().argmax(dim=1).add(1).where(is_eos.any(dim=1), is_eos.shape[1])
        kv_bytes = 2 * config.num_hidden_layers * output.shape[0] * output.shape[1] * config.hidden_size * 4
        calls.append({"rows": output.shape[0], "tokens": int(lengths.sum()), "kv_cache_mb": kv_bytes / MB,
                      "peak_sampled_mb": (max(peak[0], process.memory_info().rss) - start_rss) / MB,
                      "peak_hwm_mb": None if hwm is None else (hwm - start_rss) / MB})  # fmt: skip
        return output

    model.generate = wrapped


def run_arm(arm: str, args: argparse.Namespace) -> dict:
    """Train one arm in this process and return its generate calls and per-step rounds."""
    import torch
    from transformers.trainer_callback import PrinterCallback
    from trl import GRPOConfig, GRPOTrainer

    from demo.addition_task import addition_dataset
    from demo.tiny_model import build_model, build_tokenizer
    from trl_zerostd import ZeroStdGRPOConfig, ZeroStdGRPOTrainer

    torch.set_num_threads(1)  # steadier on a shared machine; memory does not depend on it
    trainer_name, options = ARMS[arm]
    common = dict(output_dir=tempfile.mkdtemp(prefix=f"genmem-{arm}-"), per_device_train_batch_size=args.rows,
                  num_generations=8, max_completion_length=args.max_completion_length, temperature=1.0, beta=0.0,
                  learning_rate=1e-5, max_steps=args.steps, logging_steps=1, save_strategy="no", report_to="none",
                  use_cpu=True, bf16=False, seed=0, disable_tqdm=True)  # fmt: skip
    config = GRPOConfig(**common) if options is None else ZeroStdGRPOConfig(**common, **options)
    tokenizer = build_tokenizer()
    trainer = (GRPOTrainer if trainer_name == "GRPOTrainer" else ZeroStdGRPOTrainer)(
        model=build_model(tokenizer, seed=0, **MODEL), reward_funcs=half_tied_reward(0), args=config,
        train_dataset=addition_dataset(512, seed=0), processing_class=tokenizer,
    )  # fmt: skip
    trainer.pop_callback(PrinterCallback)
    warm = tokenizer(["1+2="] * 2, return_tensors="pt")  # one-time costs (~9 MB) outside the measured calls
    trainer.model.generate(**warm, max_new_tokens=2, do_sample=True)
    calls: list[dict] = []
    probe_generate(trainer.model, tokenizer.eos_token_id, calls)
    passes, single_turn = [], trainer._generate_single_turn  # TRL's decode pass: one a round, whatever its calls

    def counted(prompt_ids, *rest, **kwargs):
        passes.append(len(prompt_ids))
        return single_turn(prompt_ids, *rest, **kwargs)

    trainer._generate_single_turn = counted
    start = time.perf_counter()
    trainer.train()
    rounds = [log.get("dynamic_sampling/rounds", 1) for log in trainer.state.log_history if "loss" in log]
    return {"arm": arm, "trainer": trainer_name, "options": options, "calls": calls, "rounds_per_step": rounds,
            "rows_per_pass": passes,
            "generation_batch_rows": args.rows * config.steps_per_generation,
            "train_s": time.perf_counter() - start}  # fmt: skip


def summarize(runs: list[dict]) -> list[dict]:
    base = next(run for run in runs if run["arm"] == "trl")
    base_sampled = max(call["peak_sampled_mb"] for call in base["calls"])
    base_hwm = max((call["peak_hwm_mb"] or 0.0) for call in base["calls"])
    rows = []
    for run in runs:
        calls = run["calls"]
        sampled, hwm = max(c["peak_sampled_mb"] for c in calls), max((c["peak_hwm_mb"] or 0.0) for c in calls)
        rows.append({"arm": run["arm"], "max_pass": max(run["rows_per_pass"]),
                     "calls": len(calls), "rows": sum(c["rows"] for c in calls),
                     "max_rows": max(c["rows"] for c in calls), "tokens": sum(c["tokens"] for c in calls),
                     "kv_mb": max(c["kv_cache_mb"] for c in calls), "sampled_mb": sampled,
                     "sampled_ratio": sampled / base_sampled, "hwm_mb": hwm,
                     "hwm_ratio": hwm / base_hwm if base_hwm else float("nan"),
                     "rounds": run["rounds_per_step"], "train_s": run["train_s"]})  # fmt: skip
    return rows


def format_table(rows: list[dict], command: str, batch_rows: int) -> str:
    head = ["arm", "max rows/round", "calls", "rows generated", "max rows/call", "tokens", "KV cache, max call (MB)",
            "peak sampled (MB)", "ratio", "peak VmHWM (MB)", "ratio", "rounds/step", "train (s)"]  # fmt: skip
    lines = [
        f"`{command}`",
        "",
        f"TRL's generation batch: {batch_rows} rows. Peaks: max over an arm's generate calls of peak RSS minus RSS at "
        "the call's start (sampled every ~1 ms; VmHWM: the kernel's high-water mark); MB = 2^20 bytes; ratios: to "
        "base TRL's. Max rows/round: the most rows one `_generate_single_turn` (a round) was given.",
        "",
        "| " + " | ".join(head) + " |",
        "|---|" + "---:|" * 10 + "---|---:|",
    ]
    for r in rows:
        cells = [r["arm"], r["max_pass"], r["calls"], r["rows"], r["max_rows"], r["tokens"], f"{r['kv_mb']:.1f}",
                 f"{r['sampled_mb']:.1f}", f"{r['sampled_ratio']:.2f}", f"{r['hwm_mb']:.1f}", f"{r['hwm_ratio']:.2f}",
                 ", ".join(str(round(x)) for x in r["rounds"]), f"{r['train_s']:.0f}"]  # fmt: skip
        lines.append("| " + " | ".join(map(str, cells)) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="docs/results/generation_memory", help="Folder for table.md and runs.json.")
    parser.add_argument("--steps", type=int, default=3, help="Optimizer steps per arm.")
    parser.add_argument("--rows", type=int, default=32, help="per_device_train_batch_size (groups of 8 rows).")
    parser.add_argument("--max_completion_length", type=int, default=64)
    parser.add_argument("--arm", choices=ARMS, help=argparse.SUPPRESS)  # internal: run one arm, print its JSON
    args = parser.parse_args()
    if args.arm:
        print("RESULT " + json.dumps(run_arm(args.arm, args)), flush=True)
        return
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "65536"}
    runs = []
    for arm in ARMS:
        argv = [sys.executable, __file__, "--arm", arm, "--steps", str(args.steps),
                "--rows", str(args.rows), "--max_completion_length", str(args.max_completion_length)]  # fmt: skip
        done = subprocess.run(argv, env=env, capture_output=True, text=True)
        if done.returncode:
            sys.exit(f"arm {arm} failed:\n{done.stderr[-4000:]}")
        runs.append(json.loads(done.stdout.rsplit("RESULT ", 1)[1]))
        print(f"{arm}: {len(runs[-1]['calls'])} generate calls in {runs[-1]['train_s']:.0f} s", flush=True)
    command = "python scripts/studies/generation_memory.py " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    table = format_table(summarize(runs), command, runs[0]["generation_batch_rows"])
    print(table)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "table.md").write_text(table)
    (out / "runs.json").write_text(json.dumps({"command": command, "model": MODEL, "runs": runs}, indent=2))


if __name__ == "__main__":
    main()
