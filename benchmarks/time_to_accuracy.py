"""Held-out accuracy reached per generated token and per second: base TRL against this package's arms, on the
difficulty-spread task (examples/spread_task.py), over several seeds.

    python -m benchmarks.time_to_accuracy                # 39 arms x 10 seeds, 300 steps (-x2 600, -half 150)
    python -m benchmarks.time_to_accuracy --arms trl skip --seeds 0 1 --max_steps 100

Every run is ``examples/train_grpo.py --task spread`` (tiny local model warm started on the train split, 2,000 train
prompts in three difficulty bands, real generation with the model's own ``generate``) with the arm's flags; the same
seeds, model, data and settings for every arm. At the start and every ``--eval_steps`` steps TRL's own evaluation
samples ``--eval_samples`` completions for each of the 200 held-out prompts (never trained on), apart from training,
where no arm chooses its prompts. Generated tokens are TRL's ``num_tokens`` (prompt and completion tokens of every row
generated, refills included); wall time is the sum of TRL's ``step_time`` (evaluation excluded), split into
generation (the model's ``generate``, timed) and the rest (scoring and update).

The warm start depends on the seed (the held-out reward at the start ranges over 0.16-0.55 for seeds 0-9, as the
medium band is learned or not) and on the machine (its floating-point kernels: another CPU gives other warm starts
for the same seeds; on one machine a run repeats, which benchmarks/skip_precision.py checks), so the target is per
seed, by a rule fixed before the runs: the start plus ``--target_fraction`` of the gain that base TRL makes on that
seed (its final held-out reward: the mean of its last two evaluations). An arm's cost to reach it is read at its
first evaluation at or above it; ratios to TRL are taken per seed, then their median over seeds, a seed where the
arm never reaches it counting as its costliest.
Runs are cached as JSON in --runs_dir. Writes --table (Markdown) and --plot.
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.learning_curves import cumulative
from benchmarks.runs import report, run_all

DIFFICULTY = "<difficulty column>"
SKIP = ["--skip_zero_std_prompts", "true", "--skip_predictor", "streak"]  # GRESO's streak, the "-rate" arms' baseline
ARMS = {
    "trl": [],
    "masking": [],
    "keep_failed": ["--zero_std_kl", "keep_failed"],
    "dynamic": ["--dynamic_sampling", "true"],
    "skip": SKIP,
    "dynamic+skip": ["--dynamic_sampling", "true", *SKIP],
    # prompt skipping with one history per difficulty band (the task's difficulty column, as DeepMath's "difficulty";
    # DIFFICULTY stands for it, and is replaced by the study's --difficulty_column)
    "skip-band": [*SKIP, "--skip_history_key", DIFFICULTY],
    "dynamic+skip-band": ["--dynamic_sampling", "true", *SKIP, "--skip_history_key", DIFFICULTY],
}
# prompt skipping with a prior by difficulty band for prompts never drawn (skip_prior_key)
PRIOR = ["--skip_prior_key", DIFFICULTY]
ARMS.update({f"{arm}-prior": [*ARMS[arm], *PRIOR] for arm in ("skip", "dynamic+skip")})
HALF_BATCH = ["--per_device_train_batch_size", "64"]  # 8 groups a step instead of 16
ARMS.update({f"{arm}-8g": [*flags, *HALF_BATCH] for arm, flags in list(ARMS.items())})
ZERO_TARGET = ["--skip_target_zero_std_frac", "0"]  # skip as much as the floor allows
ARMS.update({f"{arm}-t0": [*ARMS[arm], *ZERO_TARGET] for arm in ("skip", "dynamic+skip", "skip-prior")})
LOW_FLOOR = ["--skip_min_draw_prob", "0.02"]  # a prompt predicted zero-variance is drawn 1 time in 50, not 1 in 20
ARMS["skip-prior-t0-f02"] = [*ARMS["skip-prior-t0"], *LOW_FLOOR]


def with_predictor(flags: list[str], predictor: str) -> list[str]:
    """``flags`` with ``--skip_predictor`` set to ``predictor`` instead of the streak."""
    at = flags.index("--skip_predictor") + 1
    return [*flags[:at], predictor, *flags[at + 1 :]]


ARMS["skip-rate"] = with_predictor(ARMS["skip"], "success_rate")  # a success rate per prompt, not the streak
ARMS["skip-rate-prior"] = with_predictor(ARMS["skip-prior"], "success_rate")
ARMS["skip-rate-prior-f02"] = [*ARMS["skip-rate-prior"], *LOW_FLOOR]
ARMS["skip-share-prior"] = with_predictor(ARMS["skip-prior"], "informative_share")  # a level's informative share
ARMS["dynamic+skip-t0-8g"] = [*ARMS["dynamic+skip-t0"], *HALF_BATCH]
ARMS["dynamic+skip-6g"] = [*ARMS["dynamic+skip"], "--per_device_train_batch_size", "48"]  # 6 groups a step
SCREENED = ("dynamic-8g", "dynamic+skip-8g", "dynamic+skip-6g", "dynamic+skip-t0-8g", "dynamic+skip-prior-8g")
for screen in (2, 4):  # dynamic_sampling_screen: that many completions of each prompt first, the rest if they differ
    ARMS.update(
        {f"{arm}-screen{screen}": [*ARMS[arm], "--dynamic_sampling_screen", str(screen)] for arm in SCREENED}
    )  # fmt: skip
    ARMS[f"dynamic-screen{screen}"] = [*ARMS["dynamic"], "--dynamic_sampling_screen", str(screen)]  # the task's batch
# TRL's num_iterations=2 (GRPO's mu): each generation batch trains two optimizer steps, the second with PPO's clipped
# ratio to the policy that generated it. "-mu2" keeps the 300 optimizer steps and their learning-rate schedule (what a
# TRL user gets by setting it: half the generation batches); "-mu2-x2" runs twice the steps, so that it generates as
# many batches as the others. Every arm is evaluated every eval_steps generation batches.
REUSE = ["--num_iterations", "2"]
for arm in ("trl", "masking", "keep_failed", "skip-rate-prior", "skip-rate-prior-f02"):
    ARMS[f"{arm}-mu2"] = [*ARMS[arm], *REUSE]
    ARMS[f"{arm}-mu2-x2"] = ARMS[f"{arm}-mu2"]
# Half the steps: the learning rate decays over 150 generation batches, as under "-mu2", without the second pass
ARMS.update({f"{arm}-half": ARMS[arm] for arm in ("trl", "skip-rate-prior-f02")})
# The learning rate times 0.5 ("-lr05") or 2 ("-lr2"), the schedule otherwise the same: is --learning_rate TRL's best,
# and does an arm of ours learn faster at another? The target stays base TRL's at --learning_rate.
LR_SCALES = {"-lr05": 0.5, "-lr2": 2.0}
SETTING_SUFFIXES = ("-mu2", "-x2", "-half", *LR_SCALES)  # a run setting that TRL can be given too
for arm in ("trl", "skip-rate-prior-f02", "keep_failed"):
    for variant in (arm, f"{arm}-mu2", f"{arm}-mu2-x2"):
        ARMS.update({f"{variant}{suffix}": ARMS[variant] for suffix in LR_SCALES})
ARMS["skip-rate-prior-lr2"] = ARMS["skip-rate-prior"]
# A skipped prompt's place stays an empty slot instead of going to the next prompt drawn: a step costs fewer tokens
EMPTY = ["--skip_refill", "false"]
for arm in ("skip-rate-prior", "skip-rate-prior-f02"):
    ARMS[f"{arm}-empty"] = [*ARMS[arm], *EMPTY]
    ARMS[f"{arm}-empty-kf"] = [*ARMS[arm], *EMPTY, *ARMS["keep_failed"]]
    ARMS[f"{arm}-empty-x2"] = ARMS[f"{arm}-empty"]  # twice the steps: about TRL's tokens
# One group a step (8 completions): an optimizer step moves the policy about as far whatever its batch (Adam), so at
# fixed tokens more, smaller steps on informative groups may learn more; "-screen2" tells a tie from 2 completions
ARMS["dynamic-1g-screen2"] = [*ARMS["dynamic"], "--per_device_train_batch_size", "8", "--dynamic_sampling_screen", "2"]
NEVER_X = 4.0  # where the ratio panel draws a seed that never reaches its target


@dataclass
class TimeToAccuracyArguments:
    arms: list[str] = field(
        default_factory=lambda: [
            "trl", "masking", "keep_failed", "dynamic", "skip", "skip-t0", "skip-band", "skip-prior", "skip-prior-t0",
            "skip-prior-t0-f02", "skip-rate", "skip-rate-prior", "skip-rate-prior-f02", "dynamic+skip-8g",
            "dynamic-8g-screen4", "dynamic+skip-8g-screen4", "dynamic+skip-prior-8g", "dynamic+skip-prior-8g-screen4",
            "trl-mu2", "masking-mu2", "skip-rate-prior-mu2", "skip-rate-prior-f02-mu2", "trl-mu2-x2", "masking-mu2-x2",
            "skip-rate-prior-mu2-x2", "skip-rate-prior-f02-mu2-x2", "trl-half", "skip-rate-prior-f02-half",
            "trl-lr05", "skip-rate-prior-f02-lr05", "trl-mu2-lr05", "skip-rate-prior-f02-mu2-lr05", "trl-mu2-x2-lr05",
            "skip-rate-prior-f02-mu2-x2-lr05", "trl-lr2", "skip-rate-prior-lr2", "skip-rate-prior-f02-lr2",
            "trl-mu2-lr2", "skip-rate-prior-f02-mu2-lr2",
        ],  # fmt: skip
        metadata={
            "help": f"Of {list(ARMS)} (-8g, -6g: 8 or 6 groups a step instead of 16; -t0: "
            "skip_target_zero_std_frac=0; -screenS: dynamic_sampling_screen=S; -band: skip_history_key=band; -prior: "
            "skip_prior_key=band; -f02: skip_min_draw_prob=0.02; -rate: skip_predictor=success_rate; -share: "
            "skip_predictor=informative_share; -mu2: num_iterations=2; -x2: 2 x max_steps; -half: max_steps / 2; "
            "-lr05, -lr2: learning_rate x 0.5, x 2; -empty: skip_refill=False; -kf: zero_std_kl=keep_failed; -1g: one "
            "group of 8 a step)."
        },
    )
    seeds: list[int] = field(default_factory=lambda: list(range(10)))
    learning_rate: float = field(default=1e-3, metadata={"help": "The main job's default."})
    max_steps: int = field(default=300)
    eval_steps: int = field(default=30)
    eval_samples: int = field(default=8, metadata={"help": "Completions per held-out prompt at each evaluation."})
    target_fraction: float = field(
        default=0.9,
        metadata={"help": "Per seed, the target is the start plus this fraction of base TRL's held-out gain."},
    )
    plot_arms: list[str] = field(
        default_factory=lambda: [
            "trl", "masking", "dynamic", "skip", "skip-rate-prior-f02", "dynamic+skip-prior-8g-screen4",
            "skip-rate-prior-f02-mu2", "trl-mu2", "skip-rate-prior-f02-mu2-x2-lr05", "trl-mu2-x2-lr05",
        ],  # fmt: skip
        metadata={"help": "Arms drawn in the figure (all of --arms are in the table)."},
    )
    task_flags: list[str] = field(
        default_factory=lambda: ["--task", "spread", "--max_completion_length", "6"],
        metadata={"help": "The task's flags, shared by every arm (the main job's defaults give the rest)."},
    )
    difficulty_column: str = field(default="band", metadata={"help": "The task's difficulty column (-band, -prior)."})
    levels: list[str] = field(
        default_factory=lambda: ["easy", "medium", "hard"], metadata={"help": "Its values, easiest first."}
    )
    hard_level: str = field(default="hard", metadata={"help": "The level whose accuracy the task check shows."})
    completions_per_step: int = field(default=128, metadata={"help": "The task's per_device_train_batch_size."})
    num_generations: int = field(default=8, metadata={"help": "The task's num_generations."})
    eval_batch_size: int = field(default=200, metadata={"help": "per_device_eval_batch_size of the evaluations."})
    title: str = field(default="Difficulty-spread task")
    report_only: bool = field(
        default=False, metadata={"help": "Report the runs already cached, run none (a study made over sessions)."}
    )
    report_arms: list[str] = field(
        default_factory=list,
        metadata={"help": "With --report_only: the arms reported, those with runs (default: --arms)."},
    )
    jobs: int = field(default=2)
    runs_dir: str = field(default="outputs/time_to_accuracy")
    table: str = field(default="docs/time_to_accuracy.md")
    plot: str = field(default="docs/time_to_accuracy.png")


def eval_points(record: dict) -> list[tuple[int, float, float, float, float]]:
    """``(step, held-out reward, generated tokens, wall s, generation s)`` at each evaluation."""
    tokens = [0.0, *record["num_tokens"]]
    wall, generation = [0.0, *cumulative(record["step_time"])], [0.0, *cumulative(record["generation_s"])]
    return [(step, reward, tokens[step], wall[step], generation[step]) for step, reward in record["eval"]]


def first_reaching(record: dict, target: float) -> tuple[int, float, float, float, float] | None:
    """The ``eval_points`` entry of the first evaluation at or above ``target`` (None: never)."""
    return next((point for point in eval_points(record) if point[1] >= target), None)


def reached(record: dict, target: float) -> tuple[float, float, float] | None:
    """Tokens, wall seconds and generation seconds at the first evaluation at or above ``target`` (None: never)."""
    point = first_reaching(record, target)
    return point[2:] if point else None


def crossing(record: dict, target: float) -> tuple[float, float] | None:
    """Tokens and wall seconds where the held-out reward first crosses ``target``, interpolated linearly between the
    two evaluations around the crossing (None: never). Finer than ``reached``, whose cost is the evaluation grid's
    next point: a ratio to TRL from it is not bound to the grid's fractions (1/3, 1/2, 2/3 of 30 steps)."""
    points = eval_points(record)
    if points[0][1] >= target:
        return points[0][2:4]
    for before, after in zip(points, points[1:]):
        if after[1] >= target:
            share = (target - before[1]) / (after[1] - before[1])
            return tuple(b + share * (a - b) for b, a in zip(before[2:4], after[2:4]))
    return None


