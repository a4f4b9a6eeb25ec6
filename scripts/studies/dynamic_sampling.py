"""Dynamic sampling against masking only and base TRL, with real generation (the model's own ``generate`` on CPU).

    python scripts/studies/dynamic_sampling.py                       # f in {0, 0.25, 0.5, 0.75}, 3 arms, in one run
    python scripts/studies/dynamic_sampling.py --fractions 0.5 --steps 4 --repeats 1
    python scripts/studies/dynamic_sampling.py --model_name_or_path outputs/smollm2-135m-instruct \
        --fractions 0.5 --steps 3 --warmup 1 --repeats 1 --threads 2 \
        --json docs/results/dynamic_sampling/dynamic_sampling_smollm2.json \
        --plot docs/results/dynamic_sampling/dynamic_sampling_smollm2.png  # the real model

A reward ties a chosen share f of the prompts (always 1.0: zero-variance groups) and scores the others by the parity of
the first character of the completion (a random model's groups of 8 are then informative). Each arm trains ``steps``
steps after ``warmup`` untimed ones, ``repeats`` times in rotating order, from the same seed and weights. Per step it
records wall time, generation time (the model's ``generate``), completion tokens generated and informative groups
trained; the table gives their medians and, per informative group trained (totals over all timed steps), wall time
and tokens, also as ratios to base TRL.
Writes --json and --plot.
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from datasets import Dataset
from transformers import AutoTokenizer, TrainerCallback
from transformers.trainer_callback import PrinterCallback
from trl import GRPOConfig, GRPOTrainer, TrlParser

if __package__ in (None, ""):  # run by path (python scripts/studies/<name>.py): scripts/ holds demo/ and studies/
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from demo.tiny_model import build_tokenizer, save_tiny_model
from trl_zerostd import ZeroStdGRPOConfig, ZeroStdGRPOTrainer

ARMS = ("trl", "masking", "dynamic")


@dataclass
class DynamicBenchArguments:
    fractions: list[float] = field(default_factory=lambda: [0.0, 0.25, 0.5, 0.75])
    steps: int = field(default=6, metadata={"help": "Timed optimizer steps per arm and repeat."})
    warmup: int = field(default=2, metadata={"help": "Untimed steps first (dynamic sampling's rate history forms)."})
    repeats: int = field(default=3, metadata={"help": "Repeats per arm (medians over steps and repeats)."})
    threads: int = field(default=1, metadata={"help": "torch CPU threads (1: steadier timings on a shared machine)."})
    num_prompts: int = field(default=512)
    groups: int = field(default=8, metadata={"help": "Groups (prompts) per step."})
    num_generations: int = field(default=8)
    max_completion_length: int = field(default=32)
    hidden_size: int = field(default=256)
    num_layers: int = field(default=4)
    model_name_or_path: str | None = field(
        default=None,
        metadata={
            "help": "A saved model (and its tokenizer) instead of the tiny local one (hidden_size, num_layers)."
        },
    )
    seed: int = field(default=0)
    json: str = field(default="docs/results/dynamic_sampling/dynamic_sampling.json")
    from_json: bool = field(default=False, metadata={"help": "Only redraw the table and plot from --json."})
    plot: str | None = field(default="docs/results/dynamic_sampling/dynamic_sampling.png")


def tied_share_reward(fraction: float):
    """Prompts "q<i>:" with ``i`` below ``fraction`` of the range always get 1.0; the others get the parity of the
    completion's first character."""

    def reward(completions, prompts, num_prompts, **kwargs):
        out = []
        for prompt, completion in zip(prompts, completions, strict=True):
            tied = int(prompt[1:-1]) < fraction * num_prompts[0]
            out.append(1.0 if tied else float(bool(completion) and ord(completion[0]) % 2 == 1))
        return out

    reward.__name__ = "tied_share_reward"
    return reward


