"""Per-prompt rollout budgets, the pure part: how many more completions each prompt of a batch gets, from what its
completions so far gave and what was known of it before (``per_prompt_budgets``).

A prompt is sampled ``step`` completions at a time, up to ``G = num_generations``:

- its completions differ in task reward: the group is informative, and it is completed to ``G`` (its advantages
  then come from as many rows as TRL's);
- they all tie: its success rate ``q ~ Beta(a + s, b + f)`` (``a, b``: the prior, the prompt's predicted success rate
  under ``skip_predictor="success_rate"``, else uniform; ``s, f``: the tie's successes and failures) says how likely
  the ``G - n`` completions it could still get are to break the tie. Under the ``"chance"`` rule it gets ``step``
  more while that chance is at least ``continue_prob``; under ``"yield"`` it is completed to ``G`` when that chance
  per completion is at least what earlier batches got per completion (``yield_continue_prob``): two rounds in one
  process. Else it stops, a group of ``n`` tied rows and ``G - n`` empty slots.

A round's rows are a multiple of the world size (every rank generates as many): the rows that takes go to ties
(``even_over_ranks``), and a tie they break is completed in one more round.

No trainer or TRL import.
"""

from __future__ import annotations

import torch

from .success_rate import informative_prob

UNIFORM_PRIOR = (1.0, 1.0)  # Beta(1, 1): a prompt nothing is known of
CONTINUE_PROB = 0.5  # the "chance" rule's threshold when budget_continue_prob is None


def tie_break_prob(
    prior_a: torch.Tensor, prior_b: torch.Tensor, successes: torch.Tensor, rows: torch.Tensor, remaining: torch.Tensor
) -> torch.Tensor:
    """``(k,)`` probability that ``remaining`` ``(k,)`` more completions of each prompt break its tie. ``rows``
    ``(k,)``: valid completions so far; ``successes``: their task rewards rescaled to [0, 1] over the range seen,
    summed (budgets read rewards as pass/fail levels); success rate ``q ~ Beta(prior_a + successes, prior_b + rows -
    successes)``. Tied nearer failure (mean level at most 1/2) it is the chance of a success, ``1 - E[(1 - q) **
    remaining] = 1 - B(a, b + remaining) / B(a, b)``; nearer success, of a failure; with no valid row yet, of both
    (``informative_prob``)."""
    a = prior_a.double() + successes.double()
    b = prior_b.double() + (rows - successes).double()
    remaining = remaining.double()
    tied_high = 2 * successes > rows
    same, other = torch.where(tied_high, a, b), torch.where(tied_high, b, a)
    stays = torch.lgamma(same + remaining) + torch.lgamma(same + other) - torch.lgamma(same)
    stays = torch.exp(stays - torch.lgamma(same + other + remaining))
    both = informative_prob(a, b, remaining)
    return torch.where(rows > 0, 1 - stays, both).clamp(0, 1)


def yield_continue_prob(room: torch.Tensor, informative_rate: float, group_size: int) -> torch.Tensor:
    """``(k,)`` the least chance of breaking its tie at which a tied prompt is worth the ``room`` ``(k,)`` completions
    it could still get: a tie that breaks is one informative group, so its yield is ``break_prob / room``
    informative groups per completion, and it goes on when that is at least the ``informative_rate`` (informative
    groups per ``group_size`` completions generated, over earlier batches) over ``group_size``. Spending where the
    yield is at least the average raises the average (informative groups per completion). While no informative
    group has been seen (rate 0), every tie is completed."""
    return (room.double() * informative_rate / group_size).clamp(max=1)


def next_copies(
    rows: torch.Tensor,
    informative: torch.Tensor,
    break_prob: torch.Tensor,
    group_size: int,
    step: int,
    continue_prob: float | torch.Tensor,
) -> torch.Tensor:
    """``(k,)`` long: completions each prompt gets in the next round, from ``rows`` ``(k,)`` generated so far (valid or
    not), ``informative`` ``(k,)`` bool (its completions differ) and ``break_prob`` ``(k,)`` (``tie_break_prob`` over
    every completion it could still get): an informative prompt is completed to ``group_size``; a tied one gets
    ``step`` more (at most to ``group_size``) while ``break_prob >= continue_prob`` (a number, or ``(k,)``: one per
    prompt); 0 once full or stopped."""
    room = (group_size - rows).clamp(min=0)
    tied_more = torch.where(break_prob >= continue_prob, room.clamp(max=step), 0)
    return torch.where(informative, room, tied_more)


def even_over_ranks(
    copies: torch.Tensor, room: torch.Tensor, informative: torch.Tensor, world_size: int
) -> torch.Tensor:
    """``copies`` ``(k,)`` made a multiple of ``world_size`` in total, so that every rank generates as many rows: the
    rows missing go to tied prompts with room left (``room`` ``(k,)``: completions a prompt may still get), those
    asked for first, then those stopped, as many to each as fits, in order; a tie given more only gathers more
    evidence. Always possible when every earlier round was even and the batch is (``room`` sums to a multiple of
    ``world_size``): an informative prompt is never cut short."""
    copies = copies.clone()
    missing = (-int(copies.sum())) % world_size
    spare = room - copies
    asked, stopped = ~informative & (copies > 0), ~informative & (copies == 0)
    for i in torch.cat([asked.nonzero().view(-1), stopped.nonzero().view(-1)]).tolist():
        if missing == 0:
            break
        extra = min(missing, int(spare[i]))
        copies[i] += extra
        missing -= extra
    if missing:
        raise ValueError(
            f"{int(copies.sum())} rows cannot be made a multiple of {world_size} ranks within the room left."
        )
    return copies
