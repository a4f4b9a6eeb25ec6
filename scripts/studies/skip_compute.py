"""Masked rows cost no compute: base ``GRPOTrainer`` against ``ZeroStdGRPOTrainer`` on identical stubbed batches, in
one run, at several fractions f of zero-variance groups.

    python scripts/studies/skip_compute.py --json docs/results/skip_compute/bench.json \
        --plot docs/results/skip_compute/bench.png
    python scripts/studies/skip_compute.py --fractions 0 0.5 --repeats 3               # quicker
    python scripts/studies/skip_compute.py --model_name_or_path Qwen/Qwen2.5-0.5B  # a real model (hub or local path)

Per f and repeat both trainers score the same batch (generation is stubbed, so scoring is the rewards and the
reference forward) and take one policy update (loss forward + backward). Reported per f, as medians over repeats:
time ratios ours/base, the exact rows forwarded while scoring (reference and policy models), the exact rows and
tokens forwarded in the loss step, and the peak-memory ratio of the update (CUDA: peak allocated bytes; CPU: bytes
of activations saved for backward, an exact proxy).
"""

from __future__ import annotations

import json
import random
import statistics
import string
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import torch
from datasets import Dataset
from tqdm.auto import tqdm
from trl import GRPOConfig, GRPOTrainer, TrlParser

if __package__ in (None, ""):  # run by path (python scripts/studies/<name>.py): scripts/ holds demo/ and studies/
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from demo.tiny_model import build_tokenizer, save_tiny_model
from trl_zerostd import ZeroStdGRPOConfig, ZeroStdGRPOTrainer


@dataclass
class BenchArguments:
    fractions: list[float] = field(
        default_factory=lambda: [0.0, 0.25, 0.5, 0.75], metadata={"help": "Fractions f of zero-variance groups."}
    )
    repeats: int = field(default=7, metadata={"help": "Timed repeats per f (medians are reported)."})
    warmup: int = field(default=2, metadata={"help": "Untimed repeats per f before the timed ones."})
    num_groups: int = field(default=8, metadata={"help": "Groups (prompts) per batch."})
    num_generations: int = field(default=8, metadata={"help": "Completions per prompt."})
    completion_length: int = field(default=48, metadata={"help": "Tokens per completion (all equal, EOS last)."})
    model_name_or_path: str | None = field(
        default=None, metadata={"help": "A local or hub causal LM. Default: the tiny local model, sized below."}
    )
    hidden_size: int = field(default=256, metadata={"help": "Hidden size of the default local model."})
    num_layers: int = field(default=4, metadata={"help": "Layers of the default local model."})
    loss_type: str = field(default="dapo", metadata={"help": "TRL loss_type for both trainers."})
    zero_std_normalization: str = field(default="keep", metadata={"help": "Our normalisation mode."})
    beta: float = field(default=0.04, metadata={"help": "KL coefficient (0 skips the reference forward)."})
    json: str = field(default="bench.json", metadata={"help": "Where to write the table (a list of objects)."})
    plot: str | None = field(default="bench.png", metadata={"help": "Where to write the PNG plot; empty for none."})
    seed: int = field(default=0, metadata={"help": "Seed of the model and the completions."})


def zero_variance_batch(fraction: float, num_groups: int, num_generations: int, length: int, seed: int):
    """Rows and completions of one batch in which ``round(fraction * num_groups)`` groups are zero-variance.

    A completion is rewarded when it starts with ``y``; tied groups get only ``n...`` completions, the others half
    and half. Returns ``(rows, completions)``, one entry per row.
    """
    rng = random.Random(seed)
    tied = round(fraction * num_groups)
    rows, completions = [], []
    for group in range(num_groups):
        for index in range(num_generations):
            first = "n" if group < tied or index % 2 else "y"
            rest = "".join(rng.choice(string.ascii_lowercase) for _ in range(length - 2))
            rows.append({"prompt": f"q{group:03d}:"})
            completions.append(first + rest)
    return rows, completions


