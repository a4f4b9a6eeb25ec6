"""The GPU check: the real model through vLLM (colocate and a real ``trl vllm-serve``) and HF generate under ZeRO-3
and FSDP2, with the invariants CI cannot see on CPU asserted. Run it by hand on a CUDA machine with vLLM:

    make gpu-check                                   # every case, the table in docs/results/gpu_check/gpu_check.md
    python scripts/studies/gpu_check.py --only colocate-masking server-dynamic --out /tmp/check.md

vLLM goes into the same environment (``.venv/bin/pip install vllm``, a version TRL 1.16 supports; it brings its CUDA
torch). The server case puts ``trl vllm-serve`` on a second GPU when there is one; on one GPU NCCL's weight sync
refuses two ranks on one device, and the case is reported as skipped when that is why it failed.

Each case is its own process (``accelerate launch --num_processes 1``, ``gpu_check_worker.py``): SmolLM2-135M-Instruct
(the GGUF file converted by ``scripts/demo/real_model.py``, saved in bf16, so vLLM runs in bf16; the policy trains in
fp32 under ``bf16=True``) trains a few steps of 4 prompts x 4 completions, 16 tokens. Half the prompts get a constant
reward (``level == "tied"``), so every batch has groups to mask. The invariants, checked here on what the worker
recorded:

- alignment: every row vLLM returns was generated from that row's own prompt (vLLM's ``prompt_ids``, which TRL
  discards, equal the token ids TRL sent, row by row);
- fresh weights: every generation round comes after a weight sync in the same optimizer step, with no sleep of the
  engine (sleep mode discards its weights) in between, and in colocate mode the engine's weights equal the policy's
  right after every sync; under sleep mode the table shows one sync per generation batch however many rounds;
- a micro-batch of masked rows alone (the tied prompts) gives exactly zero gradients, in bf16;
- the run trains every step, exits with code 0, and within ``EXIT_LIMIT_S`` of ``trainer.train()`` returning.

Without a CUDA GPU it says so and exits 0 (CI is unaffected); a case whose requirement is missing (vLLM, DeepSpeed)
is reported as skipped. Any failed invariant exits 1.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
WORKER = ROOT / "scripts" / "studies" / "gpu_check_worker.py"  # launched by path
ACCELERATE = ROOT / "scripts" / "accelerate"
DEFAULT_OUT = ROOT / "docs" / "results" / "gpu_check" / "gpu_check.md"
DEFAULT_WORK = ROOT / "outputs" / "gpu_check"
EXIT_LIMIT_S = 60.0
MAX_STEPS = 4
NO_GPU = "gpu-check: no CUDA GPU available, nothing to check (it needs a CUDA GPU, and vLLM for the vLLM cases)."
# One GPU for both: NCCL refuses two ranks of one weight-sync group on one device (TRL issues #3158, #3487).
DUPLICATE_GPU = "Duplicate GPU detected"


@dataclass(frozen=True)
class Case:
    """One process of the check: the trainer (``grpo``/``rloo``), how it generates (``colocate``, ``server``,
    ``hf``), its accelerate config, the config fields on top of the common ones, and whether the masked micro-batch
    gradient check runs (not with dynamic sampling or skipping, whose refill would draw more prompts)."""

    name: str
    what: str
    kind: str = "grpo"
    generation: str = "colocate"
    launch: str = "multi_gpu.yaml"
    config: dict = field(default_factory=dict)
    zero_grad: bool = False

    @property
    def needs(self) -> tuple[str, ...]:
        """Python packages the case needs beyond a CUDA GPU."""
        if self.generation == "hf":
            return ("deepspeed",) if "deepspeed" in self.launch else ()
        return ("vllm",)


DYNAMIC = {"dynamic_sampling": True}
CASES = (
    Case("colocate-masking", "vLLM colocate, masking", zero_grad=True),
    Case("colocate-dynamic", "vLLM colocate, dynamic sampling", config=DYNAMIC),
    Case(
        "colocate-skipping",
        "vLLM colocate, prompt skipping (level prior)",
        config={"skip_zero_std_prompts": True, "skip_prior_key": "level"},
    ),
    Case(
        "colocate-importance-sampling",
        "vLLM colocate, importance sampling (sequence_mask)",
        config={"vllm_importance_sampling_correction": True, "vllm_importance_sampling_mode": "sequence_mask"},
        zero_grad=True,
    ),
    Case("server-dynamic", "vLLM server, dynamic sampling", generation="server", config=DYNAMIC),
    Case(
        "colocate-sleep-dynamic",
        "vLLM colocate, sleep mode, dynamic sampling",
        config={"vllm_enable_sleep_mode": True, "dynamic_sampling": True},
    ),
    Case("rloo-colocate-masking", "RLOO, vLLM colocate, masking", kind="rloo", zero_grad=True),
    Case("hf-zero3", "HF generate, DeepSpeed ZeRO-3", generation="hf", launch="deepspeed_zero3.yaml", zero_grad=True),
    Case("hf-fsdp2", "HF generate, FSDP2", generation="hf", launch="fsdp2.yaml", zero_grad=True),
)
CASES_BY_NAME = {case.name: case for case in CASES}


@dataclass
class CaseResult:
    """A case's row of the table: ``status`` is ``"pass"``, ``"FAIL"`` or ``"skipped: <why>"``; ``cells`` the
    measured columns; ``failures`` the invariants that did not hold."""

    name: str
    what: str
    status: str
    cells: dict = field(default_factory=dict)
    failures: list = field(default_factory=list)


# ---- pure helpers (unit-tested on CPU) ----------------------------------------------------------------------------


def misaligned_rows(prompts: list, returned: list) -> list[int]:
    """Rows whose returned prompt ids are not the ids sent for that row; a row only one side has counts too."""
    rows = [i for i, (sent, back) in enumerate(zip(prompts, returned)) if list(sent) != list(back)]
    return rows + list(range(min(len(prompts), len(returned)), max(len(prompts), len(returned))))


def per_step_counts(events: list, kind: str) -> dict[int, int]:
    """How many events of ``kind`` (``"sync"``, ``"generate"``) each optimizer step had, by step."""
    counts: dict[int, int] = {}
    for event_kind, step in events:
        if event_kind == kind:
            counts[step] = counts.get(step, 0) + 1
    return counts


def stale_generations(events: list) -> list[int]:
    """Indices of the ``("generate", step)`` events that ran on weights older than the policy's: no sync in the same
    step before them, or a ``("sleep", step)`` of the engine (sleep mode, level 2: weights discarded) since the last
    sync. ``events`` are ``(kind, global_step)`` in the order they happened."""
    last_sync_step, discarded, stale = None, False, []
    for index, (kind, step) in enumerate(events):
        if kind == "sync":
            last_sync_step, discarded = step, False
        elif kind == "sleep":
            discarded = True
        elif kind == "generate" and (last_sync_step != step or discarded):
            stale.append(index)
    return stale


def spread(counts: dict[int, int]) -> str:
    """``"1"`` when every step has the same count, else ``"1-3 (mean 2.0)"``."""
    if not counts:
        return "0"
    values = list(counts.values())
    low, high = min(values), max(values)
    return str(low) if low == high else f"{low}-{high} (mean {sum(values) / len(values):.1f})"


def evaluate(case: Case, record: dict | None, returncode: int | None, exit_s: float | None) -> CaseResult:
    """The invariants, on what the worker recorded (``record``, None if it wrote none), its launcher's exit code, and
    the seconds from ``trainer.train()`` returning to the launcher's exit."""
    failures, cells = [], {}
    if returncode != 0:
        failures.append("timed out" if returncode is None else f"exit code {returncode}")
    if record is None:
        failures.append("the worker recorded nothing")
        return CaseResult(case.name, case.what, "FAIL", cells, failures)
    steps = record.get("global_step", 0)
    cells["steps"] = f"{steps}/{MAX_STEPS}"
    if steps < MAX_STEPS:
        failures.append(f"trained {steps} of {MAX_STEPS} steps")
    if case.generation != "hf":
        calls, events = record.get("calls", []), record.get("events", [])
        rows = sum(len(call["prompts"]) for call in calls)
        bad = [(i, row) for i, call in enumerate(calls) for row in misaligned_rows(call["prompts"], call["returned"])]
        cells["rows aligned"] = f"{rows - len(bad)}/{rows}"
        if not calls:
            failures.append("vLLM generated nothing")
        if bad:
            failures.append(f"{len(bad)} of {rows} rows generated for another prompt (first: round {bad[0][0]}, row "
                            f"{bad[0][1]})")  # fmt: skip
        syncs, rounds = per_step_counts(events, "sync"), per_step_counts(events, "generate")
        cells["syncs / rounds per step"] = f"{spread(syncs)} / {spread(rounds)}"
        stale = stale_generations(events)
        if stale:
            failures.append(f"{len(stale)} of {sum(rounds.values())} rounds generated without a sync before them")
        probes = record.get("probes", [])
        if case.generation == "colocate":
            matched = sum(probe is True for probe in probes)
            cells["engine = policy after sync"] = f"{matched}/{len(probes)}"
            if matched != len(probes) or not probes:
                errors = [probe for probe in probes if isinstance(probe, str)]
                failures.append(f"engine weights differ from the policy's after {len(probes) - matched} of "
                                f"{len(probes)} syncs{': ' + errors[0] if errors else ''}")  # fmt: skip
    if case.zero_grad:
        grads = record.get("zero_grad")
        if grads is None:
            failures.append("no masked micro-batch gradient recorded")
        else:
            cells["masked micro-batch grads"] = f"{grads['tensors'] - len(grads['nonzero'])}/{grads['tensors']} zero"
            if not grads["tensors"]:
                failures.append("the masked micro-batch's backward reached no parameter")
            if grads["nonzero"]:
                failures.append(
                    f"{len(grads['nonzero'])} gradients non-zero on masked rows, e.g. {grads['nonzero'][0]}"
                )
    if exit_s is not None:
        cells["exit after train (s)"] = f"{exit_s:.1f}"
        if exit_s > EXIT_LIMIT_S:
            failures.append(f"exited {exit_s:.0f} s after training (limit {EXIT_LIMIT_S:.0f} s)")
    return CaseResult(case.name, case.what, "FAIL" if failures else "pass", cells, failures)


