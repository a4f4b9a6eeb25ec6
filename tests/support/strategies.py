"""Hypothesis strategies and helpers shared by the tests of ``core`` (``tests/core``).

Draws small batches (``G`` in 2..6 generations, 1..5 groups, 1..3 reward functions, some ``None`` rewards).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from trl_zerostd.core import advantages

PROPERTY = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

SCALE_REWARDS = ("group", "batch", "none")
AGGREGATIONS = ("sum_then_normalize", "normalize_then_sum")
GRPO_MODES = [{"scale_rewards": s, "multi_objective_aggregation": a} for s in SCALE_REWARDS for a in AGGREGATIONS]
RLOO_MODES = [{"normalize_advantages": n, "with_kl": k} for n in (False, True) for k in (False, True)]

# A reward is a small integer cell times a per-batch scale; cells above 8 are None (NaN, ~1 in 5 cells).
# Scale 0.25 gives quarter-grid rewards whose sums are exact (well conditioned); an arbitrary float32 scale gives
# rewards with rounding everywhere, for the bitwise comparisons. Integer cells keep hypothesis fast.
GRID = st.just(0.25)
SCALES = st.sampled_from([0.25, 1.0]) | st.floats(0.015625, 3, width=32)
FLOATS = st.floats(-10, 10, width=32)
WEIGHTS = st.sampled_from([1.0, 0.5, 2.0, -1.0, 0.0]) | st.floats(-3, 3, width=32)


@dataclass
class Batch:
    rewards_per_func: torch.Tensor  # (N, K), NaN = the function returned None
    reward_weights: torch.Tensor  # (K,)
    num_generations: int
    kl: torch.Tensor  # (N,) a per-row sequence KL, for RLOO's penalty

    @property
    def n(self) -> int:
        return self.rewards_per_func.shape[0]

    @property
    def num_groups(self) -> int:
        return self.n // self.num_generations


def reward_table(draw, n, k, scale, dtype=torch.float32):
    """``(n, k)`` rewards: cells in -8..12 times ``scale``, NaN (the function returned None) for cells above 8.

    One drawn integer per row holds its ``k`` cells (base 21): a third of the draws, same distribution."""
    packed = draw(st.lists(st.integers(0, 21**k - 1), min_size=n, max_size=n))
    cells = torch.tensor([[code // 21**j % 21 - 8 for j in range(k)] for code in packed], dtype=torch.float64)
    return torch.where(cells > 8, math.nan, cells * scale).to(dtype)


def row_values(draw, n, scale, dtype=torch.float32):
    """``(n,)`` finite values: cells in -8..8 times ``scale``."""
    return (torch.tensor(draw(st.lists(st.integers(-8, 8), min_size=n, max_size=n)), dtype=torch.float64) * scale).to(
        dtype
    )


@st.composite
def batches(draw, scales=SCALES, min_generations=2, dtype=torch.float32):
    num_generations = draw(st.integers(min_generations, 6))
    n = num_generations * draw(st.integers(1, 5))
    k = draw(st.integers(1, 3))
    rewards = reward_table(draw, n, k, draw(scales), dtype)
    weights = torch.tensor(draw(st.lists(WEIGHTS, min_size=k, max_size=k)), dtype=dtype)
    return Batch(rewards, weights, num_generations, row_values(draw, n, draw(scales), dtype))


def bools(draw, n):
    """``(n,)`` bool from one drawn bitmask."""
    bits = draw(st.integers(0, 2**n - 1))
    return torch.tensor([(bits >> i) & 1 for i in range(n)], dtype=torch.bool)


def grpo(batch, stat_rows, **mode):
    return advantages.grpo_advantages(
        batch.rewards_per_func, batch.reward_weights, batch.num_generations, stat_rows, **mode
    )


def rloo(batch, stat_rows, normalize_advantages=False, with_kl=False, beta=0.05, reward_clip_range=None):
    return advantages.rloo_advantages(
        batch.rewards_per_func,
        batch.reward_weights,
        batch.num_generations,
        stat_rows,
        kl_penalty=beta * batch.kl if with_kl else None,
        normalize_advantages=normalize_advantages,
        reward_clip_range=reward_clip_range,
    )


def all_estimators(batch, stat_rows):
    """``{label: advantages}`` for every GRPO mode and every RLOO mode."""
    out = {f"grpo {m}": grpo(batch, stat_rows, **m) for m in GRPO_MODES}
    out.update({f"rloo {m}": rloo(batch, stat_rows, **m) for m in RLOO_MODES})
    return out


def expected_zero_std_groups(rewards, valid_rows, num_generations, atol):
    """Reference for ``zero_std_groups``, group by group in Python (the spread computed in float32, like the batch)."""
    out = []
    rewards, valid_rows = rewards.tolist(), valid_rows.tolist()
    for start in range(0, len(rewards), num_generations):
        values = [
            rewards[i] for i in range(start, start + num_generations) if valid_rows[i] and rewards[i] == rewards[i]
        ]
        spread = torch.tensor(max(values)) - torch.tensor(min(values)) if len(values) >= 2 else None  # float32
        out.append(spread is None or bool(spread <= atol))
    return torch.tensor(out, dtype=torch.bool)


STAT_PATTERNS = ("random", "none", "all", "one_per_group", "all_but_one_per_group")


def stat_pattern(draw, pattern, n, g):
    if pattern == "random":
        return bools(draw, n)
    if pattern in ("none", "all"):
        return torch.full((n,), pattern == "all")
    chosen = torch.tensor([start + draw(st.integers(0, g - 1)) for start in range(0, n, g)])
    one = torch.zeros(n, dtype=torch.bool).index_fill(0, chosen, True)
    return one if pattern == "one_per_group" else ~one