def starts_with_y(completions, **kwargs):
    return [float(c.startswith("y")) for c in completions]


class ForwardCounter:
    """Counts rows and non-pad tokens the given models (the policy; None is skipped) forward while ``counting``."""

    def __init__(self, *models):
        self.rows = self.tokens = 0
        self.counting = False
        for model in models:
            if model is not None:
                model.register_forward_pre_hook(self._count, with_kwargs=True)

    def _count(self, module, args, kwargs):
        if self.counting:
            self.rows += kwargs["input_ids"].shape[0]
            self.tokens += int(kwargs["attention_mask"].sum())


@contextmanager
def peak_memory(device: torch.device):
    """Yields a dict whose ``bytes`` is filled with the block's peak memory (see the module docstring)."""
    result = {"bytes": 0}
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        start = torch.cuda.memory_allocated()
        yield result
        torch.cuda.synchronize()
        result["bytes"] = torch.cuda.max_memory_allocated() - start
        return

    def pack(tensor):
        result["bytes"] += tensor.numel() * tensor.element_size()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        yield result


def make_trainers(args: BenchArguments, model_path: str, tokenizer, output_dir: str):
    common = dict(
        output_dir=output_dir,
        per_device_train_batch_size=args.num_groups * args.num_generations,
        num_generations=args.num_generations,
        max_completion_length=args.completion_length,
        beta=args.beta,
        loss_type=args.loss_type,
        report_to="none",
        use_cpu=not torch.cuda.is_available(),
        bf16=torch.cuda.is_available(),
        seed=args.seed,
    )
    dataset = Dataset.from_dict({"prompt": ["q000:"]})
    base = GRPOTrainer(
        model=model_path,
        reward_funcs=starts_with_y,
        args=GRPOConfig(**common),
        train_dataset=dataset,
        processing_class=tokenizer,
    )
    ours = ZeroStdGRPOTrainer(
        model=model_path,
        reward_funcs=starts_with_y,
        args=ZeroStdGRPOConfig(**common, zero_std_normalization=args.zero_std_normalization),
        train_dataset=dataset,
        processing_class=tokenizer,
    )
    return base, ours


def stub_generate(trainer, completions: list[str]):
    """Make the trainer's token generation (TRL's ``_generate_single_turn``) return exactly ``completions`` (each
    ends with EOS); TRL's own ``_generate`` still decodes and logs them."""
    tokenizer = trainer.processing_class
    completion_ids = [tokenizer(c, add_special_tokens=False).input_ids + [tokenizer.eos_token_id] for c in completions]
    trainer._generate_single_turn = lambda prompt_ids, *args, **kwargs: (completion_ids, None)


def timed_step(trainer, rows, counter: ForwardCounter) -> dict:
    """Score one batch and take one policy update; times in seconds. ``counter`` counts policy and reference."""
    model = trainer.model
    model.train()
    trainer.current_gradient_accumulation_steps = 1
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    counter.rows = counter.tokens = 0
    counter.counting = True
    sync()
    start = time.perf_counter()
    batch = trainer._generate_and_score_completions(rows)
    sync()
    scored = time.perf_counter()
    scoring_rows = counter.rows
    model.zero_grad(set_to_none=True)
    counter.rows = counter.tokens = 0
    with peak_memory(next(model.parameters()).device) as memory:
        trainer.compute_loss(model, batch).backward()
    sync()
    counter.counting = False
    end = time.perf_counter()
    return {
        "update_s": end - scored,
        "step_s": end - start,
        "scoring_rows": scoring_rows,
        "rows": counter.rows,
        "tokens": counter.tokens,
        "peak_bytes": memory["bytes"],
    }


