"""Per-run measures of ``time_to_accuracy.py``'s study: the held-out reward at each evaluation, the cost to reach a
target (at the evaluation grid, or interpolated), ratios to TRL's, and each seed's target."""

from __future__ import annotations

import math
import statistics

from studies.learning_curves import cumulative


def generated_tokens(record: dict) -> list[float]:
    """Cumulative prompt and completion tokens of every sequence generated, per step: counted where the trainer
    generates (``runs.timing_generation``: the peer's calibration in, its padding out), or, for a run recorded before
    that count, TRL's ``num_tokens`` (the same count for TRL and this package's trainers)."""
    return record.get("generated_tokens") or record["num_tokens"]


def eval_points(record: dict) -> list[tuple[int, float, float, float, float]]:
    """``(step, held-out reward, generated tokens, wall s, generation s)`` at each evaluation."""
    tokens = [0.0, *generated_tokens(record)]
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


def accuracy_at_tokens(record: dict, tokens: float) -> float:
    """Held-out reward after ``tokens`` generated tokens, interpolated linearly in tokens between the evaluations
    around it; a run that ends before ``tokens`` is credited with its last evaluation."""
    points = [(point[2], point[1]) for point in eval_points(record)]
    for (before_tokens, before), (after_tokens, after) in zip(points, points[1:]):
        if after_tokens >= tokens:
            share = (tokens - before_tokens) / (after_tokens - before_tokens) if after_tokens > before_tokens else 1.0
            return before + max(share, 0.0) * (after - before)
    return points[-1][1]


def run_tokens(record: dict) -> float:
    """Generated tokens of the whole run."""
    return generated_tokens(record)[-1]


def ratios_to_trl(ours: tuple | None, theirs: tuple) -> tuple[float, float]:
    """Tokens and wall time to target over TRL's, from two ``reached`` results; inf where ours never reaches it."""
    return (ours[0] / theirs[0], ours[1] / theirs[1]) if ours else (math.inf, math.inf)


def final_reward(record: dict) -> float:
    """Held-out reward at the end: the mean of the last two evaluations (one evaluation's noise is about 0.015)."""
    return statistics.fmean(reward for _, reward in record["eval"][-2:])


def targets(records: list[dict], fraction: float, baseline: str = "trl") -> dict[int, float]:
    """Per seed: the start plus ``fraction`` of the ``baseline`` arm's held-out gain on that seed (base TRL's unless
    named; every arm starts alike). A baseline run whose held-out reward does not rise fails: its target would be
    reached at step 0, at no cost, and every ratio to it would divide by zero."""
    target = {}
    for r in (r for r in records if r["arm"] == baseline):
        start, gain = r["eval"][0][1], final_reward(r) - r["eval"][0][1]
        if gain <= 0:
            raise ValueError(
                f"{baseline}'s held-out reward does not rise on seed {r['seed']} (start {start:.3f}, final "
                f"{start + gain:.3f}): no target to reach; train it longer or leave the seed out."
            )
        target[r["seed"]] = start + fraction * gain
    return target


def cost(value: float, spec: str) -> str:
    """A cost to target as the tables print it: "never" where the median seed does not reach the target."""
    return format(value, spec) if math.isfinite(value) else "never"


def median(values):
    return statistics.median(values) if values else float("nan")


def scaled_cumulative(cumulative: list[float], kept: list[float]) -> list[float]:
    """A cumulative per-step count (tokens) with each step's increment scaled by its ``kept`` factor."""
    before, scaled = 0.0, []
    for total, factor in zip(cumulative, kept, strict=True):
        scaled.append((scaled[-1] if scaled else 0.0) + (total - before) * factor)
        before = total
    return scaled


def trained_only(record: dict, groups: int) -> dict:
    """A dynamic-sampling run as prompt skipping with a perfect predictor would have run it: each step's tokens and
    generation seconds scaled by the share of its generated groups that trained (``groups`` of
    ``generated_groups``; the rest were tied and dropped, which that predictor would not have generated). The scaling
    assumes a step's groups cost alike; scoring is left whole."""
    kept = [groups / generated if generated else 1.0 for generated in record["generated_groups"]]
    step_time = [step - generation * (1 - factor)
                 for step, generation, factor in zip(record["step_time"], record["generation_s"], kept)]  # fmt: skip
    return {**record, "num_tokens": scaled_cumulative(record["num_tokens"], kept), "step_time": step_time}
