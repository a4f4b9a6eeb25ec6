"""Sections of ``time_to_accuracy.py``'s report that read arms against base TRL's runs, bounds and settings: the task
as TRL sees it, what a perfect predictor could save (assumed and measured), each arm against TRL given its run
setting, and the machine's speed per run; and the rows of interpolated ratios to TRL they share with the main table."""

from __future__ import annotations

import statistics

from studies.time_to_accuracy_arms import ARMS, groups_per_step
from studies.time_to_accuracy_metrics import (
    cost,
    crossing,
    first_reaching,
    median,
    ratios_to_trl,
    targets,
    trained_only,
)


def task_check(trl_runs: list[dict], hard: str) -> list[str]:
    """The task as base TRL sees it, per seed: held-out reward at the start, level ``hard``'s held-out accuracy at
    the first and last evaluation, the all-wrong / all-correct share of its groups in the second half, and whether its
    held-out reward still rises in the last third (the mean of the last two evaluations minus that of the two before
    the last third ends, e.g. steps 210 and 240 of 300)."""
    lines = [
        "The task under base TRL, per seed (rise in the last third: the mean of its last two evaluations minus the "
        "mean of the two before them):",
        "",
        f"| seed | held-out start | {hard}: first -> last | 2nd half all-wrong / all-correct "
        "| rise in the last third |",
        "|---|---|---|---|---|",
    ]
    for record in sorted(trl_runs, key=lambda r: r["seed"]):
        half, rewards = len(record["reward"]) // 2, [reward for _, reward in record["eval"]]
        rise = statistics.fmean(rewards[-2:]) - statistics.fmean(rewards[-4:-2])
        lines.append(
            f"| {record['seed']} | {rewards[0]:.3f} "
            f"| {record['eval_bands'][0][hard]:.2f} -> {record['eval_bands'][-1][hard]:.2f} "
            f"| {statistics.fmean(record['all_wrong_group_frac'][half:]):.2f} / "
            f"{statistics.fmean(record['all_right_group_frac'][half:]):.2f} | {rise:+.3f} |"
        )
    return lines


def foresight_bound(trl_runs: list[dict], target: dict[int, float], seeds: list[int]) -> list[str]:
    """Per seed, the share of TRL's groups that were zero-variance up to its target, and so the tokens to target, over
    TRL's, of a run that learns as TRL does from the same informative groups but never generates a zero-variance one
    (perfect foresight: 1 - that share). An arm below it learns more per informative group than TRL does."""
    by_seed = {r["seed"]: r for r in trl_runs}
    shares = {}
    for seed in seeds:
        record = by_seed.get(seed)
        if record and (point := first_reaching(record, target[seed])):
            shares[seed] = statistics.fmean(record["frac_reward_zero_std"][: point[0]])
    bound = [1 - share for share in shares.values()]
    return [
        "What skipping zero-variance groups could save with perfect foresight: per seed, the share of TRL's groups up "
        "to its target that were zero-variance, and 1 minus it, the tokens to target over TRL's of a run that learns "
        "as TRL from the same informative groups and generates no zero-variance one "
        f"(median {median(bound):.2f}):",
        "",
        "| | " + " | ".join(f"seed {seed}" for seed in shares) + " |",
        "|---" * (len(shares) + 1) + "|",
        "| TRL's zero-variance share | " + " | ".join(f"{share:.2f}" for share in shares.values()) + " |",
        "| perfect-foresight tokens, / TRL | " + " | ".join(f"{value:.2f}" for value in bound) + " |",
    ]


def ratio_header(label: str, baseline: str, seeds: list[int]) -> list[str]:
    """The header of a table of ``interpolated_row`` rows: ``label``, the two medians over ``baseline``, each seed."""
    return [
        f"| {label} | tokens / {baseline} (median) | wall / {baseline} (median) | "
        + " | ".join(f"seed {s}" for s in seeds) + " |",
        "|---" * (len(seeds) + 3) + "|",
    ]  # fmt: skip


def interpolated_row(
    label: str, runs: list[dict], base: dict, target: dict[int, float], seeds: list[int], per_seed: int = 0
) -> str:
    """A table row: the medians of the runs' tokens and wall time to target over TRL's (``base``: TRL's ``crossing``
    per seed, only its seeds counted), both interpolated, then the ratio of each of ``seeds`` (-: not reached): tokens
    (``per_seed=0``) or wall time (``1``)."""
    by_seed = {r["seed"]: ratios_to_trl(crossing(r, target[r["seed"]]), base[r["seed"]]) for r in runs
               if base.get(r["seed"])}  # fmt: skip
    medians = [cost(median([ratio[i] for ratio in by_seed.values()]), ".2f") for i in range(2)]
    cells = [cost(by_seed[s][per_seed], ".2f").replace("never", "-") if s in by_seed else "" for s in seeds]
    return f"| {label} | {medians[0]} | {medians[1]} | " + " | ".join(cells) + " |"


