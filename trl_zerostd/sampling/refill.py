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
dynamic sampling there is one round of exactly the batch's groups.
"""

from __future__ import annotations

import logging
from collections.abc import Generator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from ..core.groups import zero_std_groups
from ..core.settings import ZeroStdArguments
from .rounds import GatheredRows, GeneratedPool, RefilledBatch, RoundPart, RoundRequest
from .sizes import choose_groups, first_round_extra, rank_rows, refill_groups
from .skipping import PromptSkipper
from .streams import PromptStream, RowStream

if TYPE_CHECKING:
    from datasets import Dataset

logger = logging.getLogger("trl_zerostd")
# a fill's rounds: it yields requests, gets their gathered rows, returns (rounds, (informative, generated))
Rounds = Generator[RoundRequest, list[GatheredRows], tuple[int, tuple[int, int]]]
RATE_DECAY = 0.9  # per generation batch: the informative rate a refill reads looks back ~10 batches


@dataclass
class BatchRefiller:
    """The refill of a run: its settings, the prompt ``stream`` (with a map-style dataset, ``dataset`` gives the
    rows of its indices), the ``skipper`` (prompt skipping's histories) and the decayed ``(informative, generated)``
    group counts of earlier batches. Built by ``state.build_state``."""

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
        rounds, (informative, generated) = yield from self._fill_whole(pool, inputs, needed)
        if self.skipper is not None:
            metrics.update(self._record_outcomes(pool, reward_range))
        chosen = torch.arange(needed)
        if dynamic:
            if informative < needed:
                self._cap_reached(informative, generated, needed)
            chosen = choose_groups(torch.cat(pool.informative), needed)
        row_ids = (chosen.unsqueeze(1) * G + torch.arange(G)).view(-1)
        batch = GatheredRows.concat(pool.groups)
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
            rewards_per_func=batch.rewards_per_func[row_ids],
            truncated=batch.truncated[row_ids],
            metrics=metrics,
        )

    def _fill_whole(self, pool: GeneratedPool, inputs: list[dict], needed: int) -> Rounds:
        """Rounds of whole groups: the first sized by the informative rate of earlier batches (the dataloader's rows
        and more), each refill by this batch's and the earlier ones'. Returns the rounds and ``pool.counts()``."""
        world, G, dynamic = self.world_size, self.num_generations, self.settings.dynamic_sampling
        seen_informative, seen_generated = self.informative_history
        extra = first_round_extra(needed, seen_informative, seen_generated, world, G) if dynamic else 0
        if self.skipper is not None:
            rows, keys = self._stream_prompts(pool, needed + extra)
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

    def _stream_prompts(self, pool: GeneratedPool, count: int) -> tuple[list[dict], list[int]]:
        """The next ``count`` prompts of the stream (the same on every rank) and their skip-history keys; the prompts
        skipped on the way are counted in the pool."""
        if count == 0:
            return [], []
        draw_prob = self.skipper.draw_prob if self.skipper is not None else None
        if isinstance(self.stream, RowStream):
            rows, keys, skipped = self.stream.draw(count, draw_prob)
        else:
            keys, skipped = self.stream.draw(count, draw_prob)
            rows = self._dataset_rows(keys)
        pool.skipped += skipped
        return rows, keys

    def _dataset_rows(self, indices: list[int]) -> list[dict]:
        """The map-style dataset's rows at ``indices`` (the rows a ``PromptStream`` draws)."""
        assert self.dataset is not None, "build_state gives a PromptStream its map-style dataset"
        return [dict(self.dataset[i]) for i in indices]

    def _informative_groups(self, rows: GatheredRows, group_size: int) -> torch.Tensor:
        """``(rows // group_size,)`` bool: groups with two valid rows of different task reward."""
        return ~zero_std_groups(rows.task_rewards, rows.valid(), group_size, self.settings.zero_std_atol).cpu()

    def _record_outcomes(self, pool: GeneratedPool, reward_range) -> dict[str, float]:
        """Every generated group's outcome into the skip history (the same on every rank: gathered rewards)."""
        assert self.skipper is not None, "outcomes are recorded only with prompt skipping"
        groups = GatheredRows.concat(pool.groups)
        return self.skipper.record_batch(
            groups.task_rewards, groups.valid(), pool.keys, pool.skipped, reward_range, self.settings.zero_std_atol
        )

    def _cap_reached(self, informative: int, generated: int, needed: int) -> None:
        cap = self.settings.dynamic_sampling_max_rounds
        situation = (
            f"dynamic_sampling reached dynamic_sampling_max_rounds={cap} with {informative} of the {needed} "
            f"informative groups a batch needs (informative rate {informative / generated:.1%} over {generated} "
            "groups generated)"
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
            rounds.add(generate_and_score(request))  # one GatheredRows per part of the request
        refilled = rounds.finish()

    (``generate_and_score``: a pass of TRL's method over the round's rows, ``trainer.refill_passes.RefillPasses``.)
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