def run_benchmark(args: BenchArguments) -> list[dict]:
    torch.manual_seed(args.seed)
    workdir = tempfile.mkdtemp(prefix="zerostd-bench-")
    model_path = args.model_name_or_path or save_tiny_model(
        f"{workdir}/model", seed=args.seed, hidden_size=args.hidden_size, num_layers=args.num_layers
    )
    tokenizer = build_tokenizer() if args.model_name_or_path is None else None  # else TRL loads the model's own
    base, ours = make_trainers(args, model_path, tokenizer, workdir)
    counters = {"base": ForwardCounter(base.model, base.ref_model), "ours": ForwardCounter(ours.model, ours.ref_model)}
    parameters = sum(p.numel() for p in ours.model.parameters())
    table = []
    for fraction in tqdm(args.fractions, desc="fractions"):
        rows, completions = zero_variance_batch(
            fraction, args.num_groups, args.num_generations, args.completion_length, args.seed
        )
        for trainer in (base, ours):
            stub_generate(trainer, completions)
        samples = {"base": [], "ours": []}
        for repeat in range(args.warmup + args.repeats):
            order = [("base", base), ("ours", ours)] if repeat % 2 == 0 else [("ours", ours), ("base", base)]
            for name, trainer in order:
                result = timed_step(trainer, rows, counters[name])
                if repeat >= args.warmup:
                    samples[name].append(result)
        med = {name: {k: statistics.median(s[k] for s in runs) for k in runs[0]} for name, runs in samples.items()}
        table.append(
            {
                "f": fraction,
                "update_time_ratio": med["ours"]["update_s"] / med["base"]["update_s"],
                "step_time_ratio": med["ours"]["step_s"] / med["base"]["step_s"],
                "scoring_rows_forwarded_ours": int(med["ours"]["scoring_rows"]),
                "scoring_rows_forwarded_base": int(med["base"]["scoring_rows"]),
                "rows_forwarded_ours": int(med["ours"]["rows"]),
                "rows_forwarded_base": int(med["base"]["rows"]),
                "tokens_forwarded_ours": int(med["ours"]["tokens"]),
                "tokens_forwarded_base": int(med["base"]["tokens"]),
                "peak_mem_ratio": med["ours"]["peak_bytes"] / med["base"]["peak_bytes"],
                "update_s_base": med["base"]["update_s"],
                "update_s_ours": med["ours"]["update_s"],
                "parameters": parameters,
                "device": str(next(ours.model.parameters()).device),
            }
        )
    with open(args.json, "w") as f:
        json.dump(table, f, indent=2)
    if args.plot:
        plot_benchmark(table, args.plot)
    return table


def plot_benchmark(table: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fractions = [row["f"] for row in table]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(fractions, [1 - f for f in fractions], "k--", label="ideal: 1 - f")
    ax.plot(fractions, [row["update_time_ratio"] for row in table], "o-", label="policy update time")
    ax.plot(fractions, [row["step_time_ratio"] for row in table], "s-", label="whole step time")
    ax.plot(fractions, [row["peak_mem_ratio"] for row in table], "^-", label="peak memory (update)")
    ax.set_xlabel("fraction f of zero-variance groups")
    ax.set_ylabel("ours / base TRL")
    ax.set_ylim(0, 1.2)
    ax.set_title(f"ZeroStdGRPOTrainer vs GRPOTrainer ({table[0]['parameters'] / 1e6:.1f}M params)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def format_table(table: list[dict]) -> str:
    """The table as Markdown, as the README shows it."""
    lines = [
        "| f | update time ratio | step time ratio | scoring rows forwarded (ours / base) "
        + "| update rows forwarded (ours / base) | update tokens forwarded (ours / base) | peak memory ratio |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in table:
        lines.append(
            f"| {row['f']:.2f} | {row['update_time_ratio']:.3f} | {row['step_time_ratio']:.3f} "
            f"| {row['scoring_rows_forwarded_ours']} / {row['scoring_rows_forwarded_base']} "
            f"| {row['rows_forwarded_ours']} / {row['rows_forwarded_base']} "
            f"| {row['tokens_forwarded_ours']} / {row['tokens_forwarded_base']} | {row['peak_mem_ratio']:.3f} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    (bench_args,) = TrlParser((BenchArguments,)).parse_args_and_config()
    print(format_table(run_benchmark(bench_args)))
