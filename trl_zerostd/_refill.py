"""Dynamic sampling and prompt skipping, the trainer side: a generation batch refilled until it holds only
informative groups, from prompts drawn past those predicted to be zero-variance.

Inside TRL's ``_generate``: round 1 generates TRL's own rows (the dataloader's), each further round the next
prompts of a seeded ``PromptStream`` over the same dataset, through TRL's own ``_generate`` (so vLLM, rollout_func
and tools work as they do in TRL). Every round is a whole sequential decode, so the first one already generates,
beside the dataloader's groups, as many more as the informative rate of earlier batches says the batch will need;
a refill round is sized by the rate of this batch and the earlier ones (decayed counts). Every round's rewards are
scored and gathered, so every rank takes the same decisions and runs the same rounds. The groups that train are
chosen on the gathered batch; each rank then holds its slice of them, and TRL's ``prompts`` and ``inputs`` lists are
refilled in place with those rows, so everything TRL does after generation (scoring forwards, advantages, logs) sees
the batch that trains, in TRL's usual shape.

With prompt skipping every prompt of the batch, the first round's included, comes from the stream (the dataloader
only paces the steps): the stream skips a prompt by its history (``skipping.py``), and the outcome of every group
generated goes into that history. Without dynamic sampling there is one round of exactly the batch's groups.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import torch
from accelerate.utils import gather_object
from datasets import IterableDataset

from . import core
from .sampling import PromptStream, choose_groups, first_round_extra, part_major_order, rank_rows, refill_groups
from .skipping import Outcome, PromptSkipper, group_outcomes

logger = logging.getLogger("trl_zerostd")
RATE_DECAY = 0.9  # per generation batch: the informative rate a refill is sized by looks back ~10 batches


@dataclass
class GeneratedPool:
    """Every row generated for one batch so far, in gathered order (every rank holds all of it): dataset rows, the
    trainer's per-row generation records, rewards ``(rows, K)``, truncation ``(rows,)``, informative ``(groups,)``;
    with prompt skipping, the dataset row of each group (every part comes from the stream) and the prompts skipped."""

    rows: list[dict] = field(default_factory=list)
    records: list[tuple] = field(default_factory=list)
    rewards_per_func: list[torch.Tensor] = field(default_factory=list)
    truncated: list[torch.Tensor] = field(default_factory=list)
    informative: list[torch.Tensor] = field(default_factory=list)
    prompt_ids: list[int] = field(default_factory=list)
    skipped: int = 0

    def groups(self) -> tuple[int, int]:
        """``(informative, generated)`` group counts."""
        flags = torch.cat(self.informative)
        return int(flags.sum()), len(flags)


class DynamicSamplingMixin:
    """Needs ``masking``, ``_score_generation``, ``_split_generated`` and ``_join_generated``."""

    prompt_stream: PromptStream | None = None  # class-level defaults: off until _init_dynamic_sampling
    prompt_skipper: PromptSkipper | None = None

    def _init_dynamic_sampling(self) -> None:
        self.informative_history = (0.0, 0.0)  # decayed (informative, generated) group counts of earlier batches
        self._cap_warned = False
        used = [name for name in ("dynamic_sampling", "skip_zero_std_prompts") if getattr(self.masking, name)]
        if not used:
            return
        dataset = self.train_dataset
        if dataset is None or isinstance(dataset, IterableDataset):
            raise ValueError(f"{' and '.join(used)} draws prompts by index: it needs a map-style train_dataset.")
        if {"image", "images"} & set(dataset.column_names) or getattr(self, "environment_factories", None):
            raise NotImplementedError(
                f"{' and '.join(used)}: image inputs and environment_factory are not supported yet."
            )
        self.prompt_stream = PromptStream(len(dataset), self.args.seed)
        if self.masking.skip_zero_std_prompts:
            key = self.masking.skip_history_key
            if key is not None and key not in dataset.column_names:
                raise ValueError(
                    f"skip_history_key={key!r} is not a column of the train_dataset (columns: {dataset.column_names})."
                )
            self.prompt_skipper = PromptSkipper.new(
                len(dataset),
                self.masking.skip_target_zero_std_frac,
                self.masking.skip_min_draw_prob,
                keys=None if key is None else [repr(value) for value in dataset[key]],
            )

    def _generate_refilled(self, batch, prompts: list, generate) -> tuple[tuple, torch.Tensor, torch.Tensor]:
        """Generate until the gathered batch holds ``N // G`` informative groups or the round cap is reached (one
        round without dynamic sampling). Returns this rank's generation (TRL's ``_generate`` layout) and the gathered
        rewards and truncation of the rows that train; refills ``prompts`` and ``batch.inputs`` in place with this
        rank's rows."""
        world, rank, G = self.accelerator.num_processes, self.accelerator.process_index, self.num_generations
        dynamic = self.masking.dynamic_sampling
        needed = len(batch.inputs) * world // G
        pool = GeneratedPool()
        seen_informative, seen_generated = self.informative_history
        extra = first_round_extra(needed, seen_informative, seen_generated, world, G) if dynamic else 0
        if self.prompt_skipper is not None:
            first = [self._stream_part(pool, needed + extra)]
        else:
            first = [(batch.inputs, list(prompts))] + ([self._stream_part(pool, extra)] if extra else [])
        self._generate_round(pool, first, generate)
        rounds, (informative, generated) = 1, pool.groups()
        while dynamic and informative < needed and rounds < self.masking.dynamic_sampling_max_rounds:
            count = refill_groups(
                needed - informative, informative + seen_informative, generated + seen_generated, needed, world, G
            )
            self._generate_round(pool, [self._stream_part(pool, count)], generate)
            rounds, (informative, generated) = rounds + 1, pool.groups()
        if self.prompt_skipper is not None:
            self._record_outcomes(pool)
        chosen = torch.arange(needed)
        if dynamic:
            self.informative_history = (
                RATE_DECAY * (seen_informative + informative),
                RATE_DECAY * (seen_generated + generated),
            )
            if informative < needed:
                self._cap_reached(informative, generated, needed)
            chosen = choose_groups(torch.cat(pool.informative), needed)
        row_ids = (chosen.unsqueeze(1) * G + torch.arange(G)).view(-1)
        local_ids = row_ids[rank_rows(len(row_ids), world, rank)].tolist()
        batch.inputs[:] = [pool.rows[i] for i in local_ids]
        prompts[:] = [row["prompt"] for row in batch.inputs]
        rewards, truncated = torch.cat(pool.rewards_per_func), torch.cat(pool.truncated)
        if dynamic:
            self._log_refill(rounds, generated, informative, needed, rewards)
        return self._join_generated([pool.records[i] for i in local_ids]), rewards[row_ids], truncated[row_ids]

    def _stream_part(self, pool: GeneratedPool, groups: int) -> tuple[list[dict], list]:
        """This rank's rows and prompts of the next ``groups`` prompts drawn from the stream, ``G`` rows each."""
        world, rank, G = self.accelerator.num_processes, self.accelerator.process_index, self.num_generations
        draw_prob = self.prompt_skipper.draw_prob if self.prompt_skipper is not None else None
        prompt_ids, skipped = self.prompt_stream.draw(groups, draw_prob)
        pool.prompt_ids += prompt_ids
        pool.skipped += skipped
        rows = [dict(self.train_dataset[i]) for i in prompt_ids for _ in range(G)]
        local = rows[rank_rows(len(rows), world, rank)]
        return local, [row["prompt"] for row in local]

    def _generate_round(self, pool: GeneratedPool, parts: list[tuple[list[dict], list]], generate) -> None:
        """One decode pass over this rank's rows of every part; the pool gets them gathered, part by part."""
        rows = [row for part_rows, _ in parts for row in part_rows]
        prompts = [prompt for _, part_prompts in parts for prompt in part_prompts]
        generated = generate(prompts)
        rewards_per_func, truncated = self._score_generation(rows, prompts, generated)
        order = part_major_order([len(part_rows) for part_rows, _ in parts], self.accelerator.num_processes)
        rewards_per_func, truncated = (
            rewards_per_func[order.to(rewards_per_func.device)],
            truncated[order.to(truncated.device)],
        )
        task_rewards = self._task_rewards(rewards_per_func)
        valid = ~(truncated | core.unscorable_rows(rewards_per_func))
        zero_std = core.zero_std_groups(task_rewards, valid, self.num_generations, self.masking.zero_std_atol)
        gathered_rows, records = gather_object(rows), gather_object(self._split_generated(generated))
        pool.rows += [gathered_rows[i] for i in order.tolist()]
        pool.records += [records[i] for i in order.tolist()]
        pool.rewards_per_func.append(rewards_per_func)
        pool.truncated.append(truncated)
        pool.informative.append(~zero_std.cpu())

    def _record_outcomes(self, pool: GeneratedPool) -> None:
        """Every generated group's outcome into the skip history (the same on every rank: gathered rewards)."""
        rewards_per_func, truncated = torch.cat(pool.rewards_per_func), torch.cat(pool.truncated)
        task_rewards = self._task_rewards(rewards_per_func)
        valid = ~(truncated | core.unscorable_rows(rewards_per_func))
        reward_range = core.widen_reward_range(self.reward_range, task_rewards, valid) or (0.0, 0.0)
        outcomes = group_outcomes(task_rewards, valid, self.num_generations, self.masking.zero_std_atol, reward_range)
        self.prompt_skipper.record(pool.prompt_ids, outcomes)
        drawn = len(pool.prompt_ids) + pool.skipped
        metrics, explore = self._metrics["train"], self.prompt_skipper.explore
        metrics["prompt_skip/prompts_drawn"].append(drawn)
        metrics["prompt_skip/skipped_frac"].append(pool.skipped / drawn)
        metrics["prompt_skip/zero_std_group_frac"].append((outcomes != Outcome.INFORMATIVE).float().mean().item())
        metrics["prompt_skip/explore_prob_all_low"].append(explore.all_low)
        metrics["prompt_skip/explore_prob_all_high"].append(explore.all_high)

    def _cap_reached(self, informative: int, generated: int, needed: int) -> None:
        cap = self.masking.dynamic_sampling_max_rounds
        situation = (
            f"dynamic_sampling reached dynamic_sampling_max_rounds={cap} with {informative} of the {needed} "
            f"informative groups a batch needs (informative rate {informative / generated:.1%} over {generated} "
            "groups generated)"
        )
        if self.masking.dynamic_sampling_on_cap == "error":
            raise RuntimeError(
                f"{situation}. Raise dynamic_sampling_max_rounds, or set dynamic_sampling_on_cap='mask' to train on "
                "with the batch completed by masked groups."
            )
        if not self._cap_warned and self.accelerator.is_main_process:
            logger.warning(f"{situation}; the batch is completed with masked groups (logged as "
                           "dynamic_sampling/cap_reached; warned once).")  # fmt: skip
        self._cap_warned = True

    def _log_refill(self, rounds: int, generated: int, informative: int, needed: int, rewards: torch.Tensor) -> None:
        metrics = self._metrics["train"]
        metrics["dynamic_sampling/rounds"].append(rounds)
        metrics["dynamic_sampling/generated_groups"].append(generated)
        metrics["dynamic_sampling/informative_group_frac"].append(informative / generated)
        metrics["dynamic_sampling/dropped_groups"].append(generated - needed)
        metrics["dynamic_sampling/cap_reached"].append(float(informative < needed))
        metrics["dynamic_sampling/generated_reward_mean"].append(torch.nanmean(self._task_rewards(rewards)).item())