COLUMNS = (
    "steps",
    "rows aligned",
    "syncs / rounds per step",
    "engine = policy after sync",
    "masked micro-batch grads",
    "exit after train (s)",
    "wall (s)",
)


def format_table(results: list[CaseResult], preamble: list[str] = ()) -> str:
    """The markdown report: ``preamble`` lines, then one row per case (``-`` where a column does not apply), then
    the failures in full."""
    header = ["case", "what", "result", *COLUMNS]
    lines = [*preamble, "" if preamble else None, "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines = [line for line in lines if line is not None]
    for result in results:
        cells = [result.name, result.what, result.status, *(result.cells.get(column, "-") for column in COLUMNS)]
        lines.append("| " + " | ".join(str(cell).replace("|", "\\|") for cell in cells) + " |")
    failed = [result for result in results if result.failures]
    if failed:
        lines += ["", "Failures:", ""]
        lines += [f"- {result.name}: {failure}" for result in failed for failure in result.failures]
    return "\n".join(lines) + "\n"


def exit_code(results: list[CaseResult]) -> int:
    """1 if any case failed; skipped cases do not count."""
    return int(any(result.status == "FAIL" for result in results))


# ---- the machine side ---------------------------------------------------------------------------------------------


@dataclass
class Environment:
    cuda: bool
    gpus: list[str]
    packages: set[str]


def probe_environment() -> Environment:
    """CUDA (through torch), the visible GPUs (for the server's placement) and the optional packages present."""
    import torch

    cuda = torch.cuda.is_available()
    count = torch.cuda.device_count() if cuda else 0
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    gpus = (
        [gpu.strip() for gpu in visible.split(",") if gpu.strip()][:count] if visible else list(map(str, range(count)))
    )
    packages = {name for name in ("vllm", "deepspeed") if importlib.util.find_spec(name) is not None}
    return Environment(cuda, gpus, packages)


def missing_requirement(case: Case, environment: Environment) -> str | None:
    """Why the case cannot run here, or None."""
    if not environment.cuda:
        return "no CUDA GPU"
    missing = [name for name in case.needs if name not in environment.packages]
    return f"{', '.join(missing)} not installed" if missing else None


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def bf16_model(work: Path) -> str:
    """The converted SmolLM2 folder saved again in bf16: vLLM takes its dtype from the folder's config."""
    target = work / "smollm2-135m-instruct-bf16"
    if (target / "config.json").is_file():
        return str(target)
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from demo.real_model import smollm2_folder

    source = smollm2_folder(str(ROOT / "outputs" / "smollm2-135m-instruct"))
    partial = target.with_name(target.name + ".partial")
    AutoModelForCausalLM.from_pretrained(source, dtype=torch.bfloat16).save_pretrained(partial)
    AutoTokenizer.from_pretrained(source).save_pretrained(partial)
    partial.rename(target)
    return str(target)


def stop_group(process: subprocess.Popen, grace_s: float = 30.0) -> None:
    """SIGTERM the process group started for ``process`` (its own session), SIGKILL it after ``grace_s``."""
    if process.poll() is not None:
        return
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(process.pid, sig)
            process.wait(timeout=wait)
            return
        except ProcessLookupError:
            return
        except subprocess.TimeoutExpired:
            continue


def start_server(model: str, gpu: str, log: Path, timeout_s: float) -> tuple[subprocess.Popen, str]:
    """A real ``trl vllm-serve`` on loopback, on ``gpu``, with a small share of its memory; returns it and its URL
    once ``/health`` answers. TRL's command adds ``--logprobs-mode processed_logprobs`` and the NCCL weight
    transfer."""
    port = free_port()
    command = [
        sys.executable, "-m", "trl.cli.main", "vllm-serve", "--model", model, "--host", "127.0.0.1",
        "--port", str(port), "--gpu_memory_utilization", "0.2", "--max_model_len", "512",
    ]  # fmt: skip
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": gpu}
    with open(log, "w") as out:
        server = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"trl vllm-serve exited with code {server.returncode} (log: {log})")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=5) as response:
                if response.status == 200:
                    return server, url
        except OSError:
            pass
        time.sleep(2)
    stop_group(server)
    raise RuntimeError(f"trl vllm-serve did not answer /health within {timeout_s:.0f} s (log: {log})")