class StepTimer(TrainerCallback):
    """Wall time of each optimizer step; generation and scoring time and completion tokens come from
    ``timed_generation`` (scoring: the rest of ``_generate_and_score_completions``; update: the rest of the step)."""

    def __init__(self):
        self.steps, self.start = [], None
        self.generation_s = self.generated_tokens = self.prepare_s = 0.0

    def on_step_begin(self, args, state, control, **kwargs):
        self.start, self.generation_s, self.generated_tokens, self.prepare_s = time.perf_counter(), 0.0, 0, 0.0

    def on_step_end(self, args, state, control, **kwargs):
        self.steps.append(
            {"wall_s": time.perf_counter() - self.start, "generation_s": self.generation_s,
             "scoring_s": self.prepare_s - self.generation_s, "generated_tokens": self.generated_tokens}
        )  # fmt: skip


def timed_generation(trainer, timer: StepTimer) -> None:
    """Time the trainer's token generation (TRL's ``_generate_single_turn``, the model's ``generate``)."""
    generate = trainer._generate_single_turn

    def timed(*args, **kwargs):
        start = time.perf_counter()
        completion_ids, logprobs = generate(*args, **kwargs)
        timer.generation_s += time.perf_counter() - start
        timer.generated_tokens += sum(len(ids) for ids in completion_ids)
        return completion_ids, logprobs

    trainer._generate_single_turn = timed
    prepare = trainer._generate_and_score_completions

    def timed_prepare(*args, **kwargs):
        start = time.perf_counter()
        output = prepare(*args, **kwargs)
        timer.prepare_s += time.perf_counter() - start
        return output

    trainer._generate_and_score_completions = timed_prepare


def run_arm(arm: str, fraction: float, model_path: str, tokenizer, args: DynamicBenchArguments, output_dir: str):
    rows = args.groups * args.num_generations
    common = dict(
        output_dir=output_dir, per_device_train_batch_size=rows, num_generations=args.num_generations,
        max_completion_length=args.max_completion_length, temperature=1.0, beta=0.04, learning_rate=1e-5,
        max_steps=args.warmup + args.steps, logging_steps=1, save_strategy="no", report_to="none", use_cpu=True,
        bf16=False, seed=args.seed, disable_tqdm=True,
    )  # fmt: skip
    dataset = Dataset.from_dict(
        {"prompt": [f"q{i}:" for i in range(args.num_prompts)], "num_prompts": [args.num_prompts] * args.num_prompts}
    )
    if arm == "trl":
        trainer_cls, config = GRPOTrainer, GRPOConfig(**common)
    else:
        trainer_cls, config = ZeroStdGRPOTrainer, ZeroStdGRPOConfig(**common, dynamic_sampling=arm == "dynamic")
    torch.manual_seed(args.seed)
    trainer = trainer_cls(
        model=model_path,
        reward_funcs=tied_share_reward(fraction),
        args=config,
        train_dataset=dataset,
        processing_class=tokenizer,
    )
    trainer.pop_callback(PrinterCallback)  # (installed under disable_tqdm) would print every step's metrics
    timer = StepTimer()
    trainer.add_callback(timer)
    timed_generation(trainer, timer)
    trainer.train()
    logs = [entry for entry in trainer.state.log_history if "reward" in entry]
    steps = []
    for log, timing in list(zip(logs, timer.steps, strict=True))[args.warmup :]:
        masked = log["zero_std/masked_group_frac"] if arm != "trl" else log["frac_reward_zero_std"]
        steps.append({**timing, "informative_groups": round((1 - masked) * args.groups),
                      "rounds": log.get("dynamic_sampling/rounds", 1)})  # fmt: skip
    return steps