def perfect_predictor(per_arm: dict[str, list[dict]], target: dict[int, float], args) -> list[str]:
    """The perfect-foresight bound measured instead of assumed: a dynamic-sampling arm trains batches of informative
    groups only, which is the batch prompt skipping with a perfect predictor would generate; counting only the trained
    groups' tokens and generation time (``trained_only``) gives that predictor's cost to target over TRL's
    (interpolated crossings). It differs from ``foresight_bound`` where a batch of only informative groups teaches
    more, or less, per group than TRL's mixed batch."""
    arms = [arm for arm, runs in per_arm.items() if runs and runs[0]["generated_groups"][0] is not None]
    if not arms:
        return []
    base = {r["seed"]: crossing(r, target[r["seed"]]) for r in per_arm["trl"]}
    lines = [
        "",
        "A perfect predictor, measured: dynamic sampling trains only informative groups, as prompt skipping with a "
        "perfect predictor would; its cost to target counting only the groups that trained (tokens, and wall less "
        "the generation of the dropped groups), over TRL's, interpolated (-: not reached):",
        "",
        *ratio_header("arm", "TRL", args.seeds),
    ]
    for arm in arms:
        runs = [trained_only(r, groups_per_step(arm, args)) for r in per_arm[arm]]
        lines.append(interpolated_row(f"{arm} (trained groups only)", runs, base, target, args.seeds))
    return lines


def same_setting(per_arm: dict[str, list[dict]], args) -> list[str]:
    """Each arm against base TRL given the same run setting (its ``Arm.twin``), where that arm has runs: per seed the
    target is the start plus ``args.target_fraction`` of the twin's gain; tokens and wall time to it over the twin's,
    interpolated."""
    pairs = [(arm, twin) for arm in per_arm if per_arm.get(twin := ARMS[arm].twin)]
    if not pairs:
        return []
    lines = [
        "",
        f"Against TRL given the same run setting: per seed the target is the start plus {args.target_fraction} of "
        "that TRL run's gain; tokens and wall time to it over that run's, interpolated (-: not reached):",
        "",
        *ratio_header("arm / TRL in its setting", "it", args.seeds),
    ]
    for arm, twin in pairs:
        target = targets(per_arm[twin], args.target_fraction, baseline=twin)
        base = {r["seed"]: crossing(r, target[r["seed"]]) for r in per_arm[twin]}
        lines.append(interpolated_row(f"{arm} / {twin}", per_arm[arm], base, target, args.seeds))
    return lines


def wall_against_rerun(
    per_arm: dict[str, list[dict]], target: dict[int, float], rerun: str = "trl-rerun"
) -> list[str]:
    """Wall time to target over base TRL made again (``rerun``), on the seeds where it was made again and reaches the
    target. TRL's cached runs ran faster than the later arms, under conditions not recorded; its re-runs ran as the
    later arms did, two at a time on the machine's cores, and train step for step as the cached runs did (same
    rewards every step): their wall time differs, and their crossing in tokens only by their finer evaluation grid.
    The target stays TRL's."""
    runs = [r for r in per_arm.get(rerun) or [] if r["seed"] in target]
    base = {r["seed"]: point for r in runs if (point := crossing(r, target[r["seed"]]))}
    if not base:
        return []
    seeds = sorted(base)
    return [
        "",
        f"Wall time to target over base TRL made again (`{rerun}`: two runs at a time, as the arms after TRL's ran), "
        "on the seeds it was made again, interpolated (wall / TRL made again per seed; -: not reached; the tokens "
        "median is over these seeds too). The row `trl` is TRL's cached runs: an arm whose runs ran as those did (the "
        "speed gauge says which) reads low here by as much:",
        "",
        *ratio_header("arm", "TRL made again", seeds),
        *(interpolated_row(arm, arm_runs, base, target, seeds, per_seed=1) for arm, arm_runs in per_arm.items()
          if arm_runs and arm != rerun),
    ]  # fmt: skip


def speed_gauge(per_arm: dict[str, list[dict]]) -> list[str]:
    """Seconds to generate one full batch (the median over a run's generation rounds), per run of each arm that
    generates the study's batch every round (no dynamic sampling, not the peer's budgets, no batch or group size of
    its own): the same work in every run, so it shows how fast the machine, and what ran beside, let each run go."""
    rows = []
    for arm, runs in per_arm.items():
        budgeted = "--budget_grid" in ARMS[arm].flags  # the peer: rounds that vary a step
        resized = {"--per_device_train_batch_size", "--num_generations"} & set(ARMS[arm].flags)  # other work a round
        if not runs or budgeted or resized or runs[0]["generated_groups"][0] is not None:
            continue
        rounds = {r["seed"]: median([s for s in r["generation_s"] if s > 0]) for r in runs}
        rows.append(f"| {arm} | " + ", ".join(f"{s}: {t:.1f}" for s, t in sorted(rounds.items())) + " |")
    if not rows:
        return []
    header = ["", "Speed gauge: seconds to generate one batch, per seed (about the same work in every run: wall times "
              "of runs at different gauges do not compare):", ""]  # fmt: skip
    return [*header, "| arm | seed: s |", "|---|---|", *rows]
