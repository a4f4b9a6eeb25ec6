"""Prompt skipping's predictor: the chance that a prompt's next group is informative, from what its earlier groups
gave (``SuccessRates``): a per-prompt success rate over its recent groups, Beta-distributed around its group's rate
(a ``skip_prior_key`` value), mixed with the chance that the prompt is stuck (ties on one side in every group). A
prompt's failures fade as its group's rate rises above what it was when the prompt was last measured, its successes
as the rate falls below it.

No trainer or TRL import. Prompts are seen through history slots (``skipping.PromptSkipper`` maps prompts to them);
``G = num_generations``.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

import torch

SUCCESS_DECAY = 0.5  # each new group of a prompt halves the weight of its earlier ones
RATE_PRIOR_ROWS = 4.0  # the group's rate weighs as much as this many rows of the prompt's own
GROUP_RATE_PRIOR_ROWS = 2.0  # a group's rate starts at 0.5 weighing this many rows (Laplace's rule)
RATE_CLAMP = 0.01  # a group's rate is kept in [RATE_CLAMP, 1 - RATE_CLAMP], so that both Beta parameters are > 0
DRAW_POWER = 2.0  # draw prob = (P(informative) / a fresh prompt's of the best group) ** DRAW_POWER
STUCK_PRIOR = 0.1  # prior probability that a prompt ties on one side in every group (never solved, always solved)
PRIOR_DECAY = 0.9  # per generation batch: a group's rate looks back ~10 batches
EVIDENCE_FADE = 0.0  # stale evidence weighs (odds ratio of its group's rate then and now) ** EVIDENCE_FADE; 0: it
# never fades (1 ranked the probes better, and did not pay: docs/studies/revisited_prompts.md)


class Outcome(IntEnum):
    """What one group of a prompt gave."""

    INFORMATIVE = 0
    ALL_LOW = 1  # zero-variance, tied nearer the lowest task reward seen in training (binary verifier: all wrong)
    ALL_HIGH = 2  # zero-variance, tied nearer the highest (binary verifier: all right)


def dense_ids(values: list) -> tuple[torch.Tensor, int]:
    """``(len(values),)`` long: each value's index among the distinct values in order of first appearance; and how
    many distinct values there are."""
    index: dict = {}
    ids = torch.tensor([index.setdefault(value, len(index)) for value in values], dtype=torch.long)
    return ids, len(index)


def informative_prob(successes: torch.Tensor, failures: torch.Tensor, group_size: int | torch.Tensor) -> torch.Tensor:
    """``(k,)`` probability that a group of ``group_size`` rows (an int, or ``(k,)``) is informative (not all
    successes, not all failures) when each row succeeds with a rate ``q ~ Beta(successes, failures)`` (both > 0):
    the beta-binomial's ``1 - E[q ** G] - E[(1 - q) ** G]``."""
    a, b = successes.double(), failures.double()
    log_total = torch.lgamma(a + b) - torch.lgamma(a + b + group_size)
    all_successes = torch.exp(torch.lgamma(a + group_size) - torch.lgamma(a) + log_total)
    all_failures = torch.exp(torch.lgamma(b + group_size) - torch.lgamma(b) + log_total)
    return (1 - all_successes - all_failures).clamp(min=0)


