"""Tests of ``trl_zerostd/core/groups.py``: groups, masks, zero-variance decisions and task rewards, on tensors, no
trainer. Property tests draw batches with the strategies of ``tests/support/strategies.py``."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from tests.support.strategies import (
    GRID,
    PROPERTY,
    SCALES,
    batches,
    bools,
    expected_zero_std_groups,
    row_values,
)
from trl_zerostd import core

ROLE = core.RowRole


@PROPERTY
@given(data=st.data(), atol=st.sampled_from([0.0, 1e-6, 0.25, 0.5, 1.0]))
def test_zero_std_groups_matches_its_definition(data, atol):
    """True iff the group has < 2 valid non-NaN rows or their max - min <= atol; invalid/NaN rows do not count."""
    batch = data.draw(batches())
    rewards = batch.rewards_per_func[:, 0]
    valid = bools(data.draw, batch.n)
    got = core.zero_std_groups(rewards, valid, batch.num_generations, atol)
    assert torch.equal(got, expected_zero_std_groups(rewards, valid, batch.num_generations, atol))
    # Invalid rows can take any reward without changing the decision.
    noise = row_values(data.draw, batch.n, data.draw(SCALES))
    assert torch.equal(
        core.zero_std_groups(torch.where(valid, rewards, noise), valid, batch.num_generations, atol), got
    )


@PROPERTY
@given(data=st.data(), scale=st.floats(0.01, 100))
def test_zero_std_groups_ignores_positive_rescaling_at_atol_zero(data, scale):
    """With atol=0 the decision is the same for ``rewards`` and ``scale * rewards`` (quarter-grid rewards)."""
    batch = data.draw(batches(scales=GRID))
    rewards, valid, g = batch.rewards_per_func[:, 0], bools(data.draw, batch.n), batch.num_generations
    assert torch.equal(
        core.zero_std_groups(rewards * scale, valid, g, 0.0), core.zero_std_groups(rewards, valid, g, 0.0)
    )


def test_zero_std_groups_cases():
    """Tie, spread, spread within atol, one valid row, NaN rewards, and invalid rows, one group each (G=3)."""
    nan = math.nan
    groups = [
        [2.0, 2.0, 2.0],  # tie -> True
        [0.0, 1.0, 1.0],  # spread 1 -> False
        [0.0, 0.5, 0.25],  # spread 0.5 <= atol 0.5 -> True
        [1.0, nan, nan],  # one valid row -> True
        [1.0, 1.0, nan],  # NaN does not add spread -> True
        [1.0, 1.0, 9.0],  # the 9 is an invalid row -> True
        [1.0, 3.0, 9.0],  # valid rows differ -> False
    ]
    rewards = torch.tensor(groups).view(-1)
    valid = torch.ones(21, dtype=torch.bool)
    valid[17] = False
    got = core.zero_std_groups(rewards, valid, 3, 0.5)
    assert got.tolist() == [True, False, True, True, True, True, False]
    assert core.zero_std_groups(rewards, valid, 3, 0.0).tolist() == [True, False, False, True, True, True, False]
    assert core.zero_std_groups(rewards, torch.zeros(21, dtype=torch.bool), 3, 0.0).all()


def test_widen_reward_range_skips_invalid_and_nan_rewards():
    task = torch.tensor([0.5, math.nan, -3.0, 2.0])
    valid = torch.tensor([True, True, False, True])
    assert core.widen_reward_range(None, task, valid) == (0.5, 2.0)
    assert core.widen_reward_range((0.0, 1.0), task, valid) == (0.0, 2.0)
    assert core.widen_reward_range((0.0, 1.0), task, torch.zeros(4, dtype=torch.bool)) == (0.0, 1.0)


def test_weighted_task_reward_and_unscorable_rows():
    """Weighted NaN-skipping sum; NaN (and unscorable) only where every function gave None."""
    nan = math.nan
    rewards = torch.tensor([[1.0, 2.0], [nan, 2.0], [nan, nan], [0.0, nan]])
    got = core.weighted_task_reward(rewards, torch.tensor([2.0, -1.0]))
    assert got[:2].tolist() == [0.0, -2.0] and got[2].isnan() and got[3].item() == 0.0
    assert core.unscorable_rows(rewards).tolist() == [False, False, True, False]


def test_mismatched_groups():
    assert core.mismatched_groups(["a", "a", "b", "b"], 2) == []
    assert core.mismatched_groups(["a", "b", "b", "b", "c", "c"], 2) == [0]
    assert core.mismatched_groups(["a", "a", "b", "b", "c", "d"], 2) == [2]
    assert core.mismatched_groups(["a", "a", "b", "b"], 4) == [0]
    chat = [[{"role": "user", "content": "1+1="}]] * 2 + [[{"role": "user", "content": "2+2="}]] * 2
    assert core.mismatched_groups(chat, 2) == []
    assert core.mismatched_groups(chat, 4) == [0]
    with pytest.raises(ValueError):
        core.mismatched_groups(["a"] * 5, 2)


def test_grouped_and_expand_groups():
    x = torch.arange(12).view(6, 2)
    assert core.grouped(x, 3).shape == (2, 3, 2)
    assert torch.equal(core.grouped(x, 3)[1, 0], torch.tensor([6, 7]))
    assert core.expand_groups(torch.tensor([True, False]), 3).tolist() == [True] * 3 + [False] * 3
    for bad in (4, 0):
        with pytest.raises(ValueError, match="whole number of groups"):
            core.grouped(torch.arange(6), bad)


def test_truncated_rows():
    """TRL's test: the last token is neither EOS nor pad; an empty completion is not truncated."""
    eos, pad = 1, 0
    rows = [[5, 6, 7], [5, 2, eos], [5, pad], [], [eos]]
    assert core.truncated_rows(rows, [eos, pad]).tolist() == [True, False, False, False, False]