def run_benchmark(args: DynamicBenchArguments) -> list[dict]:
    torch.set_num_threads(args.threads)
    workdir = tempfile.mkdtemp(prefix="zerostd-dynamic-")
    if args.model_name_or_path is None:
        model_path = save_tiny_model(f"{workdir}/model", seed=args.seed, hidden_size=args.hidden_size,
                                     num_layers=args.num_layers)  # fmt: skip
        tokenizer = build_tokenizer()
    else:
        model_path, tokenizer = args.model_name_or_path, AutoTokenizer.from_pretrained(args.model_name_or_path)
    table = []
    for fraction in args.fractions:
        samples = {arm: [] for arm in ARMS}
        for repeat in range(args.repeats):
            for arm in ARMS[repeat % 3 :] + ARMS[: repeat % 3]:
                samples[arm] += run_arm(arm, fraction, model_path, tokenizer, args, f"{workdir}/{arm}")
                print(f"f={fraction} repeat {repeat} {arm}: done", flush=True)
        row = {"f": fraction, "groups_per_step": args.groups}
        for arm, steps in samples.items():
            for key in ("wall_s", "generation_s", "scoring_s", "generated_tokens", "informative_groups", "rounds"):
                row[f"{arm}_{key}"] = statistics.median(step[key] for step in steps)
            informative = sum(step["informative_groups"] for step in steps)  # per group: totals over the steps
            row[f"{arm}_wall_per_informative"] = sum(step["wall_s"] for step in steps) / informative
            row[f"{arm}_tokens_per_informative"] = sum(step["generated_tokens"] for step in steps) / informative
            row[f"{arm}_full_steps"] = sum(step["informative_groups"] == args.groups for step in steps)
            row[f"{arm}_steps"] = len(steps)
        for arm in ("masking", "dynamic"):
            row[f"{arm}_wall_per_informative_ratio"] = (
                row[f"{arm}_wall_per_informative"] / row["trl_wall_per_informative"]
            )
            row[f"{arm}_tokens_per_informative_ratio"] = (
                row[f"{arm}_tokens_per_informative"] / row["trl_tokens_per_informative"]
            )
        table.append(row)
    Path(args.json).write_text(json.dumps(table, indent=2))
    if args.plot:
        plot(table, args.plot)
    return table


def format_table(table: list[dict]) -> str:
    lines = [
        "| f | arm | step wall (s) | generation (s) | scoring (s) | tokens generated | informative groups / step "
        "(full steps) | wall per informative group, / TRL | tokens per informative group, / TRL |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in table:
        for arm in ARMS:

            def ratio(key, row=row, arm=arm):
                return "1" if arm == "trl" else f"{row[f'{arm}_{key}_ratio']:.3f}"

            scoring = row.get(f"{arm}_scoring_s")  # absent from runs made before it was timed
            lines.append(
                f"| {row['f']:.2f} | {arm} | {row[f'{arm}_wall_s']:.2f} | {row[f'{arm}_generation_s']:.2f} "
                f"| {'-' if scoring is None else f'{scoring:.2f}'} "
                f"| {row[f'{arm}_generated_tokens']:.0f} | {row[f'{arm}_informative_groups']:.0f} "
                f"({row[f'{arm}_full_steps']}/{row[f'{arm}_steps']}) | {row[f'{arm}_wall_per_informative']:.3f} s, "
                f"{ratio('wall_per_informative')} | {row[f'{arm}_tokens_per_informative']:.0f}, "
                f"{ratio('tokens_per_informative')} |"
            )
    return "\n".join(lines)


def plot(table: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fractions = [row["f"] for row in table]
    figure, axes = plt.subplots(1, 2, figsize=(11, 4))
    for arm, style in zip(ARMS, ("o-", "s--", "^-"), strict=True):
        axes[0].plot(fractions, [row[f"{arm}_wall_per_informative"] for row in table], style, label=arm)
        axes[1].plot(fractions, [row[f"{arm}_informative_groups"] for row in table], style, label=arm)
    axes[0].set_ylabel("wall time per informative group trained (s)")
    axes[1].set_ylabel(f"informative groups trained per step (of {table[0]['groups_per_step']})")
    for axis in axes:
        axis.set_xlabel("fraction f of prompts whose groups are zero-variance")
        axis.grid(alpha=0.3)
        axis.legend()
    figure.suptitle("Dynamic sampling vs masking only vs TRL GRPOTrainer (real generation on CPU, in one run)")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


if __name__ == "__main__":
    (bench_args,) = TrlParser((DynamicBenchArguments,)).parse_args_and_config()
    if bench_args.from_json:
        results = json.loads(Path(bench_args.json).read_text())
        plot(results, bench_args.plot)
    else:
        results = run_benchmark(bench_args)
    print(format_table(results))