def ratios_to_trl(ours: tuple | None, theirs: tuple) -> tuple[float, float]:
    """Tokens and wall time to target over TRL's, from two ``reached`` results; inf where ours never reaches it."""
    return (ours[0] / theirs[0], ours[1] / theirs[1]) if ours else (math.inf, math.inf)


def final_reward(record: dict) -> float:
    """Held-out reward at the end: the mean of the last two evaluations (one evaluation's noise is about 0.015)."""
    return statistics.fmean(reward for _, reward in record["eval"][-2:])


def targets(records: list[dict], fraction: float, baseline: str = "trl") -> dict[int, float]:
    """Per seed: the start plus ``fraction`` of the ``baseline`` arm's held-out gain on that seed (base TRL's unless
    named; every arm starts alike)."""
    return {
        r["seed"]: r["eval"][0][1] + fraction * (final_reward(r) - r["eval"][0][1])
        for r in records
        if r["arm"] == baseline
    }


def arm_flag(arm: str, name: str, default: int) -> int:
    """The integer value of flag ``name`` among the arm's flags, ``default`` where it does not set it."""
    flags = ARMS[arm]
    return int(flags[flags.index(name) + 1]) if name in flags else default


def groups_per_step(arm: str, args: TimeToAccuracyArguments) -> int:
    """Groups a step trains: the study's completions a step (or the arm's --per_device_train_batch_size) over G."""
    return arm_flag(arm, "--per_device_train_batch_size", args.completions_per_step) // args.num_generations