def tail(path: Path, lines: int = 30) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.is_file() else ""


def run_case(case: Case, model: str, environment: Environment, work: Path, timeout_s: float) -> CaseResult:
    """Launch the case's worker (and its server), wait up to ``timeout_s``, evaluate what it recorded."""
    folder = work / case.name
    folder.mkdir(parents=True, exist_ok=True)
    record_path, log = folder / "record.json", folder / "log.txt"
    record_path.unlink(missing_ok=True)
    started, server, extra = time.monotonic(), None, []
    trainer_gpu = environment.gpus[0]
    try:
        if case.generation == "server":
            server_gpu = environment.gpus[1] if len(environment.gpus) > 1 else trainer_gpu
            try:
                server, url = start_server(model, server_gpu, folder / "server.log", timeout_s)
            except RuntimeError as error:
                print(tail(folder / "server.log"), file=sys.stderr)
                return CaseResult(case.name, case.what, "FAIL", {}, [str(error)])
            extra = ["--server-url", url]
        command = [
            sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(ACCELERATE / case.launch),
            "--num_processes", "1", "--mixed_precision", "bf16", "--main_process_port", str(free_port()),
            str(WORKER), "--case", case.name, "--model", model, "--record", str(record_path),
            "--output-dir", str(folder / "run"), *extra,
        ]  # fmt: skip
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": trainer_gpu, "PYTHONPATH": str(ROOT)}
        with open(log, "w") as out:
            process = subprocess.Popen(
                command, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True, cwd=ROOT
            )
        try:
            process.wait(timeout=max(timeout_s - (time.monotonic() - started), 1))
            returncode = process.returncode
        except subprocess.TimeoutExpired:
            stop_group(process, grace_s=5)
            returncode = None
        exited = time.time()
    finally:
        if server is not None:
            stop_group(server)
    record = json.loads(record_path.read_text()) if record_path.is_file() else None
    exit_s = exited - record["train_end"] if record and "train_end" in record else None
    result = evaluate(case, record, returncode, exit_s)
    result.cells["wall (s)"] = f"{time.monotonic() - started:.0f}"
    logs = tail(log, 400) + tail(folder / "server.log", 400)
    if case.generation == "server" and len(environment.gpus) == 1 and result.failures and DUPLICATE_GPU in logs:
        return CaseResult(case.name, case.what, "skipped: one GPU, and NCCL's weight sync needs the server on another")
    if result.failures:
        result.failures.append(f"log: {log}")
        print(tail(log), file=sys.stderr)
    return result


