"""Per-prompt rollout budgets, the pure part: how many more completions each prompt of a batch gets, from what its
completions so far gave and what was known of it before (``per_prompt_budgets``).

A prompt is sampled ``step`` completions at a time, up to ``G = num_generations``:

- its completions differ in task reward: the group is informative, and it is completed to ``G`` (its advantages
  then come from as many rows as TRL's);
- they all tie: its success rate ``q ~ Beta(a + s, b + f)`` (``a, b``: the prior, the prompt's predicted success rate
  under ``skip_predictor="success_rate"``, else uniform; ``s, f``: the tie's successes and failures) says how likely
  the ``G - n`` completions it could still get are to break the tie; it gets ``step`` more while that chance is at
  least ``continue_prob``, else it stops, a group of ``n`` tied rows and ``G - n`` empty slots.

No trainer or TRL import.
"""

from __future__ import annotations

import torch

UNIFORM_PRIOR = (1.0, 1.0)  # Beta(1, 1): a prompt nothing is known of


def tie_break_prob(
    prior_a: torch.Tensor, prior_b: torch.Tensor, successes: torch.Tensor, rows: torch.Tensor, remaining: torch.Tensor
) -> torch.Tensor:
    """``(k,)`` probability that ``remaining`` ``(k,)`` more completions of each prompt hold one whose outcome differs
    from its tie: ``rows`` ``(k,)`` tied completions so far, ``successes`` of them (``rows`` when tied at success, 0 at
    failure), success rate ``q ~ Beta(prior_a + successes, prior_b + rows - successes)``. Tied at failure it is the
    chance of a success, ``1 - E[(1 - q) ** remaining] = 1 - B(a, b + remaining) / B(a, b)``; at success, of a
    failure."""
    a = prior_a.double() + successes.double()
    b = prior_b.double() + (rows - successes).double()
    tied_high = successes >= rows
    same, other = torch.where(tied_high, a, b), torch.where(tied_high, b, a)
    remaining = remaining.double()
    stays = torch.lgamma(same + remaining) + torch.lgamma(same + other) - torch.lgamma(same)
    stays = torch.exp(stays - torch.lgamma(same + other + remaining))
    return (1 - stays).clamp(0, 1)


def next_copies(
    rows: torch.Tensor,
    informative: torch.Tensor,
    break_prob: torch.Tensor,
    group_size: int,
    step: int,
    continue_prob: float,
) -> torch.Tensor:
    """``(k,)`` long: completions each prompt gets in the next round, from ``rows`` ``(k,)`` generated so far (valid or
    not), ``informative`` ``(k,)`` bool (its completions differ) and ``break_prob`` ``(k,)`` (``tie_break_prob`` over
    every completion it could still get): an informative prompt is completed to ``group_size``; a tied one gets
    ``step`` more (at most to ``group_size``) while ``break_prob >= continue_prob``; 0 once full or stopped."""
    room = (group_size - rows).clamp(min=0)
    tied_more = torch.where(break_prob >= continue_prob, room.clamp(max=step), 0)
    return torch.where(informative, room, tied_more)


def even_over_ranks(copies: torch.Tensor, room: torch.Tensor, world_size: int) -> torch.Tensor:
    """``copies`` ``(k,)`` made a multiple of ``world_size`` in total, so that every rank generates as many rows: one
    more for the first prompts with room left (``room`` ``(k,)``: completions a prompt may still get), those asked for
    first; where the room runs short, one less for the last prompts asked for."""
    copies = copies.clone()
    missing = (-int(copies.sum())) % world_size
    if missing == 0:
        return copies
    spare = room - copies
    asked, unasked = (copies > 0) & (spare > 0), (copies == 0) & (spare > 0)
    order = torch.cat([asked.nonzero().view(-1), unasked.nonzero().view(-1)])
    if int(spare[order].clamp(max=1).sum()) >= missing:
        copies[order[:missing]] += 1
        return copies
    extra = int(copies.sum()) % world_size
    for i in reversed(copies.nonzero().view(-1).tolist()):
        taken = min(extra, int(copies[i]))
        copies[i] -= taken
        extra -= taken
        if extra == 0:
            break
    return copies