def test_rejected_rows():
    """TRL's sequence_mask rule: exp(sum over loss tokens of old - sampling) outside [clip_min, clip_max]; NaN
    sampling log-probs count 0; masked tokens do not count."""
    old = torch.tensor([[-1.0, -1.0], [-1.0, -1.0], [-1.0, -1.0], [-1.0, -1.0]])
    sampling = torch.tensor([[-1.0, -1.0], [-3.0, -1.0], [0.0, math.nan], [-9.0, 0.0]])
    mask = torch.tensor([[1, 1], [1, 1], [1, 1], [0, 1]])
    # log ratios: 0, 2, -1, -1 -> ratios 1, 7.4, 0.37, 0.37
    assert core.rejected_rows(old, sampling, mask, None, 3.0).tolist() == [False, True, False, False]
    assert core.rejected_rows(old, sampling, mask, 0.5, None).tolist() == [False, False, True, True]
    assert not core.rejected_rows(old, sampling, mask, None, None).any()


def test_check_groups_share_prompt_names_the_first_mixed_group():
    core.check_groups_share_prompt(["a", "a", "b", "b"], 2)
    with pytest.raises(ValueError, match=r"Group\(s\) \[1\] .*rows 2\.\.3.*num_generations=2"):
        core.check_groups_share_prompt(["a", "a", "b", "c"], 2)


def test_the_decisive_sum_is_over_the_named_functions_and_nan_where_each_gave_none():
    rewards = torch.tensor([[1.0, 0.5], [float("nan"), 1.0], [float("nan"), float("nan")]])
    decisive = core.decisive_functions(["answer", "format"], ["answer"])
    assert decisive.tolist() == [True, False]
    task = core.weighted_task_reward(rewards, torch.tensor([2.0, 1.0]), decisive)
    assert task[0] == 2.0 and torch.isnan(task[1:]).all()
    assert core.decisive_functions(["answer"], None) is None
