"""Dynamic sampling and prompt skipping, the trainer side: a generation batch refilled until it holds only
informative groups, from prompts drawn past those predicted to be zero-variance.

A pure planner: ``BatchRefiller.plan`` opens one batch's ``RefillRounds``, which says what each round generates
(``next_round() -> RoundRequest``: prompts and completions per prompt), reads what came back (``add``: the round's
gathered rows, scored) and hands over the groups that train (``finish() -> RefilledBatch``). It calls nothing of the
trainer: the adapter runs each round through TRL (prompt preparation, ``_generate``, scoring; vLLM, rollout_func and
tools work as in TRL). Round 1 is TRL's own rows (the dataloader's), each further round the next prompts of a seeded
stream over the same data (``PromptStream`` over a map-style dataset's indices, ``RowStream`` over a streaming one's
rows). Every round is a whole sequential decode, so the first one already generates, beside the dataloader's
groups, as many more as the informative rate of earlier batches says the batch will need; a refill round is sized by
the rate of this batch and the earlier ones (decayed counts). Every round's rewards are gathered, so every rank takes
the same decisions. The groups that train are chosen on the gathered batch.

With prompt skipping every prompt of the batch comes from the stream (the dataloader only paces the steps), which
skips a prompt as its ``PromptSkipper`` predicts; every group generated goes into the skipper's history. Without
dynamic sampling there is one round of exactly the batch's groups. With a screen (``dynamic_sampling_screen``,
SPEED-style) every prompt comes from the stream too, and a round screens new prompts with a few rows each while
completing, in the same decode pass, the groups of the earlier screens whose rows differed (``sampling.
plan_screen_round``); a group that trains is its screen's rows then the rest's. With per-prompt budgets
(``per_prompt_budgets``, without dynamic sampling) the batch's prompts come from the stream and each round asks each
prompt for as many more completions as ``budgets.next_copies`` says; a group that stops short keeps empty slots.
"""

from __future__ import annotations

import logging
from collections.abc import Generator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from . import core
from .budgets import CONTINUE_PROB, UNIFORM_PRIOR, even_over_ranks, next_copies, tie_break_prob, yield_continue_prob
from .config import ZeroStdArguments
from .rounds import GatheredRows, GeneratedPool, RefilledBatch, RoundPart, RoundRequest, Screened
from .sampling import (
    PromptStream,
    RowStream,
    choose_groups,
    drawn_places,
    first_round_extra,
    plan_screen_round,
    rank_rows,
    refill_groups,
)
from .skipping import GroupsOfOneSize, PromptSkipper, group_successes

if TYPE_CHECKING:
    from datasets import Dataset

logger = logging.getLogger("trl_zerostd")
# a fill's rounds: it yields requests, gets their gathered rows, returns (rounds, (informative, generated))
Rounds = Generator[RoundRequest, list[GatheredRows], tuple[int, tuple[int, int]]]
RATE_DECAY = 0.9  # per generation batch: the informative rate a refill or a budget reads looks back ~10 batches


