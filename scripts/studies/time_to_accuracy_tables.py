"""The Markdown report of ``time_to_accuracy.py``'s study: ``summarise`` puts together its tables (costs to target,
interpolated ratios, per seed, per step, per band); ``time_to_accuracy_checks`` gives the sections that read base
TRL's runs against bounds and settings."""

from __future__ import annotations

import math
import statistics

from studies.time_to_accuracy_arms import groups_per_step
from studies.time_to_accuracy_checks import (
    foresight_bound,
    interpolated_row,
    perfect_predictor,
    ratio_header,
    same_setting,
    speed_gauge,
    task_check,
    wall_against_rerun,
)
from studies.time_to_accuracy_metrics import (
    cost,
    crossing,
    final_reward,
    generated_tokens,
    median,
    ratios_to_trl,
    reached,
    targets,
)


def summarise(records: list[dict], args) -> str:
    per_arm = {arm: [r for r in records if r["arm"] == arm] for arm in args.arms}
    target = targets(records, args.target_fraction)
    lines = [*cost_table(per_arm, target, args), *interpolated_table(per_arm, target, args.seeds)]
    lines += per_seed_table(per_arm, target, args.seeds)
    lines += per_step_table(per_arm, args)
    lines += ["", *task_check(per_arm["trl"], args.hard_level), ""]
    lines += foresight_bound(per_arm["trl"], target, args.seeds)
    lines += perfect_predictor(per_arm, target, args)
    lines += same_setting(per_arm, args)
    lines += wall_against_rerun(per_arm, target)
    lines += speed_gauge(per_arm)
    lines += band_table(per_arm, args.levels)
    return "\n".join(lines)


def cost_table(per_arm: dict[str, list[dict]], target: dict[int, float], args) -> list[str]:
    """The report's head: each seed's target, then per arm its gain, seeds reaching the target and costs to it."""
    base = {r["seed"]: reached(r, target[r["seed"]]) for r in per_arm["trl"]}
    lines = [
        f"Target per seed: the start plus {args.target_fraction} of base TRL's held-out gain on that seed "
        f"({', '.join(f'seed {s}: {t:.3f}' for s, t in sorted(target.items()))}). Costs to target: medians over the "
        "seeds, a seed that never reaches it counted as costing the most (never: half or more never do); ratios to "
        "TRL: per seed, then their median.",
        "",
        "| arm | held-out reward: start -> final (gain) | seeds reaching target | tokens to target (M), / TRL "
        "| wall to target (s), / TRL | of which generation (s) | whole run: tokens (M), wall (s), generation share "
        "| groups generated in the 2nd half: all-wrong / all-correct |",
        "|---|---|---|---|---|---|---|---|",
    ]
    return lines + [cost_row(arm, runs, target, base) for arm, runs in per_arm.items()]


def cost_row(arm: str, runs: list[dict], target: dict[int, float], base: dict) -> str:
    """The arm's row of ``cost_table`` (``base``: TRL's ``reached`` per seed)."""
    starts, finals = [r["eval"][0][1] for r in runs], [final_reward(r) for r in runs]
    gains = [final - start for start, final in zip(starts, finals)]
    hit = {r["seed"]: reached(r, target[r["seed"]]) for r in runs}
    hits = [point for point in hit.values() if point]
    costs = [point or (math.inf,) * 3 for point in hit.values()]  # a seed that never reaches it costs the most
    tokens, wall, generation = (median([point[i] for point in costs]) for i in range(3))
    ratios = [ratios_to_trl(hit[s], base[s]) for s in hit if base.get(s)]
    token_ratio, wall_ratio = (median([ratio[i] for ratio in ratios]) for i in range(2))
    half = len(runs[0]["reward"]) // 2
    wrong = statistics.fmean(statistics.fmean(r["all_wrong_group_frac"][half:]) for r in runs)
    right = statistics.fmean(statistics.fmean(r["all_right_group_frac"][half:]) for r in runs)
    run_tokens = statistics.fmean(generated_tokens(r)[-1] for r in runs)
    run_wall = statistics.fmean(sum(r["step_time"]) for r in runs)
    run_generation = statistics.fmean(sum(r["generation_s"]) / sum(r["step_time"]) for r in runs)
    return (
        f"| {arm} | {statistics.fmean(starts):.3f} -> {statistics.fmean(finals):.3f} "
        f"({statistics.fmean(gains):+.3f} ± {statistics.stdev(gains) if len(gains) > 1 else 0:.3f}) "
        f"| {len(hits)}/{len(runs)} "
        f"| {cost(tokens / 1e6, '.3f')}, {cost(token_ratio, '.2f')} "
        f"| {cost(wall, '.1f')}, {cost(wall_ratio, '.2f')} "
        f"| {cost(generation, '.1f')} "
        f"| {run_tokens / 1e6:.3f}, {run_wall:.0f}, {run_generation:.0%} | {wrong:.2f} / {right:.2f} |"
    )


