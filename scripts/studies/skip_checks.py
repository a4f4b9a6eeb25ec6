"""Were the skips right? Prompt skipping's decisions in the prompts-come-back study (``revisited_prompts.py``) checked
against groups sampled and not trained on.

    python scripts/studies/skip_checks.py --runs_dir docs/results/revisited/runs --arms skip-rate-kf trl --seeds 2 3

A record of that study holds, per optimizer step, the prompts skipping passed over (``prompt_skips``) and the rewards
of every group it generated (``prompt_rewards``), and at each evaluation one group of every train prompt sampled from
the policy of that step (``train_groups``, ``--eval_train_groups``). A skip at step ``s`` (the policy after ``s - 1``
updates) is checked against the last evaluation after ``s - 1`` updates or fewer. It was **wrong** where that
prompt's group split there: it would have taught. One group of samples, up to 9 steps old, says so with noise; the
share of drawn groups that split is the base rate to read it against. A prompt that **comes back** ties at one
evaluation and splits at the next; the table says how many steps passed before it was drawn again. Records without
these fields (runs before them) are left out, named.
"""

from __future__ import annotations

import bisect
import math
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

if __package__ in (None, ""):  # run by path (python scripts/studies/<name>.py): scripts/ holds demo/ and studies/
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from demo.held_out_eval import splits
from studies.runs import cached_records

OUTCOMES = ("split", "all right", "all wrong")


def outcome(rewards: list[float]) -> str:
    """``"split"``, ``"all right"`` (every finite reward at the group's top, a positive one), or ``"all wrong"``."""
    if splits(rewards):
        return "split"
    finite = [value for value in rewards if math.isfinite(value)]
    return "all right" if finite and max(finite) > 0 else "all wrong"


@dataclass
class SkipChecks:
    """One run's checks: each skip probed (a probe at or before it): its prompt, its probe's outcome and whether a
    later probe of it splits; drawn groups by their own outcome; the train set's share that splits at each
    evaluation; each comeback's wait in steps (None: never drawn again in the run)."""

    skipped_prompts: list[tuple[str, str, bool]] = field(default_factory=list)  # text, probe outcome, splits later
    drawn: dict[str, int] = field(default_factory=lambda: dict.fromkeys(OUTCOMES, 0))
    train_split_frac: list[tuple[int, float]] = field(default_factory=list)
    comeback_waits: list[int | None] = field(default_factory=list)

    @property
    def skips(self) -> dict[str, int]:
        """The skips probed, by their probe's outcome."""
        counts = dict.fromkeys(OUTCOMES, 0)
        for _, seen, _ in self.skipped_prompts:
            counts[seen] += 1
        return counts


def group_size_of(record: dict) -> int:
    """A run's ``num_generations``: its probes' group of a prompt (two where one text is two train rows)."""
    return min(len(rewards) for _, groups in record["train_groups"] for rewards in groups.values())


def check_run(record: dict) -> SkipChecks:
    """The checks of one record that has ``train_groups``, ``prompt_skips`` and ``prompt_rewards``."""
    probes = sorted((step, groups) for step, groups in record["train_groups"])
    if not probes:
        raise ValueError(f"{record['arm']} seed {record['seed']}: train_groups holds no evaluation.")
    checks, group_size = SkipChecks(), group_size_of(record)
    probe_steps = [step for step, _ in probes]
    for step, groups in probes:
        first_groups = [rewards[:group_size] for rewards in groups.values()]  # a text's first train row
        checks.train_split_frac.append((step, sum(map(splits, first_groups)) / len(groups)))
    for index, skipped in enumerate(record["prompt_skips"]):  # index i: generated with the policy after i updates
        at = bisect.bisect_right(probe_steps, index) - 1
        if at < 0:
            continue
        for text in skipped:
            seen = outcome(probes[at][1][text][:group_size])
            later = any(splits(groups[text][:group_size]) for _, groups in probes[at + 1 :])
            checks.skipped_prompts.append((text, seen, later))
    drawn_at: dict[str, list[int]] = {}
    for index, by_prompt in enumerate(record["prompt_rewards"]):
        for text, rewards in by_prompt.items():
            drawn_at.setdefault(text, []).append(index)
            for start in range(0, len(rewards), group_size):
                checks.drawn[outcome(rewards[start : start + group_size])] += 1
    for (_, before), (step, after) in zip(probes, probes[1:]):
        for text, rewards in after.items():
            if splits(rewards[:group_size]) and not splits(before[text][:group_size]):
                later = [index for index in drawn_at.get(text, []) if index >= step]
                checks.comeback_waits.append(later[0] - step if later else None)
    return checks


def share(counts: dict[str, int], key: str) -> str:
    total = sum(counts.values())
    return f"{counts[key] / total:.2f}" if total else "-"