@dataclass
class BatchRefiller:
    """The refill of a run: its settings, the prompt ``stream`` (with a map-style dataset, ``dataset`` gives the
    rows of its indices), the ``skipper`` (the prompt histories: prompt skipping, budgets) and the decayed
    ``(informative, generated)`` group counts of earlier batches (screened: ``(passed, screened)`` screens;
    budgets: informative groups and completions over ``G``). Built by ``state.build_state``."""

    settings: ZeroStdArguments
    stream: PromptStream | RowStream
    dataset: Dataset | None
    num_generations: int
    world_size: int
    rank: int
    skipper: PromptSkipper | None = None
    informative_history: tuple[float, float] = (0.0, 0.0)
    cap_warned: bool = False

    def plan(self, inputs: list[dict], reward_range: tuple[float, float] | None) -> RefillRounds:
        """The rounds of one batch: until the gathered batch holds ``N // G`` informative groups or the round cap is
        reached (one round without dynamic sampling). ``inputs``: this rank's dataloader rows; ``reward_range``: the
        task-reward range seen before this batch (the skip outcomes are decided against it)."""
        return RefillRounds(self._rounds(inputs, reward_range))

    def _rounds(self, inputs: list[dict], reward_range) -> Generator[RoundRequest, list[GatheredRows], RefilledBatch]:
        world, G, dynamic = self.world_size, self.num_generations, self.settings.dynamic_sampling
        needed = len(inputs) * world // G
        pool = GeneratedPool()
        metrics: dict[str, float] = {}
        if dynamic and self.settings.dynamic_sampling_screen:
            rounds, (informative, generated) = yield from self._fill_screened(pool, needed, metrics)
        elif self.settings.per_prompt_budgets:
            rounds, (informative, generated) = yield from self._fill_budgeted(pool, needed, reward_range, metrics)
        else:
            rounds, (informative, generated) = yield from self._fill_whole(pool, inputs, needed)
        if self.skipper is not None:
            metrics.update(self._record_outcomes(pool, reward_range))
        chosen = torch.arange(needed) if pool.slots is None else pool.slots.clamp(min=0)  # an empty slot: group 0's
        if dynamic:
            if informative < needed:
                self._cap_reached(informative, generated, needed)
            chosen = choose_groups(torch.cat(pool.informative), needed)
        row_ids = (chosen.unsqueeze(1) * G + torch.arange(G)).view(-1)
        batch = GatheredRows.concat(pool.groups)
        empty = torch.cat(pool.empty)[row_ids]
        if pool.slots is not None:
            empty |= core.expand_groups(pool.slots < 0, G)
            metrics["prompt_skip/empty_slot_frac"] = (pool.slots < 0).float().mean().item()
        empty = empty.to(batch.truncated.device)
        rewards_per_func = batch.rewards_per_func[row_ids].masked_fill(empty.unsqueeze(1), float("nan"))
        local_ids = row_ids[rank_rows(len(row_ids), world, self.rank)].tolist()
        if dynamic:
            task_rewards = batch.task_rewards
            metrics.update({
                "dynamic_sampling/rounds": rounds,
                "dynamic_sampling/generated_groups": generated,
                "dynamic_sampling/informative_group_frac": informative / generated,
                "dynamic_sampling/dropped_groups": generated - needed,
                "dynamic_sampling/cap_reached": float(informative < needed),
                "dynamic_sampling/generated_reward_mean": torch.nanmean(task_rewards).item(),
            })  # fmt: skip
        return RefilledBatch(
            rows=[dict(batch.rows[i]) for i in local_ids],
            records=[batch.records[i] for i in local_ids],
            logged=[batch.logged[i] for i in local_ids],
            rewards_per_func=rewards_per_func,
            truncated=batch.truncated[row_ids] & ~empty,
            empty=empty,
            metrics=metrics,
        )

    def _fill_whole(self, pool: GeneratedPool, inputs: list[dict], needed: int) -> Rounds:
        """Rounds of whole groups: the first sized by the informative rate of earlier batches (the dataloader's rows
        and more), each refill by this batch's and the earlier ones'. Returns the rounds and ``pool.counts()``."""
        world, G, dynamic = self.world_size, self.num_generations, self.settings.dynamic_sampling
        seen_informative, seen_generated = self.informative_history
        extra = first_round_extra(needed, seen_informative, seen_generated, world, G) if dynamic else 0
        if self.skipper is not None:
            if self.settings.skip_refill:
                rows, keys = self._stream_prompts(pool, needed + extra)
            else:
                rows, keys = self._stream_slots(pool, needed)
            first = [RoundPart.whole(rows, G, keys)]
        else:
            rows, keys = self._stream_prompts(pool, extra)
            first = [RoundPart.rank_rows_of(inputs)] + ([RoundPart.whole(rows, G, keys)] if extra else [])
        parts = yield RoundRequest(first)
        for part, request in zip(parts, first, strict=True):
            pool.add(part, self._informative_groups(part, G), request.keys)
        rounds, (informative, generated) = 1, pool.counts()
        while dynamic and informative < needed and rounds < self.settings.dynamic_sampling_max_rounds:
            count = refill_groups(
                needed - informative, informative + seen_informative, generated + seen_generated, needed, world, G
            )
            rows, keys = self._stream_prompts(pool, count)
            (part,) = yield RoundRequest([RoundPart.whole(rows, G, keys)])
            pool.add(part, self._informative_groups(part, G), keys)
            rounds, (informative, generated) = rounds + 1, pool.counts()
        if dynamic:
            self.informative_history = (
                RATE_DECAY * (seen_informative + informative),
                RATE_DECAY * (seen_generated + generated),
            )
        return rounds, (informative, generated)

    def _fill_screened(self, pool: GeneratedPool, needed: int, metrics: dict) -> Rounds:
        """Rounds planned by ``sampling.plan_screen_round``; every prompt comes from the stream, and the rate a round
        is sized by is the share of screens that differed (``informative_history`` counts screens)."""
        world, G, screen = self.world_size, self.num_generations, self.settings.dynamic_sampling_screen
        max_rounds = self.settings.dynamic_sampling_max_rounds
        seen_passed, seen_screened = self.informative_history
        waiting: list[Screened] = []
        rounds = passed = screened = 0
        while rounds < max_rounds and pool.counts()[0] < needed:
            rounds += 1
            plan = plan_screen_round(
                needed - pool.counts()[0], len(waiting), rounds == max_rounds, seen_passed + passed,
                seen_screened + screened, needed, world, G, screen,
            )  # fmt: skip
            continued, waiting = waiting[: plan.continued], waiting[plan.continued :]
            parts = [("rest", [item.row for item in continued], [item.key for item in continued])]
            parts.append(("whole" if plan.whole else "screen", *self._stream_prompts(pool, plan.new_prompts)))
            parts = [(kind, rows, keys) for kind, rows, keys in parts if rows]
            per_prompt = {"rest": G - screen, "whole": G, "screen": screen}
            request = RoundRequest([RoundPart.whole(rows, per_prompt[kind], keys) for kind, rows, keys in parts])
            generated_parts = yield request
            for (kind, rows, keys), part in zip(parts, generated_parts, strict=True):
                if kind == "rest":
                    rest = G - screen
                    groups = GatheredRows.concat(
                        [piece for i, item in enumerate(continued)
                         for piece in (item.screen, part.take(i * rest, (i + 1) * rest))]
                    )  # fmt: skip
                    pool.add(groups, self._informative_groups(groups, G), keys)
                elif kind == "whole":
                    pool.add(part, self._informative_groups(part, G), keys)
                else:
                    differs = self._informative_groups(part, screen).tolist()
                    passed, screened = passed + sum(differs), screened + len(differs)
                    for i, (row, key, passes) in enumerate(zip(rows, keys, differs, strict=True)):
                        piece = part.take(i * screen, (i + 1) * screen)
                        if passes:
                            waiting.append(Screened(row, key, piece))
                        else:
                            pool.tied_screens.append(piece)
                            pool.tied_screen_keys.append(key)
        pool.unfinished_keys += [item.key for item in waiting]
        if screened:
            metrics["dynamic_sampling/screen_pass_frac"] = passed / screened
        self.informative_history = (RATE_DECAY * (seen_passed + passed), RATE_DECAY * (seen_screened + screened))
        return rounds, pool.counts()

    def _fill_budgeted(self, pool: GeneratedPool, needed: int, reward_range, metrics: dict) -> Rounds:
        """Per-prompt budgets: the batch's ``needed`` prompts from the stream, each sampled ``budget_step`` rows
        first, then as ``budgets.next_copies`` says (``budget_stop_rule``), a round asking every prompt that goes on
        at once; each group is its rows then empty slots up to ``G``. ``informative_history`` counts informative
        groups and completions over ``G``, the rate the ``"yield"`` rule compares with. Returns the rounds and
        ``pool.counts()``."""
        G, settings = self.num_generations, self.settings
        prompts, keys = self._stream_prompts(pool, needed)
        prior = self.skipper.success_prior(keys) if self.skipper is not None else None
        prior_a, prior_b = prior if prior is not None else (torch.full((needed,), a) for a in UNIFORM_PRIOR)
        pieces: list[list[GatheredRows]] = [[] for _ in prompts]
        seen_informative, seen_generated = self.informative_history
        by_yield = settings.budget_stop_rule == "yield"
        step, tie_step = settings.budget_step, G if by_yield else settings.budget_step
        informative_rate = seen_informative / seen_generated if seen_generated > 0 else 0.0
        chance = CONTINUE_PROB if settings.budget_continue_prob is None else settings.budget_continue_prob
        fresh = torch.zeros(needed, dtype=torch.bool)
        copies = even_over_ranks(torch.full((needed,), step), torch.full((needed,), G), fresh, self.world_size)
        rounds = 0
        while int(copies.sum()) > 0:
            asked = copies.nonzero().view(-1).tolist()
            request = RoundPart([prompts[i] for i in asked], tuple(copies[asked].tolist()), [keys[i] for i in asked])
            (part,) = yield RoundRequest([request])
            for i, piece in zip(asked, GatheredRows.split(part, copies[asked].tolist()), strict=True):
                pieces[i].append(piece)
            rounds += 1
            counts = torch.tensor([sum(len(piece.rows) for piece in group) for group in pieces])
            padded = [GatheredRows.concat(group).padded(G) for group in pieces]
            groups = GatheredRows.concat([rows for rows, _ in padded])
            informative = self._informative_groups(groups, G)
            valid = groups.valid()
            low_high = core.widen_reward_range(reward_range, groups.task_rewards, valid) or (0.0, 0.0)
            successes, valid_rows = group_successes(groups.task_rewards, valid, G, low_high)
            break_prob = tie_break_prob(prior_a, prior_b, successes, valid_rows, G - counts)
            continue_prob = yield_continue_prob(G - counts, informative_rate, G) if by_yield else chance
            wanted = next_copies(counts, informative, break_prob, G, tie_step, continue_prob)
            copies = even_over_ranks(wanted, G - counts, informative, self.world_size)
        pool.add(groups, informative, keys, torch.cat([empty for _, empty in padded]))
        self.informative_history = (
            RATE_DECAY * (seen_informative + int(informative.sum())),
            RATE_DECAY * (seen_generated + int(counts.sum()) / G),
        )
        metrics.update({
            "budget/rounds": rounds,
            "budget/seen_informative_rate": informative_rate,
            "budget/completions_per_prompt": counts.float().mean().item(),
            "budget/full_group_frac": (counts == G).float().mean().item(),
            "budget/informative_group_frac": informative.float().mean().item(),
        })  # fmt: skip
        return rounds, pool.counts()

    def _stream_prompts(self, pool: GeneratedPool, count: int) -> tuple[list[dict], list[int]]:
        """The next ``count`` prompts of the stream (the same on every rank) and their skip-history keys; the prompts
        skipped on the way are counted in the pool."""
        if count == 0:
            return [], []
        skipper = self.skipper if self.settings.skip_zero_std_prompts else None  # budgets keep histories, skip none
        draw_prob = skipper.draw_prob if skipper is not None else None
        if isinstance(self.stream, RowStream):
            rows, keys, skipped = self.stream.draw(count, draw_prob)
        else:
            keys, skipped = self.stream.draw(count, draw_prob)
            rows = self._dataset_rows(keys)
        pool.skipped += skipped
        return rows, keys

    def _stream_slots(self, pool: GeneratedPool, count: int) -> tuple[list[dict], list[int]]:
        """``skip_refill=False``: the prompts of the next ``count`` places of the stream that generate
        (``sampling.drawn_places``) and their keys; ``pool.slots`` says which group fills each place, -1 for none."""
        skipper = self.skipper
        assert skipper is not None, "skip_refill=False is a setting of prompt skipping"
        rows: list[dict] | None
        if isinstance(self.stream, RowStream):
            rows, keys, drawn = self.stream.places(count, skipper.draw_prob)
        else:
            keys, drawn = self.stream.places(count, skipper.draw_prob)
            rows = None
        generates = drawn_places(drawn, self.num_generations, self.world_size)
        pool.slots = torch.full((count,), -1, dtype=torch.long)
        pool.slots[generates] = torch.arange(int(generates.sum()))
        pool.skipped += count - int(generates.sum())
        places = generates.nonzero().view(-1).tolist()
        keys = [keys[i] for i in places]
        rows = [rows[i] for i in places] if rows is not None else self._dataset_rows(keys)
        return rows, keys

    def _dataset_rows(self, indices: list[int]) -> list[dict]:
        """The map-style dataset's rows at ``indices`` (the rows a ``PromptStream`` draws)."""
        assert self.dataset is not None, "build_state gives a PromptStream its map-style dataset"
        return [dict(self.dataset[i]) for i in indices]

    def _informative_groups(self, rows: GatheredRows, group_size: int) -> torch.Tensor:
        """``(rows // group_size,)`` bool: groups with two valid rows of different task reward."""
        return ~core.zero_std_groups(rows.task_rewards, rows.valid(), group_size, self.settings.zero_std_atol).cpu()

    def _record_outcomes(self, pool: GeneratedPool, reward_range) -> dict[str, float]:
        """Every generated group's outcome into the skip history (the same on every rank: gathered rewards); a tied
        screen counts as a group of its kind, a screen that differed and was never completed as informative."""
        whole = GatheredRows.concat(pool.groups)
        parts = [(whole, self.num_generations, pool.keys)]
        if pool.tied_screens:
            screens = GatheredRows.concat(pool.tied_screens)
            parts.append((screens, len(screens.rows) // len(pool.tied_screens), pool.tied_screen_keys))
        groups = [GroupsOfOneSize(rows.task_rewards, rows.valid(), size, keys) for rows, size, keys in parts]
        assert self.skipper is not None, "outcomes are recorded only with the prompt histories"
        return self.skipper.record_batch(
            groups, pool.unfinished_keys, pool.skipped, reward_range, self.settings.zero_std_atol
        )

    def _cap_reached(self, informative: int, generated: int, needed: int) -> None:
        cap = self.settings.dynamic_sampling_max_rounds
        situation = (
            f"dynamic_sampling reached dynamic_sampling_max_rounds={cap} with {informative} of the {needed} "
            f"informative groups a batch needs (informative rate {informative / generated:.1%} over {generated} "
            "groups generated)"
        )
        if self.settings.dynamic_sampling_on_cap == "error":
            raise RuntimeError(
                f"{situation}. Raise dynamic_sampling_max_rounds, or set dynamic_sampling_on_cap='mask' to train on "
                "with the batch completed by masked groups."
            )
        if not self.cap_warned and self.rank == 0:
            logger.warning(f"{situation}; the batch is completed with masked groups (logged as "
                           "dynamic_sampling/cap_reached; warned once).")  # fmt: skip
        self.cap_warned = True

    def state_dict(self) -> dict:
        """JSON: the stream's place and the decayed group counts (the skipper's tensors are saved on their own)."""
        return {"prompt_stream": self.stream.state_dict(), "informative_history": list(self.informative_history)}

    def load_state_dict(self, state: dict) -> None:
        self.stream.load_state_dict(state["prompt_stream"])
        self.informative_history = tuple(state["informative_history"])


class RefillRounds:
    """One batch's refill, driven by the adapter::

        rounds = refiller.plan(inputs, reward_range)
        while (request := rounds.next_round()) is not None:
            rounds.add(run_through_trl(request))  # one GatheredRows per part of the request
        refilled = rounds.finish()

    (``run_through_trl``: the adapter's ``_generate_round``.)
    """

    def __init__(self, steps: Generator[RoundRequest, list[GatheredRows], RefilledBatch]):
        self._steps = steps
        self._request: RoundRequest | None = next(steps)
        self._refilled: RefilledBatch | None = None

    def next_round(self) -> RoundRequest | None:
        return self._request

    def add(self, parts: list[GatheredRows]) -> None:
        if self._request is None:
            raise RuntimeError("The refill asked for no more rounds.")
        if len(parts) != len(self._request.parts):
            raise ValueError(f"A round of {len(self._request.parts)} parts got {len(parts)}.")
        try:
            self._request = self._steps.send(parts)
        except StopIteration as done:
            self._request, self._refilled = None, done.value

    def finish(self) -> RefilledBatch:
        if self._refilled is None:
            raise RuntimeError("The refill still has rounds to generate.")
        return self._refilled