def interpolated_table(per_arm: dict[str, list[dict]], target: dict[int, float], seeds: list[int]) -> list[str]:
    """``cost_table``'s ratios with each crossing interpolated, for TRL as for the arm."""
    base_crossing = {r["seed"]: crossing(r, target[r["seed"]]) for r in per_arm["trl"]}
    return [
        "",
        "The same ratios with each crossing interpolated between the two evaluations around it, for TRL as for the "
        "arm (tokens / TRL per seed; -: not reached):",
        "",
        *ratio_header("arm", "TRL", seeds),
        *(interpolated_row(arm, runs, base_crossing, target, seeds) for arm, runs in per_arm.items()),
    ]


def per_seed_table(per_arm: dict[str, list[dict]], target: dict[int, float], seeds: list[int]) -> list[str]:
    """Per arm and seed: tokens to target and held-out gain."""
    lines = ["", "Per seed, tokens (M) to target (-: not reached) and held-out gain (final - start):", ""]
    lines += ["| arm | " + " | ".join(f"seed {seed}" for seed in seeds) + " |", "|---" * (len(seeds) + 1) + "|"]
    for arm, runs in per_arm.items():
        by_seed = {r["seed"]: r for r in runs}
        cells = []
        for seed in seeds:
            record = by_seed.get(seed)
            if record is None:  # the arm was not run on this seed
                cells.append("")
                continue
            point = reached(record, target[seed]) if seed in target else None
            gain = final_reward(record) - record["eval"][0][1]
            cells.append(f"{point[0] / 1e6:.3f}, {gain:+.3f}" if point else f"-, {gain:+.3f}")
        lines.append(f"| {arm} | " + " | ".join(cells) + " |")
    return lines


def per_step_table(per_arm: dict[str, list[dict]], args) -> list[str]:
    """Per arm: groups trained and informative a step, tokens a step, held-out gain and gain per generated token."""
    lines = [
        "",
        "Learning against the informative groups a step trains (mean over seeds; informative: the groups trained less "
        "TRL's frac_reward_zero_std of the batch):",
        "",
        "| arm | groups trained a step | informative groups a step | generated tokens a step | held-out gain | gain "
        "per M generated tokens |",
        "|---|---|---|---|---|---|",
    ]
    for arm, runs in per_arm.items():
        groups = groups_per_step(arm, args)
        informative = statistics.fmean(groups * (1 - statistics.fmean(r["frac_reward_zero_std"])) for r in runs)
        tokens = statistics.fmean(generated_tokens(r)[-1] / len(generated_tokens(r)) for r in runs)
        gain = statistics.fmean(final_reward(r) - r["eval"][0][1] for r in runs)
        lines.append(
            f"| {arm} | {groups} | {informative:.1f} | {tokens:.0f} | {gain:+.3f} | "
            f"{gain / statistics.fmean(r['num_tokens'][-1] for r in runs) * 1e6:.3f} |"
        )
    return lines


def band_table(per_arm: dict[str, list[dict]], levels: list[str]) -> list[str]:
    """Per arm and difficulty level: held-out accuracy at the first and last evaluation."""
    lines = ["", "Held-out accuracy per band at the first and last evaluation (mean over seeds):", ""]
    lines += ["| arm | " + " | ".join(levels) + " |", "|---" * (len(levels) + 1) + "|"]
    for arm, runs in per_arm.items():
        cells = [
            f"{statistics.fmean(r['eval_bands'][0][band] for r in runs):.2f} -> "
            f"{statistics.fmean(r['eval_bands'][-1][band] for r in runs):.2f}"
            for band in levels
        ]
        lines.append(f"| {arm} | " + " | ".join(cells) + " |")
    return lines