def table(checked: list[tuple[dict, SkipChecks]]) -> str:
    """One Markdown row per run: skips and drawn groups by outcome, the train set's split share (first, last
    evaluation) and the comebacks."""
    lines = [
        "| run | skips checked | of them split (wrong) / all right / all wrong | drawn groups | of them split | "
        "train prompts that split, first / last evaluation | comebacks: drawn again within 5 steps / later / never |",
        "|---|---|---|---|---|---|---|",
    ]
    for record, checks in checked:
        waits = checks.comeback_waits
        soon = sum(wait is not None and wait <= 5 for wait in waits)
        never = sum(wait is None for wait in waits)
        first, last = checks.train_split_frac[0][1], checks.train_split_frac[-1][1]
        skips = " / ".join(share(checks.skips, key) for key in OUTCOMES)
        lines.append(
            f"| {record['arm']} seed {record['seed']} | {sum(checks.skips.values())} | {skips} | "
            f"{sum(checks.drawn.values())} | {share(checks.drawn, 'split')} | {first:.2f} / {last:.2f} | "
            f"{soon} / {len(waits) - soon - never} / {never} |"
        )
    return "\n".join(lines)


def train_levels(seed: int) -> dict[str, str]:
    """Each train prompt's level in the study's split of ``seed`` (``revisited_prompts``), by its text."""
    from demo.chat_arith_task import chat_arith_splits
    from studies.revisited_prompts import NUM_PROMPTS
    from studies.runs import prompt_text
    from studies.time_to_accuracy_real import TASK

    train, _ = chat_arith_splits(NUM_PROMPTS, TASK["num_eval_prompts"], seed)
    return {prompt_text(prompt): level for prompt, level in zip(train["prompt"], train["level"], strict=True)}


def level_table(
    checked: list[tuple[dict, SkipChecks]], levels_of: Callable[[int], dict[str, str]] = train_levels
) -> str:
    """Per skipping run and level (``levels_of(seed)``: each prompt text's): skips by their probe's outcome, and the
    prompts skipped while all wrong, by whether a probe after such a skip splits."""
    lines = [
        "| run | level | skips: split / all right / all wrong | prompts skipped while all wrong: split later / not |",
        "|---|---|---|---|",
    ]
    for record, checks in checked:
        levels = levels_of(record["seed"])
        for level in sorted(set(levels.values())):
            skipped = [(text, seen, later) for text, seen, later in checks.skipped_prompts if levels[text] == level]
            if not skipped:
                continue
            counts = " / ".join(str(sum(seen == key for _, seen, _ in skipped)) for key in OUTCOMES)
            stuck: dict[str, bool] = {}
            for text, seen, later in skipped:
                if seen == "all wrong":
                    stuck[text] = stuck.get(text, False) or later
            split_later = sum(stuck.values())
            lines.append(f"| {record['arm']} seed {record['seed']} | {level} | {counts} | "
                         f"{split_later} / {len(stuck) - split_later} |")  # fmt: skip
    return "\n".join(lines)


@dataclass
class SkipChecksArguments:
    runs_dir: str = field(default="docs/results/revisited/runs")
    arms: list[str] = field(default_factory=lambda: ["skip-rate-kf", "trl"])
    seeds: list[int] = field(default_factory=lambda: list(range(10)))
    table: str | None = field(default=None, metadata={"help": "Also write the Markdown table here."})


def main(args: SkipChecksArguments, levels_of: Callable[[int], dict[str, str]] = train_levels) -> str:
    cached = cached_records(args.runs_dir, args.arms, args.seeds)
    records = [record for record in cached if "train_groups" in record]
    missing = [record for record in cached if "train_groups" not in record]
    if not records:
        raise SystemExit(f"No record in {args.runs_dir} of {args.arms} x seeds {args.seeds} has train_groups.")
    checked = [(record, check_run(record)) for record in records]
    out = table(checked)
    if missing:
        names = ", ".join(f"{record['arm']} seed {record['seed']}" for record in missing)
        out += f"\n\nLeft out (run before --eval_train_groups): {names}."
    skipping = [(record, checks) for record, checks in checked if checks.skipped_prompts]
    if skipping:
        out += "\n\nBy level (the study's split of each seed):\n\n" + level_table(skipping, levels_of)
    waits = [wait for _, checks in checked for wait in checks.comeback_waits if wait is not None]
    if waits:
        out += f"\n\nComebacks drawn again: median wait {statistics.median(waits)} steps."
    if args.table:
        Path(args.table).write_text(out + "\n")
    print(out)
    return out


if __name__ == "__main__":
    from transformers import HfArgumentParser

    (parsed,) = HfArgumentParser(SkipChecksArguments).parse_args_into_dataclasses()
    main(parsed)
