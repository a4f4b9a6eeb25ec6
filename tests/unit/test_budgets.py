"""Per-prompt budgets, the pure part (``trl_zerostd/budgets.py``): the chance that a tie breaks, how many completions
each prompt gets next, and the rows of a round split evenly over ranks."""

from __future__ import annotations

import pytest
import torch

from trl_zerostd.budgets import even_over_ranks, next_copies, tie_break_prob, yield_continue_prob


def test_a_uniform_prior_breaks_a_tie_of_k_with_m_more_rows_with_probability_m_over_k_plus_m_plus_1():
    """Beta(1, 1), k failures: P(a success in m more) = 1 - (k + 1) / (k + m + 1), at either end (symmetric)."""
    ones = torch.ones(4, dtype=torch.float64)
    rows = torch.tensor([2.0, 2.0, 4.0, 4.0])
    remaining = torch.tensor([6, 6, 4, 4])
    successes = torch.tensor([0.0, 2.0, 0.0, 4.0])  # tied at failure, at success, ...
    probs = tie_break_prob(ones, ones, successes, rows, remaining)
    expected = 1 - (rows + 1) / (rows + remaining + 1)
    torch.testing.assert_close(probs, expected.double())


def test_the_tie_break_probability_matches_sampling():
    """Against Monte Carlo: q ~ Beta(a + s, b + f), then m Bernoulli(q) rows, one differing from the tie."""
    generator = torch.Generator().manual_seed(0)
    a, b, rows, successes, m = 0.4, 3.6, 2.0, 0.0, 6  # a level solved 1 time in 10, tied at failure
    q = torch.distributions.Beta(torch.tensor(a + successes), torch.tensor(b + rows - successes)).sample((200_000,))
    draws = torch.rand(200_000, m, generator=generator) < q.unsqueeze(1)
    sampled = draws.any(dim=1).double().mean()
    exact = tie_break_prob(torch.tensor([a]), torch.tensor([b]), torch.tensor([successes]), torch.tensor([rows]),
                           torch.tensor([m]))  # fmt: skip
    assert abs(exact.item() - sampled.item()) < 0.01
    assert exact.item() < 0.5  # a hard level's tie stops where a uniform prior's (0.667) goes on


def test_an_informative_prompt_is_completed_and_a_tie_goes_on_only_while_likely_to_break():
    rows = torch.tensor([2, 2, 2, 8, 6])
    informative = torch.tensor([True, False, False, True, False])
    break_prob = torch.tensor([0.0, 0.7, 0.3, 0.0, 0.9])
    copies = next_copies(rows, informative, break_prob, group_size=8, step=2, continue_prob=0.5)
    assert copies.tolist() == [6, 2, 0, 0, 2]
    assert next_copies(rows, informative, break_prob, 8, 4, 0.0).tolist() == [6, 4, 4, 0, 2]  # 0: all go on
    assert next_copies(rows, informative, break_prob, 8, 2, 1.0).tolist() == [6, 0, 0, 0, 0]  # 1: no tie goes on


def test_a_tie_with_no_valid_row_breaks_only_with_both_outcomes_and_a_high_tie_reads_its_level():
    """No valid row yet: the chance that the rest holds a success and a failure (uniform, 4 more: 1 - 2/5). A tie at
    0.7 of the range (partial credit) is read from its high side, the mirror of a tie at 0.3 (the chance of a lower
    row, 0.85; read from the failure side it would be the chance of a higher one, 0.96)."""
    ones = torch.ones(1, dtype=torch.float64)
    none_valid = tie_break_prob(ones, ones, torch.zeros(1), torch.zeros(1), torch.tensor([4]))
    torch.testing.assert_close(none_valid, torch.tensor([0.6], dtype=torch.float64))
    high = tie_break_prob(ones, ones, torch.tensor([1.4]), torch.tensor([2.0]), torch.tensor([6]))
    low = tie_break_prob(ones, ones, torch.tensor([0.6]), torch.tensor([2.0]), torch.tensor([6]))
    torch.testing.assert_close(high, low)
    assert high.item() < 0.9


def test_a_round_is_made_even_over_ranks_with_rows_for_ties_never_cutting_an_informative_prompt():
    informative = torch.tensor([True, False, False, False])
    room = torch.tensor([2, 6, 2, 4])
    copies = torch.tensor([2, 2, 0, 0])  # the informative prompt completed, a tie goes on, two stopped
    assert even_over_ranks(copies, room, informative, 1).tolist() == [2, 2, 0, 0]
    assert even_over_ranks(copies, room, informative, 3).tolist() == [2, 4, 0, 0]  # the tie asked for first
    assert even_over_ranks(copies, room, informative, 8).tolist() == [2, 6, 0, 0]
    assert even_over_ranks(copies, torch.tensor([2, 2, 2, 4]), informative, 8).tolist() == [2, 2, 2, 2]
    for world in (2, 3, 4, 5, 7):
        room = torch.tensor([2, 6, 3, 3])  # 14 rows left ...
        copies = even_over_ranks(torch.tensor([2, 2, 0, 1]), room, informative, world)
        assert int(copies.sum()) % world == 0 and copies[0] == 2 and bool((copies <= room).all())
    with pytest.raises(ValueError, match="multiple of 8 ranks"):
        even_over_ranks(torch.tensor([2, 1]), torch.tensor([2, 2]), torch.tensor([True, False]), 8)


def test_the_yield_rule_goes_on_with_a_tie_whose_chance_per_completion_beats_the_rate_seen():
    """Earlier batches made 0.4 informative groups per G = 8 completions: a tie with 6 completions left must break
    with chance >= 6 * 0.4 / 8 = 0.3 to go on, with 2 left >= 0.1; no batch yet (rate 0) completes every tie; a
    threshold never exceeds 1."""
    room = torch.tensor([6, 2, 0])
    torch.testing.assert_close(yield_continue_prob(room, 0.4, 8), torch.tensor([0.3, 0.1, 0.0], dtype=torch.float64))
    assert yield_continue_prob(room, 0.0, 8).eq(0).all()
    assert yield_continue_prob(torch.tensor([8]), 2.0, 8).item() == 1.0
    rows, informative = torch.tensor([2, 2, 2]), torch.tensor([False, False, True])
    threshold = yield_continue_prob(8 - rows, 0.4, 8)
    copies = next_copies(rows, informative, torch.tensor([0.31, 0.29, 0.0]), 8, 8, threshold)
    assert copies.tolist() == [6, 0, 6]  # the likely tie and the informative prompt are completed at once