def split_learning_rate(arm: str) -> tuple[str, float]:
    """``(arm without its learning-rate suffix, factor on --learning_rate)``: ("trl-mu2", 0.5) for "trl-mu2-lr05"."""
    for suffix, scale in LR_SCALES.items():
        if arm.endswith(suffix):
            return arm.removesuffix(suffix), scale
    return arm, 1.0


def run_length(arm: str) -> float:
    """How many times max_steps the arm runs: 2 for "-x2" arms, 0.5 for "-half" arms, else 1."""
    arm, _ = split_learning_rate(arm)
    return 2.0 if arm.endswith("-x2") else 0.5 if arm.endswith("-half") else 1.0


def iterations(arm: str) -> int:
    """Optimizer steps each generation batch trains: the arm's --num_iterations (TRL's default 1)."""
    return arm_flag(arm, "--num_iterations", 1)


def cost(value: float, spec: str) -> str:
    """A cost to target as the tables print it: "never" where the median seed does not reach the target."""
    return format(value, spec) if math.isfinite(value) else "never"


def median(values):
    return statistics.median(values) if values else float("nan")


def summarise(records: list[dict], args: TimeToAccuracyArguments) -> str:
    per_arm = {arm: [r for r in records if r["arm"] == arm] for arm in args.arms}
    target = targets(records, args.target_fraction)
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
    for arm, runs in per_arm.items():
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
        run_tokens = statistics.fmean(r["num_tokens"][-1] for r in runs)
        run_wall = statistics.fmean(sum(r["step_time"]) for r in runs)
        run_generation = statistics.fmean(sum(r["generation_s"]) / sum(r["step_time"]) for r in runs)
        lines.append(
            f"| {arm} | {statistics.fmean(starts):.3f} -> {statistics.fmean(finals):.3f} "
            f"({statistics.fmean(gains):+.3f} ± {statistics.stdev(gains) if len(gains) > 1 else 0:.3f}) "
            f"| {len(hits)}/{len(runs)} "
            f"| {cost(tokens / 1e6, '.3f')}, {cost(token_ratio, '.2f')} "
            f"| {cost(wall, '.1f')}, {cost(wall_ratio, '.2f')} "
            f"| {cost(generation, '.1f')} "
            f"| {run_tokens / 1e6:.3f}, {run_wall:.0f}, {run_generation:.0%} | {wrong:.2f} / {right:.2f} |"
        )
    lines += [
        "",
        "The same ratios with each crossing interpolated between the two evaluations around it, for TRL as for the "
        "arm (tokens / TRL per seed; -: not reached):",
        "",
        *ratio_header("arm", "TRL", args.seeds),
    ]
    base_crossing = {r["seed"]: crossing(r, target[r["seed"]]) for r in per_arm["trl"]}
    lines += [interpolated_row(arm, runs, base_crossing, target, args.seeds) for arm, runs in per_arm.items()]
    lines += ["", "Per seed, tokens (M) to target (-: not reached) and held-out gain (final - start):", ""]
    lines += [
        "| arm | " + " | ".join(f"seed {seed}" for seed in args.seeds) + " |",
        "|---" * (len(args.seeds) + 1) + "|",
    ]
    for arm, runs in per_arm.items():
        by_seed = {r["seed"]: r for r in runs}
        cells = []
        for seed in args.seeds:
            record = by_seed.get(seed)
            point = reached(record, target[seed]) if record and seed in target else None
            gain = final_reward(record) - record["eval"][0][1] if record else float("nan")
            cells.append(f"{point[0] / 1e6:.3f}, {gain:+.3f}" if point else f"-, {gain:+.3f}")
        lines.append(f"| {arm} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "Learning against the informative groups a step trains (mean over seeds; groups trained: the batch's less its "
        "empty slots; informative: those less TRL's frac_reward_zero_std of the batch, in which an empty slot does "
        "not count):",
        "",
        "| arm | groups trained a step | informative groups a step | generated tokens a step | held-out gain | gain "
        "per M generated tokens |",
        "|---|---|---|---|---|---|",
    ]
    for arm, runs in per_arm.items():
        groups = groups_per_step(arm, args)
        empty = statistics.fmean(statistics.fmean(x or 0.0 for x in r.get("empty_slot_frac") or [0.0]) for r in runs)
        informative = statistics.fmean(
            groups * (1 - empty - statistics.fmean(r["frac_reward_zero_std"])) for r in runs
        )
        tokens = statistics.fmean(r["num_tokens"][-1] / len(r["num_tokens"]) for r in runs)
        gain = statistics.fmean(final_reward(r) - r["eval"][0][1] for r in runs)
        trained = f"{groups * (1 - empty):.1f}" if empty else f"{groups}"
        lines.append(
            f"| {arm} | {trained} | {informative:.1f} | {tokens:.0f} | {gain:+.3f} | "
            f"{gain / statistics.fmean(r['num_tokens'][-1] for r in runs) * 1e6:.3f} |"
        )
    lines += ["", *task_check(per_arm["trl"], args.hard_level), ""]
    lines += foresight_bound(per_arm["trl"], target, args.seeds)
    lines += perfect_predictor(per_arm, target, args)
    lines += same_setting(per_arm, args)
    lines += speed_gauge(per_arm)
    lines += ["", "Held-out accuracy per band at the first and last evaluation (mean over seeds):", ""]
    lines += ["| arm | " + " | ".join(args.levels) + " |", "|---" * (len(args.levels) + 1) + "|"]
    for arm, runs in per_arm.items():
        cells = [
            f"{statistics.fmean(r['eval_bands'][0][band] for r in runs):.2f} -> "
            f"{statistics.fmean(r['eval_bands'][-1][band] for r in runs):.2f}"
            for band in args.levels
        ]
        lines.append(f"| {arm} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


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


def interpolated_row(label: str, runs: list[dict], base: dict, target: dict[int, float], seeds: list[int]) -> str:
    """A table row: the medians of the runs' tokens and wall time to target over TRL's (``base``: TRL's ``crossing``
    per seed), both interpolated, then the tokens ratio of each of ``seeds`` (-: not reached)."""
    by_seed = {r["seed"]: ratios_to_trl(crossing(r, target[r["seed"]]), base[r["seed"]]) for r in runs
               if base.get(r["seed"])}  # fmt: skip
    medians = [cost(median([ratio[i] for ratio in by_seed.values()]), ".2f") for i in range(2)]
    cells = [cost(by_seed[s][0], ".2f").replace("never", "-") if s in by_seed else "" for s in seeds]
    return f"| {label} | {medians[0]} | {medians[1]} | " + " | ".join(cells) + " |"


def trained_only(record: dict, groups: int) -> dict:
    """A dynamic-sampling run as prompt skipping with a perfect predictor would have run it: each step's tokens and
    generation seconds scaled by the share of its generated groups that trained (``groups`` of
    ``generated_groups``; the rest were tied and dropped, which that predictor would not have generated). The scaling
    assumes a step's groups cost alike; scoring is left whole."""
    steps = zip(record["num_tokens"], [0.0, *record["num_tokens"][:-1]], record["generated_groups"],
                record["step_time"], record["generation_s"])  # fmt: skip
    tokens, step_time = [], []
    for total, before, generated, step, generation in steps:
        kept = groups / generated if generated else 1.0
        tokens.append((tokens[-1] if tokens else 0.0) + (total - before) * kept)
        step_time.append(step - generation * (1 - kept))
    return {**record, "num_tokens": tokens, "step_time": step_time}


def perfect_predictor(per_arm: dict[str, list[dict]], target: dict[int, float], args) -> list[str]:
    """The perfect-foresight bound measured instead of assumed: a dynamic-sampling arm trains batches of informative
    groups only, which is the batch prompt skipping with a perfect predictor would generate; counting only the trained
    groups' tokens and generation time (``trained_only``) gives that predictor's cost to target over TRL's
    (interpolated crossings). It differs from ``foresight_bound`` where a batch of only informative groups teaches
    more, or less, per group than TRL's mixed batch."""
    arms = [
        arm
        for arm, runs in per_arm.items()
        if runs and runs[0]["generated_groups"][0] is not None and "--dynamic_sampling_screen" not in ARMS[arm]
    ]  # a screen counts as a generated group, so the share that trained would not be a share of tokens
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


def setting_twin(arm: str) -> str | None:
    """Base TRL given ``arm``'s run setting (its -mu2, -x2, -half and learning-rate suffixes): "trl-mu2-x2-lr05" for
    "keep_failed-mu2-x2-lr05"; None for an arm at TRL's own settings, or for TRL."""
    setting, rest = "", arm
    while suffix := next((s for s in SETTING_SUFFIXES if rest.endswith(s)), None):
        setting, rest = suffix + setting, rest.removesuffix(suffix)
    return f"trl{setting}" if setting and rest != "trl" else None


def same_setting(per_arm: dict[str, list[dict]], args) -> list[str]:
    """Each arm against base TRL given the same run setting (``setting_twin``), where that arm has runs: per seed the
    target is the start plus ``args.target_fraction`` of the twin's gain; tokens and wall time to it over the twin's,
    interpolated."""
    pairs = [(arm, twin) for arm in per_arm if per_arm.get(twin := setting_twin(arm))]
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


def speed_gauge(per_arm: dict[str, list[dict]]) -> list[str]:
    """Seconds to generate one full batch (the median over a run's generation rounds), per run of each arm that
    generates the same batch every round (no dynamic sampling, no empty slots): the same work in every run, so it
    shows how fast the machine, and what ran beside, let each run go."""
    rows = []
    for arm, runs in per_arm.items():
        if not runs or runs[0]["generated_groups"][0] is not None or any(runs[0].get("empty_slot_frac") or ()):
            continue
        rounds = {r["seed"]: median([s for s in r["generation_s"] if s > 0]) for r in runs}
        rows.append(f"| {arm} | " + ", ".join(f"{s}: {t:.1f}" for s, t in sorted(rounds.items())) + " |")
    if not rows:
        return []
    header = ["", "Speed gauge: seconds to generate one batch, per seed (about the same work in every run: wall times "
              "of runs at different gauges do not compare):", ""]  # fmt: skip
    return [*header, "| arm | seed: s |", "|---|---|", *rows]


def plot(records: list[dict], args: TimeToAccuracyArguments) -> None:
    """Held-out gain over the start (each seed starts from its own warm start) against generated tokens and wall time:
    the mean over seeds per arm, each seed faint; the dotted line is the mean target gain. Right: each seed's tokens
    and wall time to its target over TRL's, the medians marked (the claim; the mean curves average seeds at equal
    steps, which stretches an arm's curve by its costliest seed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    target = targets(records, args.target_fraction)
    start = {r["seed"]: r["eval"][0][1] for r in records if r["arm"] == "trl"}
    figure, all_axes = plt.subplots(1, 3, figsize=(19, 4.8), gridspec_kw={"width_ratios": [1, 1, 0.9]})
    axes, ratio_axis = all_axes[:2], all_axes[2]
    axes[1].sharey(axes[0])
    base = [r for r in records if r["arm"] == "trl"]
    axes[0].set_xlim(0, 2.5 * statistics.fmean(r["num_tokens"][-1] for r in base) / 1e6)  # dynamic runs go far past
    axes[1].set_xlim(0, 2.5 * statistics.fmean(sum(r["step_time"]) for r in base))
    for index, arm in enumerate(args.plot_arms):
        runs = [r for r in records if r["arm"] == arm]
        if not runs:
            continue
        points = [[(p[1] - start[r["seed"]], p[2] / 1e6, p[3]) for p in eval_points(r)] for r in runs]
        for run_points in points:
            axes[0].plot([p[1] for p in run_points], [p[0] for p in run_points], color=f"C{index}", alpha=0.15)
            axes[1].plot([p[2] for p in run_points], [p[0] for p in run_points], color=f"C{index}", alpha=0.15)
        mean = [[statistics.fmean(run[k][i] for run in points) for k in range(len(points[0]))] for i in range(3)]
        label = f"{arm} ({len(runs)} seeds)"
        axes[0].plot(mean[1], mean[0], "o-", color=f"C{index}", label=label, markersize=3)
        axes[1].plot(mean[2], mean[0], "o-", color=f"C{index}", label=label, markersize=3)
    axes[0].set_xlabel("generated tokens (millions, TRL's num_tokens)")
    axes[1].set_xlabel("wall clock (s, sum of step times, evaluation excluded)")
    axes[0].set_ylabel(f"held-out reward - start ({args.eval_samples} samples per prompt)")
    mean_target = statistics.fmean(target[seed] - start[seed] for seed in target)
    for axis in axes:
        axis.axhline(mean_target, color="grey", linestyle=":", linewidth=1, label="target (mean over seeds)")
        axis.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    plot_ratios(ratio_axis, records, args, target)
    figure.suptitle(
        f"{args.title}, held-out split: mean over each arm's seeds (of {len(args.seeds)}), faint: each seed"
    )
    figure.tight_layout()
    figure.savefig(args.plot, dpi=110)
    plt.close(figure)


def plot_ratios(axis, records: list[dict], args: TimeToAccuracyArguments, target: dict[int, float]) -> None:
    """Per plotted arm: each seed's tokens (dots) and wall time (crosses) to its target over TRL's, medians as bars;
    a seed that never reaches it is drawn at the right edge (a triangle) and counts as the costliest in the median."""
    base = {r["seed"]: reached(r, target[r["seed"]]) for r in records if r["arm"] == "trl"}
    arms = [arm for arm in args.plot_arms if arm != "trl" and any(r["arm"] == arm for r in records)]
    for row, arm in enumerate(arms):
        ratios = [
            ratios_to_trl(reached(r, target[r["seed"]]), base[r["seed"]])
            for r in records
            if r["arm"] == arm and base.get(r["seed"])
        ]
        for offset, index, marker, label in ((-0.15, 0, "o", "tokens"), (0.15, 1, "x", "wall time")):
            values = [ratio[index] for ratio in ratios]
            shown = [value for value in values if math.isfinite(value)]
            axis.scatter(shown, [row + offset] * len(shown), marker=marker, color=f"C{index}", s=18,
                         label=label if row == 0 else None)  # fmt: skip
            never = len(values) - len(shown)
            axis.scatter([NEVER_X] * never, [row + offset] * never, marker=">", color=f"C{index}", s=18)
            if math.isfinite(median(values)):
                axis.plot([median(values)] * 2, [row + offset - 0.12, row + offset + 0.12], color=f"C{index}",
                          linewidth=3)  # fmt: skip
    axis.set_yticks(range(len(arms)), arms, fontsize=8)
    axis.invert_yaxis()
    for x, style in ((1.0, "-"), (0.5, ":"), (1 / 1.5, "--")):
        axis.axvline(x, color="grey", linestyle=style, linewidth=1)
    axis.set_xscale("log", base=2)
    axis.set_xticks([0.25, 0.5, 2 / 3, 1, 2, NEVER_X], ["0.25", "0.5", "0.67", "1", "2", "never"])
    axis.minorticks_off()
    axis.set_xlabel("to target, / TRL (per seed; bar: median; lines at 1, 1/1.5, 1/2)")
    axis.legend(fontsize=8)
    axis.grid(alpha=0.3, axis="x")


def common_flags(args: TimeToAccuracyArguments, eval_steps: int | None = None) -> list[str]:
    """The flags every arm's run shares: the task's (``args.task_flags``), its held-out evaluation (every
    ``eval_steps``, default ``args.eval_steps``)."""
    return [
        *args.task_flags, "--eval_strategy", "steps", "--eval_steps", str(eval_steps or args.eval_steps),
        "--eval_on_start", "true", "--num_generations_eval", str(args.eval_samples),
        "--per_device_eval_batch_size", str(args.eval_batch_size),
    ]  # fmt: skip


def arm_flags(arm: str, args: TimeToAccuracyArguments) -> list[str]:
    """The arm's flags, its difficulty column named (``args.difficulty_column``)."""
    return [args.difficulty_column if flag == DIFFICULTY else flag for flag in ARMS[arm]]


def jobs(args: TimeToAccuracyArguments) -> list[tuple]:
    """One job per seed and arm: ``run_length(arm) x max_steps`` steps at the arm's learning rate, evaluated every
    ``eval_steps`` generation batches (every ``iterations(arm) x eval_steps`` steps)."""
    return [
        (arm, [*arm_flags(arm, args), *common_flags(args, args.eval_steps * iterations(arm))],
         args.learning_rate * split_learning_rate(arm)[1], seed, round(args.max_steps * run_length(arm)),
         f"{args.runs_dir}/{arm}-seed{seed}.json")
        for seed in args.seeds
        for arm in args.arms
    ]  # fmt: skip


def main(args: TimeToAccuracyArguments) -> None:
    if not args.report_only:
        report(run_all(jobs(args), args.jobs), args, summarise, plot)
        return
    args.arms = args.report_arms or args.arms
    records = [json.loads(Path(job[-1]).read_text()) for job in jobs(args) if Path(job[-1]).exists()]
    args.arms = [arm for arm in args.arms if any(r["arm"] == arm for r in records)]
    args.seeds = [seed for seed in args.seeds if any(r["seed"] == seed and r["arm"] == "trl" for r in records)]
    records = [r for r in records if r["seed"] in args.seeds]
    report(records, args, summarise, plot)


if __name__ == "__main__":
    from trl import TrlParser

    (parsed,) = TrlParser((TimeToAccuracyArguments,)).parse_args_and_config()
    main(parsed)