def stuck_prob(
    successes: torch.Tensor, failures: torch.Tensor, one_sided: torch.Tensor, split: torch.Tensor
) -> torch.Tensor:
    """``(k,)`` posterior probability that a prompt is stuck, i.e. ties on one side in every group, after its groups
    gave ``one_sided`` rows (``(k,)``: + all successes, - all failures) and nothing else (``split`` ``(k,)`` bool
    False; True: it split a group, or tied on both sides).

    A mixture: stuck with probability ``STUCK_PRIOR``, else a success rate ``q ~ Beta(successes, failures)`` (the
    prompt's prior, both > 0) under which ``R`` rows all fail with probability ``B(a, b + R) / B(a, b)`` (all succeed:
    ``B(a + R, b) / B(a, b)``). A prompt that split is not stuck; a prompt never drawn is stuck with the prior's."""
    a, b, rows = successes.double(), failures.double(), one_sided.double()
    high, low = rows.clamp(min=0), (-rows).clamp(min=0)
    log_beta = torch.lgamma(a) + torch.lgamma(b) - torch.lgamma(a + b)
    log_high = torch.lgamma(a + high) + torch.lgamma(b) - torch.lgamma(a + b + high)
    log_low = torch.lgamma(a) + torch.lgamma(b + low) - torch.lgamma(a + b + low)
    variable = (1 - STUCK_PRIOR) * torch.exp(log_high + log_low - 2 * log_beta)  # one of high, low is 0
    stuck = STUCK_PRIOR / (STUCK_PRIOR + variable)
    return torch.where(split, 0.0, stuck)


