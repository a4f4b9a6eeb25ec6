"""What SmolLM2-135M-Instruct can do on each level of the chat arithmetic task before any training: the numbers the
task's levels were chosen by (``scripts/demo/chat_arith_task.py``).

    python scripts/studies/real_task_levels.py  # 16 held-out prompts a level x 8 samples, the config's
    python scripts/studies/real_task_levels.py --max_new_tokens 24    # sampling settings (temperature, 16 new tokens)

Per level: accuracy (the task's reward: the last integer of a completion that ended), pass@8 (a group of 8 with at
least one right answer: what RL can sharpen into accuracy), the shares of all-wrong and all-right groups of 8 (the
zero-variance groups), and the share of completions that ran out of tokens. The model's own ``generate``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch
import yaml

CONFIG = Path(__file__).resolve().parents[2] / "scripts/configs/smollm2_chat_arith.yaml"


@dataclass
class LevelArguments:
    prompts_per_level: int = field(default=16)
    samples: int = field(default=8, metadata={"help": "Completions per prompt (a group)."})
    max_new_tokens: int | None = field(default=None, metadata={"help": "Default: the task config's."})
    temperature: float | None = field(default=None, metadata={"help": "Default: the task config's."})
    seed: int = field(default=0)
    threads: int = field(default=2)


def main(args: LevelArguments) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from demo.chat_arith_task import LEVELS, FinalAnswerReward, chat_arith_splits, stop_token_ids
    from demo.held_out_eval import completion_ids
    from demo.real_model import smollm2_folder

    config = yaml.safe_load(CONFIG.read_text())
    max_new_tokens = args.max_new_tokens or config["max_completion_length"]
    temperature = args.temperature or config["temperature"]
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    path = smollm2_folder()
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    reward = FinalAnswerReward(stop_token_ids(tokenizer))
    stops = set(reward.stop_token_ids)
    _, held_out = chat_arith_splits(num_eval=len(LEVELS) * args.prompts_per_level, seed=args.seed)
    print(f"temperature {temperature}, {max_new_tokens} new tokens, {args.prompts_per_level} prompts x {args.samples}")
    print("| level | accuracy | pass@8 | all-wrong groups | all-right groups | ran out of tokens |")
    print("|---|---|---|---|---|---|")
    for level in LEVELS:
        rows = [row for row in held_out if row["level"] == level.name for _ in range(args.samples)]
        texts = [tokenizer.apply_chat_template(r["prompt"], tokenize=False, add_generation_prompt=True) for r in rows]
        encoded = tokenizer(texts, return_tensors="pt", padding=True, padding_side="left")
        with torch.no_grad():
            output = model.generate(**encoded, max_new_tokens=max_new_tokens, do_sample=True,
                                    temperature=temperature, top_k=0, top_p=1.0)  # fmt: skip
        ids = completion_ids(output[:, encoded["input_ids"].shape[1] :].tolist(), stops)
        completions = [[{"role": "assistant", "content": text}] for text in tokenizer.batch_decode(ids, True)]
        scores = reward(completions, ids, [r["answer"] for r in rows], [r["level"] for r in rows], texts)
        groups = [scores[i : i + args.samples] for i in range(0, len(scores), args.samples)]
        truncated = sum(len(row) == max_new_tokens and row[-1] not in stops for row in ids) / len(ids)
        print(
            f"| {level.name} ({level.op}, {level.left_digits}+{level.right_digits} digits) "
            f"| {sum(scores) / len(scores):.2f} | {sum(max(g) for g in groups) / len(groups):.2f} "
            f"| {sum(max(g) == 0 for g in groups) / len(groups):.2f} "
            f"| {sum(min(g) == 1 for g in groups) / len(groups):.2f} | {truncated:.2f} |"
        )


if __name__ == "__main__":
    from trl import TrlParser

    (parsed,) = TrlParser((LevelArguments,)).parse_args_and_config()
    main(parsed)
