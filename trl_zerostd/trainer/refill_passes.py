"""A refill (dynamic sampling, prompt skipping) run through TRL's own method, once per round.

The pure planner (``sampling.refill.RefillRounds``) says what each round generates. Each round is one pass of TRL's
``_generate_and_score_completions`` over the round's rows: TRL prepares their prompts (environments drawn and reset,
images put into the messages, tool dicts built), and its ``_generate`` (the adapter's override, here ``generate``)
decodes them; they are scored once and gathered for the planner. A round that more rounds follow trains nothing: its
pass ends where its ``_generate`` returns (``RoundGenerated``), so none of TRL's forwards or logs after that call run
for it. In the last round's pass, ``_generate`` hands TRL the rows that train, from every round, each with the prompt
TRL prepared for it in its own round; TRL's output of that pass is the batch's. So every rollout is prepared, its
environment reset, generated, scored, forwarded and logged once (docs/flow.md).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import ExitStack
from typing import TYPE_CHECKING, cast

import torch
from accelerate.utils import gather_object

from ..sampling.rounds import GatheredRows, RefilledBatch
from ..sampling.sizes import part_major_order
from . import trl_layout
from .batch import Generation, GenerationBatch, RowRecord
from .engine import one_sleep_per_batch

if TYPE_CHECKING:
    from ..sampling.refill import RefillRounds
    from .adapter import ZeroStdAdapter


class RoundGenerated(Exception):
    """Ends a pass of TRL's method at its ``_generate`` call: the pass's rows are generated and scored, and none of
    them trains as they stand (a round that more rounds follow, or a last round whose rows that train get a pass of
    their own). All ranks raise it in the same round (every rank plans the same rounds), so TRL's collectives after
    ``_generate`` are skipped on every rank alike."""


class RefillPasses:
    """One training batch's refill through TRL's method (the adapter builds it and hands it each ``_generate``).

    ``round_sizes``: this rank's rows of each part of the round running; ``pending_metrics``: the scalars reward
    functions logged in every round's scoring; ``refilled``: the rows that train, where they get a pass of their own
    (``TrainerHooks._hands_over_in_place``); ``engine_held``: a colocated engine's sleep, held from the first round's
    generation to the last's (``engine.one_sleep_per_batch``).
    """

    def __init__(self, trainer: ZeroStdAdapter, batch: GenerationBatch, rounds: RefillRounds) -> None:
        self.trainer, self.batch, self.rounds = trainer, batch, rounds
        self.round_sizes: list[int] = []
        self.pending_metrics: dict[str, list] = {}
        self.refilled: RefilledBatch | None = None
        self.engine_held = ExitStack()

    def run(self, trl_pass: Callable[[list[dict]], dict]) -> dict:
        """TRL's output for the batch: ``trl_pass`` (TRL's method) once per round, then, where the rows that train
        were not handed over in the last round's pass, once over them."""
        trainer, batch = self.trainer, self.batch
        world, rank = trainer.accelerator.num_processes, trainer.accelerator.process_index
        draws = trl_layout.EnvironmentDraws(trainer)
        with self.engine_held:
            self.engine_held.enter_context(one_sleep_per_batch(trl_layout.vllm_generation(trainer)))
            while (request := self.rounds.next_round()) is not None:
                parts = [part.local_rows(world, rank) for part in request.parts]
                batch.inputs, batch.generation = [row for part in parts for row in part], None
                self.round_sizes = [len(part) for part in parts]
                try:
                    with draws.round():
                        return trl_pass(batch.inputs)
                except RoundGenerated:
                    continue
        if self.refilled is None:
            raise RuntimeError("The refill's rounds ended before they handed over the batch that trains.")
        batch.inputs = list(self.refilled.rows)
        self._take_refilled(self.refilled)
        batch.refill = None  # a pass of their own: _generate gives back their generation
        return trl_pass(batch.inputs)

    def generate(self, prompts: list, trl_generate: Callable[[list], tuple]) -> tuple:
        """``_generate`` in a round's pass: TRL's ``_generate`` over the round's prompts, scored once; the round's
        rows go to the planner gathered (each part's rows consecutive, a prompt's rows together). Returns only in the
        last round, handing over the rows that train; else it ends the pass (``RoundGenerated``)."""
        trainer, batch = self.trainer, self.batch
        generated = trl_generate(prompts)
        rows = batch.inputs
        rewards_per_func, truncated = trainer._score_generation(rows, prompts, generated)
        logged = trl_layout.take_logged_columns(trainer, len(rows))
        for name, values in trl_layout.take_pending_metrics(trainer).items():
            self.pending_metrics.setdefault(name, []).extend(values)
        split = trainer._split_generated(generated, rows)
        records = [RowRecord(prompt, row) for prompt, row in zip(prompts, split, strict=True)]
        self.rounds.add(self._gathered(rows, records, logged, rewards_per_func, truncated))
        batch.generation = Generation(generated, rewards_per_func, truncated)
        if self.rounds.next_round() is None:  # the last round: the engine sleeps before the scoring forwards, as TRL's
            self.engine_held.close()
            refilled = self.rounds.finish()
            refused = not trainer._hands_over_in_place(rows, refilled.rows)  # every rank takes the same way
            if trainer._over_ranks(int(refused), reduction="sum") == 0:
                return self._hand_over(prompts, refilled)
            self.refilled = refilled  # the rows that train get a pass of TRL's method of their own
        raise RoundGenerated  # this pass trains nothing: TRL's method ends here

    def _gathered(
        self,
        rows: list[dict],
        records: list[RowRecord],
        logged: list[dict],
        rewards_per_func: torch.Tensor,
        truncated: torch.Tensor,
    ) -> list[GatheredRows]:
        """The round's rows of every rank, one ``GatheredRows`` per part, in part-major order."""
        world = self.trainer.accelerator.num_processes
        order = part_major_order(self.round_sizes, world)
        task_rewards = self.trainer._task_rewards(rewards_per_func)
        tensors = [t[order.to(t.device)] for t in (rewards_per_func, truncated, task_rewards)]
        objects = [gather_object(values) for values in (rows, records, logged)]
        gathered_rows, gathered_records, gathered_logged = ([values[i] for i in order.tolist()] for values in objects)
        gathered = GatheredRows(gathered_rows, gathered_records, tensors[0], tensors[1], tensors[2], gathered_logged)
        return GatheredRows.split(gathered, [size * world for size in self.round_sizes])

    def _hand_over(self, prompts: list, refilled: RefilledBatch) -> tuple:
        """The last round's pass continues with the rows that train: TRL's ``inputs`` and ``prompts`` of this pass
        (the lists it gave ``_generate``, which it reads after the call) become theirs, each row with the prompt TRL
        prepared for it in its own round, and ``_generate`` returns their generation."""
        self.batch.inputs[:] = refilled.rows
        prompts[:] = [record.prompt for record in cast(list[RowRecord], refilled.records)]
        trl_layout.set_batch_environments(self.trainer, self.batch.inputs)
        return self.trainer._scored_generation(self.batch, self._take_refilled(refilled))

    def _take_refilled(self, refilled: RefilledBatch) -> Generation:
        """The batch's generation is the refill's rows that train; their logged columns, the scalars every round's
        scoring logged and the refill's metrics go to TRL's stores."""
        trainer = self.trainer
        generated = trainer._join_generated([record.generated for record in cast(list[RowRecord], refilled.records)])
        self.batch.generation = Generation(generated, refilled.rewards_per_func, refilled.truncated)
        trl_layout.restore_logged_columns(trainer, refilled.logged)
        trl_layout.restore_pending_metrics(trainer, self.pending_metrics)
        trl_layout.log_metrics(trainer, refilled.metrics)
        return self.batch.generation