def versions(packages: set[str]) -> str:
    from importlib.metadata import version

    return ", ".join(f"{name} {version(name)}" for name in ("trl", *sorted(packages)))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Run the real model through vLLM (colocate, server) and HF generate under ZeRO-3 and FSDP2 on a "
        "CUDA GPU and assert the invariants CI cannot check (row alignment, fresh weights, zero gradients of masked "
        "rows in bf16, clean exit); writes a markdown table. Without a GPU it says so and exits 0.",
        epilog="cases: " + ", ".join(f"{case.name} ({case.what})" for case in CASES),
    )
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="markdown table to write (default: %(default)s)")
    parser.add_argument("--only", nargs="+", choices=list(CASES_BY_NAME), metavar="CASE", help="run these cases only")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per case, server start included")
    parser.add_argument("--work", type=Path, default=DEFAULT_WORK, help="logs, records, the bf16 model folder")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    environment = probe_environment()
    if not environment.cuda:
        print(NO_GPU)
        return 0
    if "vllm" not in environment.packages:
        print("gpu-check: vLLM is not installed: the vLLM cases are skipped.")
    cases = [CASES_BY_NAME[name] for name in args.only] if args.only else list(CASES)
    args.work.mkdir(parents=True, exist_ok=True)
    model = bf16_model(args.work)
    results, started = [], time.monotonic()
    for case in cases:
        reason = missing_requirement(case, environment)
        if reason:
            results.append(CaseResult(case.name, case.what, f"skipped: {reason}"))
        else:
            print(f"gpu-check: {case.name} ...", flush=True)
            results.append(run_case(case, model, environment, args.work, args.timeout))
        print(f"gpu-check: {case.name}: {results[-1].status}", flush=True)
    import torch

    preamble = [
        "# GPU check",
        "",
        f"`python scripts/studies/gpu_check.py`: {torch.cuda.get_device_name(0)}, torch {torch.__version__}, "
        f"{versions(environment.packages)}; SmolLM2-135M-Instruct (bf16 folder), "
        f"{MAX_STEPS} steps of 4 prompts x 4 completions, 16 tokens; {time.monotonic() - started:.0f} s in all.",
    ]
    table = format_table(results, preamble)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(table)
    print(table)
    print(f"gpu-check: table written to {args.out}")
    return exit_code(results)


if __name__ == "__main__":
    sys.exit(main())