def beta_params(prior: torch.Tensor, successes: torch.Tensor, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(k,)`` ``Beta`` parameters of a success rate: ``prior`` successes of ``RATE_PRIOR_ROWS`` rows, plus
    ``successes`` of ``rows`` (all ``(k,)``)."""
    failures = (rows - successes).clamp(min=0)
    return prior + successes, RATE_PRIOR_ROWS - prior + failures


@dataclass
class SuccessRates:
    """Prompt skipping's predictor. Per history slot: the successes and valid rows of its groups, each new group
    of the prompt halving the weight of its earlier ones (``SUCCESS_DECAY``); per group of slots (a ``skip_prior_key``
    value; one group without it): the same over about the last 10 generation batches (``PRIOR_DECAY``), from 0.5
    weighing ``GROUP_RATE_PRIOR_ROWS`` rows. A prompt's success rate is ``Beta``: its group's rate weighing
    ``RATE_PRIOR_ROWS`` rows, plus its own counts. It tells 4 right of 8 from 7 of 8.

    Its own counts weigh at most ``2 G`` rows (they halve with each group), so they alone never outweigh the prior: a
    prompt that ties in every group would keep being drawn at the rate of a prompt of its group that tied lately.
    So each slot also counts the rows of its groups while they all tied on one side (``one_sided``), and the
    prediction is a mixture (``stuck_prob``): stuck, tying forever, or drawing from its Beta. A prompt that tied
    pass after pass falls to the floor within a few groups; one that split once is never stuck, and is drawn as
    its success rate says (at least as often as without the mixture). The chance that its next group is informative
    is ``(1 - P(stuck)) * P_beta(informative)``; it is drawn with probability ``(that / P_best) ** DRAW_POWER``,
    ``P_best`` a never-drawn prompt's of the best group, never below ``min_draw_prob``.

    A prompt's own evidence (its counts and its one-sided rows) was measured on the policy of its last group. With
    ``evidence_fade`` above 0, as training moves its group's rate, the part of it that the move makes stale weighs
    less (``evidence_weights``): its failures once the rate has risen, its successes once it has fallen, so a prompt
    stuck all wrong while its level was out of reach is measured again once the level's rate has risen. The package
    keeps it at 0 (``EVIDENCE_FADE``): the fade ranked the study's probes better, and paid neither on the spread task
    nor on the real model; the studies' replays set it. A level rarely drawn drifts toward 0.5 (``group_rates``),
    which brings back its prompts. 29 bytes a slot."""

    group_size: int
    successes: torch.Tensor  # (num_slots,) float32
    rows: torch.Tensor  # (num_slots,) float32
    groups: torch.Tensor  # (num_slots,) long
    group_counts: torch.Tensor  # (num_groups, 2) float64: decayed successes and valid rows
    one_sided: torch.Tensor  # (num_slots,) float32: rows of its all-high groups (+), or of its all-low groups (-)
    split: torch.Tensor  # (num_slots,) bool: it split a group, or tied on both sides (``one_sided`` then unused)
    recorded_rates: torch.Tensor  # (num_slots,) float64: its group's success rate after its last group was recorded
    evidence_fade: float = EVIDENCE_FADE

    @classmethod
    def new(cls, group_size: int, num_slots: int, group_values: list | None = None) -> SuccessRates:
        """``group_values``: one hashable value per slot (None: one group)."""
        if group_values is None:
            groups, num_groups = torch.zeros(num_slots, dtype=torch.long), 1
        else:
            groups, num_groups = dense_ids(group_values)
        counts = torch.zeros(num_slots, dtype=torch.float32)
        group_counts = torch.zeros(num_groups, 2, dtype=torch.float64)
        split = torch.zeros(num_slots, dtype=torch.bool)
        recorded_rates = torch.full((num_slots,), 0.5, dtype=torch.float64)
        return cls(group_size, counts, counts.clone(), groups, group_counts, counts.clone(), split, recorded_rates)

    def record(self, slots: torch.Tensor, outcomes: torch.Tensor, successes: torch.Tensor, rows: torch.Tensor) -> None:
        """One generation batch's groups, in draw order (a slot drawn twice counts twice): ``Outcome``, successes
        and valid rows of each; a group with no valid row changes nothing. A slot's earlier evidence is first
        weighed (``weighed_evidence``), so that it does not return to full weight with the new group."""
        counted = rows > 0
        slots, outcomes, successes, rows = slots[counted], outcomes[counted], successes[counted], rows[counted]
        recorded = slots.unique()
        for evidence, weighed in zip(
            (self.successes, self.rows, self.one_sided), self.weighed_evidence(recorded), strict=True
        ):
            evidence[recorded] = weighed.float()
        self.group_counts *= PRIOR_DECAY
        for slot, outcome, success, row_count in zip(
            slots.tolist(), outcomes.tolist(), successes.tolist(), rows.tolist(), strict=True
        ):
            self.successes[slot] = SUCCESS_DECAY * self.successes[slot] + success
            self.rows[slot] = SUCCESS_DECAY * self.rows[slot] + row_count
            side = {Outcome.ALL_HIGH: 1.0, Outcome.ALL_LOW: -1.0}.get(Outcome(outcome), 0.0)
            if side == 0.0 or float(self.one_sided[slot]) * side < 0:
                self.split[slot] = True
            self.one_sided[slot] += side * row_count
        self.group_counts.index_add_(0, self.groups[slots], torch.stack([successes, rows], dim=1).double())
        self.recorded_rates[slots] = self.group_rates()[self.groups[slots]]

    def group_rates(self) -> torch.Tensor:
        """``(num_groups,)`` each group's success rate, ``(successes + 1) / (rows + 2)`` over its decayed counts
        (``GROUP_RATE_PRIOR_ROWS``), in ``[RATE_CLAMP, 1 - RATE_CLAMP]``. Why not the ratio alone: a group judged from
        a group or two of rows (all wrong, say) is drawn at the floor, so its counts only decay and a ratio would stay
        where it was for the rest of the run; with the prior, its rate returns toward 0.5 as its evidence ages, and it
        is measured again (docs/studies/real_model.md)."""
        successes, rows = self.group_counts.unbind(1)
        rates = (successes + GROUP_RATE_PRIOR_ROWS / 2) / (rows + GROUP_RATE_PRIOR_ROWS)
        return rates.clamp(RATE_CLAMP, 1 - RATE_CLAMP)

    def evidence_weights(self, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(k,)`` float64 in (0, 1] each: how much each slot's successes and its failures weigh now. Where its
        group's success rate has risen since the slot was last recorded, its failures weigh the odds ratio (< 1)
        between the rate then and now, to the power ``evidence_fade`` (a rate from 0.1 to 0.3: 0.26), and its
        successes 1; where the rate has fallen, the other way round. Why the group's rate and not time: the rate
        moves as training changes what the policy solves, and only then is a prompt's old outcome stale; a run whose
        rates hold still keeps its evidence, and a rising rate makes old successes likelier, not staler."""
        now = self.group_rates()[self.groups[slots]]
        then = self.recorded_rates[slots].clamp(RATE_CLAMP, 1 - RATE_CLAMP)
        change = torch.logit(now) - torch.logit(then)
        fade = lambda log_odds_ratio: torch.exp(-self.evidence_fade * log_odds_ratio.clamp(min=0))  # noqa: E731
        return fade(-change), fade(change)

    def weighed_evidence(self, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(k,)`` float64 each: every slot's successes, valid rows and one-sided rows, its successes and failures
        (and the rows of its all-high and all-low ties) weighed by ``evidence_weights``."""
        success_weights, failure_weights = self.evidence_weights(slots)
        successes = self.successes[slots].double()
        failures = (self.rows[slots].double() - successes).clamp(min=0)
        one_sided = self.one_sided[slots].double()
        successes, failures = success_weights * successes, failure_weights * failures
        one_sided = one_sided * torch.where(one_sided > 0, success_weights, failure_weights)
        return successes, successes + failures, one_sided

    def beta(self, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(k,)`` float64 ``Beta`` parameters of each slot's prompt's success rate: its group's rate weighing
        ``RATE_PRIOR_ROWS`` rows, plus its own decayed successes and failures (``weighed_evidence``)."""
        prior = RATE_PRIOR_ROWS * self.group_rates()[self.groups[slots]]
        successes, rows, _ = self.weighed_evidence(slots)
        return beta_params(prior, successes, rows)

    def informative_prob(self, slots: torch.Tensor) -> torch.Tensor:
        """``(k,)`` predicted probability that the next group of each slot's prompt is informative: not stuck, and
        informative by its success rate's ``Beta``, each from its ``weighed_evidence``."""
        prior = RATE_PRIOR_ROWS * self.group_rates()[self.groups[slots]]
        successes, rows, one_sided = self.weighed_evidence(slots)
        not_stuck = 1 - stuck_prob(prior, RATE_PRIOR_ROWS - prior, one_sided, self.split[slots])
        return not_stuck * informative_prob(*beta_params(prior, successes, rows), self.group_size)

    def draw_prob(self, slots: torch.Tensor, min_draw_prob: float) -> torch.Tensor:
        """``(k,)`` probability of drawing each slot's prompt."""
        rates = self.group_rates()
        fresh = informative_prob(RATE_PRIOR_ROWS * rates, RATE_PRIOR_ROWS * (1 - rates), self.group_size)
        best = (1 - STUCK_PRIOR) * fresh.max()
        return ((self.informative_prob(slots) / best) ** DRAW_POWER).clamp(min_draw_prob, 1.0)

    def clear(self, slots: torch.Tensor) -> None:
        self.successes[slots], self.rows[slots], self.one_sided[slots], self.split[slots] = 0.0, 0.0, 0.0, False
        self.recorded_rates[slots] = 0.5

    def state_dict(self) -> dict:
        return {
            "successes": self.successes,
            "rows": self.rows,
            "group_counts": self.group_counts,
            "one_sided": self.one_sided,
            "split": self.split,
            "recorded_rates": self.recorded_rates,
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore ``state_dict``'s; a checkpoint of another dataset or ``skip_prior_key`` is refused. A checkpoint
        without ``recorded_rates`` takes each slot's group rate at the checkpoint: its evidence weighs fully until the
        rates move."""
        if state["group_counts"].shape != self.group_counts.shape or len(state["successes"]) != len(self.successes):
            raise ValueError(
                "The checkpoint's prompt-skip success rates do not match this run's: the train_dataset, "
                "skip_history_key or skip_prior_key (or the number of its values) differs from the checkpointed run's."
            )
        self.successes, self.rows = state["successes"].float(), state["rows"].float()
        self.group_counts = state["group_counts"].double()
        self.one_sided, self.split = state["one_sided"].float(), state["split"].bool()
        recorded_rates = state.get("recorded_rates")
        if recorded_rates is None:
            recorded_rates = self.group_rates()[self.groups]
        self.recorded_rates = recorded_rates.double()
