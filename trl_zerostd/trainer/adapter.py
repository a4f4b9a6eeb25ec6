"""The adapter: TRL's trainer methods that the package overrides, shared by the GRPO and RLOO trainers, each
calling TRL's and applying the pure core. Training mode only; in eval every override returns TRL's own result. A
generation batch flows as (docs/flow.md)::

    _generate_and_score_completions   opens a GenerationBatch; runs TRL's method (with a refill, once per round:
                                      refill_passes.RefillPasses), then applies the plan to TRL's output
      _generate                       TRL generates; the rewards are scored and the RowPlan decided, once (with a
                                      refill: the round's rows go to the planner; the last round's pass gets the
                                      rows that train)
      _generate_single_turn           (grpo.py, rloo.py) TRL's decode, in calls sized and aligned as TRL's
      _get_per_token_logps_and_...    TRL's scoring forwards (old policy, reference) forward the plan's rows
      _calculate_rewards              TRL's own call gets the rewards already scored
    _compute_loss                     TRL's loss on the plan's rows of the micro-batch (a LossCall)
      _get_per_token_logps_and_...    forwards the rows that train; the others get constant log-probs
"""

from __future__ import annotations

import logging
from functools import partial
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from accelerate.utils import gather, gather_object

from .. import core
from ..core.settings import masking_settings
from . import trl_layout
from .batch import Generation, GenerationBatch
from .engine import decode_in_calls, one_sleep_per_batch
from .hooks import TrainerHooks
from .loss import ROLE_KEY, LossCall, loss_call, loss_forward, mark_rows, rows_forward
from .process_exit import end_process_group_at_exit
from .refill_passes import RefillPasses
from .state import ZeroStdState, build_state, replayed_passes

if TYPE_CHECKING:  # the TRL trainer the adapter goes before: RLOOTrainer has every name the adapter reads too
    from trl import GRPOConfig, RLOOConfig
    from trl import GRPOTrainer as TRLTrainer
else:
    TRLTrainer = object

logger = logging.getLogger("trl_zerostd")


class ZeroStdAdapter(TrainerHooks, TRLTrainer):
    """Put before a TRL trainer class (``class ZeroStdGRPOTrainer(ZeroStdAdapter, GRPOTrainer)``). Its state is one
    attribute, ``zero_std`` (a ``ZeroStdState``); the batch being generated is ``_generation_batch``, the loss call
    running ``_loss_call``: class-level None, so a trainer made without ``__init__`` (as TRL's own tests make them)
    gets TRL's result from every override. Subclasses set ``trainer_kind`` and implement ``hooks.TrainerHooks``."""

    trainer_kind: ClassVar[str]
    args: GRPOConfig | RLOOConfig  # TRL's config types it as transformers' TrainingArguments
    zero_std: ZeroStdState | None = None
    _generation_batch: GenerationBatch | None = None
    _loss_call: LossCall | None = None

    @property
    def _state(self) -> ZeroStdState:
        """``zero_std`` where the overrides read it: in a training batch or loss call, which run only with a state."""
        assert self.zero_std is not None, "a training batch or loss call runs only where zero_std was built"
        return self.zero_std

    @property
    def _group_size(self) -> int:
        """TRL's ``num_generations``: typed ``int | None`` by TRL's config, set (default 8) wherever TRL trains."""
        assert self.num_generations is not None, "TRL's trainers group completions by num_generations"
        return self.num_generations

    def _init_zero_std(self) -> None:
        self.zero_std = build_state(
            masking_settings(self.args),
            self.args,
            self.trainer_kind,
            self.train_dataset,
            self._group_size,
            self.accelerator.num_processes,
            self.accelerator.process_index,
            shuffle_dataset=self.shuffle_dataset,
            has_environments=bool(getattr(self, "environment_factories", None)),
            has_rollout_func=getattr(self, "rollout_func", None) is not None,
            reward_func_names=list(self.reward_func_names),
        )
        end_process_group_at_exit(self.accelerator)

    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        # follows {GRPO,RLOO}Trainer._generate_and_score_completions (TRL 1.14.1-1.16): TRL's, then the plan applied
        if self.zero_std is None or self.model is None or not self.model.training:
            return super()._generate_and_score_completions(inputs)
        core.check_groups_share_prompt(gather_object([row.get("prompt", row) for row in inputs]), self._group_size)
        self._generation_batch = batch = GenerationBatch(inputs=inputs)
        try:
            refiller = self.zero_std.refiller
            if refiller is None:
                return self._apply_plan(batch, super()._generate_and_score_completions(inputs))
            batch.refill = RefillPasses(self, batch, refiller.plan(inputs, self.zero_std.reward_range))
            return self._apply_plan(batch, batch.refill.run(super()._generate_and_score_completions))
        finally:
            self._generation_batch = None

    def _generate(self, prompts: list) -> tuple:
        # follows {GRPO,RLOO}Trainer._generate (TRL 1.14.1-1.16); relies on TRL reading, after the call, the same
        # prompts and inputs lists (its _calculate_rewards, its logs)
        batch = self._generation_batch
        if batch is None:
            return super()._generate(prompts)
        if batch.refill is not None:
            return batch.refill.generate(prompts, super()._generate)
        if batch.generation is None:  # TRL's own rows (else a refill's, handed over to a pass of their own)
            with one_sleep_per_batch(trl_layout.vllm_generation(self)):
                generated = super()._generate(prompts)
            batch.generation = Generation(generated, *self._score_generation(batch.inputs, prompts, generated))
        return self._scored_generation(batch, batch.generation)

    def _calculate_rewards(
        self, inputs: list[dict], prompts: list, completions: list, completion_ids_list: list[list[int]]
    ) -> torch.Tensor:
        # follows {GRPO,RLOO}Trainer._calculate_rewards (TRL 1.14.1-1.16): rewards were scored in _generate
        batch = self._generation_batch
        if batch is not None and batch.generation is not None:
            return batch.generation.rewards_per_func
        return super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)

    def _score_generation(
        self, rows: list[dict], prompts: list, generated: tuple
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The gathered ``(N, K)`` rewards (TRL's arguments, once) and ``(N,)`` truncation of what was just generated
        for ``rows``, this rank's dataset rows (a rollout's extra fields are merged into them, as TRL does)."""
        completion_ids, completions, extra_fields = self._generated_rows(generated)
        trl_layout.merge_extra_fields(rows, extra_fields)
        rewards_per_func = super()._calculate_rewards(rows, prompts, completions, completion_ids)
        end_tokens = trl_layout.end_token_ids(self)
        truncated = core.truncated_rows(completion_ids, end_tokens) & bool(self.mask_truncated_completions)
        return rewards_per_func, gather(truncated.to(self.accelerator.device)).bool()

    def _scored_generation(self, batch: GenerationBatch, generation: Generation) -> tuple:
        """What ``_generate`` returns for the rows that train, once the plan is decided (under vLLM importance
        sampling the old-policy forward's ratio decides it: ``_get_per_token_logps_and_entropies``)."""
        if not self._rejection_mode():
            self._decide_plan(batch, rejected=torch.zeros_like(generation.truncated))
        return generation.generated

    def _engine_calls(
        self, prompt_ids: list, images: list | None, multimodal_fields: dict, copies: int, decode
    ) -> list:
        """TRL's ``_generate_single_turn`` (``decode``) for a training batch in calls of at most TRL's generation batch
        of rows, aligned for vLLM's server (``engine.decode_in_calls``). The tool loop's calls (one copy per row, a
        number of rows that differs by rank) and eval's are TRL's own."""
        if self._generation_batch is None or copies == 1:
            return [decode(prompt_ids, images, multimodal_fields, copies)]
        most, server = trl_layout.generation_batch_rows(self.args), self.use_vllm and self.vllm_mode == "server"
        vllm_generation = trl_layout.vllm_generation(self)
        return decode_in_calls(prompt_ids, images, multimodal_fields, copies, decode, most, server, vllm_generation)

    def _decide_plan(self, batch: GenerationBatch, rejected: torch.Tensor) -> None:
        world, rank = self.accelerator.num_processes, self.accelerator.process_index
        batch.decide_plan(self._state, self._task_rewards, rejected, self._group_size, world, rank)

    def _apply_plan(self, batch: GenerationBatch, output: dict) -> dict:
        """The plan applied to this rank's slice of TRL's output: advantages, loss masks, row roles, metrics."""
        plan = batch.plan
        if plan is None:
            raise RuntimeError("No row plan was decided: TRL did not run its scoring forward.")
        advantages = self._advantages(batch).masked_fill(plan.masked, 0.0)
        rows = len(output["advantages"])
        rank_rows = slice(self.accelerator.process_index * rows, (self.accelerator.process_index + 1) * rows)
        role = plan.role[rank_rows].to(output["advantages"].device)
        row_tokens = gather(mark_rows(output, role, advantages[rank_rows], plan.tied_sign[rank_rows]).sum(dim=1))
        exclude = self._state.settings.zero_std_normalization == "exclude"
        if exclude and not plan.forwarded.all() and "num_items_in_batch" in output:
            output["num_items_in_batch"] = (row_tokens * plan.forwarded).sum().to(output["num_items_in_batch"])
        self._finish_output(output, role)
        trl_layout.replace_logged_advantages(self, advantages)
        self._log(*self._state.observe_plan(plan, row_tokens))
        return output

    def _get_per_token_logps_and_entropies(
        self,
        model: torch.nn.Module,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        logits_to_keep: int,
        *args: Any,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        # follows {GRPO,RLOO}Trainer._get_per_token_logps_and_entropies (TRL 1.14.1-1.16): the plan's rows
        forward = super()._get_per_token_logps_and_entropies
        if isinstance(self._loss_call, LossCall):
            call = self._loss_call
            return loss_forward(call, forward, model, input_ids, attention_mask, logits_to_keep, *args, **kwargs)
        batch = self._generation_batch
        if batch is None:
            return forward(model, input_ids, attention_mask, logits_to_keep, *args, **kwargs)
        deciding = batch.plan is None  # vLLM importance sampling: the first forward (old policy's) is whole and its
        rows = None if deciding else batch.scoring_rows  # ratio may reject rows, so the plan is decided after it
        result = rows_forward(rows, forward, model, input_ids, attention_mask, logits_to_keep, *args, **kwargs)
        completion_mask = attention_mask[:, -logits_to_keep:]
        batch.scoring_logps.append((result[0], completion_mask))
        if deciding:
            self._decide_plan(batch, rejected=self._rejected_rows(batch, result[0], completion_mask))
        return result

    def _compute_loss(self, model: torch.nn.Module, inputs: dict[str, Any]) -> torch.Tensor:
        # follows {GRPO,RLOO}Trainer._compute_loss (TRL 1.14.1-1.16): TRL's loss on the plan's rows of the micro-batch
        if ROLE_KEY not in inputs:
            return super()._compute_loss(model, inputs)
        most_rows = partial(self._over_ranks, reduction="max")
        inputs, call, base_loss_mask = loss_call(inputs, self._state.settings, most_rows)
        inputs = self._loss_inputs(inputs, call, base_loss_mask)
        self._loss_call = call
        try:
            loss = super()._compute_loss(model, inputs)
        finally:
            self._loss_call = None
        self._log(call.tied_metrics(partial(self.accelerator.reduce, reduction="sum")))
        trained, step_ends = int((call.rows.role >= core.RowRole.KL_ONLY).sum()), self.accelerator.sync_gradients
        self._log(*self._state.observe_trained_rows(trained, step_ends, partial(self._over_ranks, reduction="sum")))
        return loss

    def _get_train_sampler(self, dataset: Any = None) -> Any:
        # follows {GRPO,RLOO}Trainer._get_train_sampler (TRL 1.14.1-1.16): TRL's sampler, its passes replayed on resume
        return replayed_passes(self.zero_std, super()._get_train_sampler(dataset))

    def _save_checkpoint(self, model: torch.nn.Module, trial: Any) -> None:
        # follows {GRPO,RLOO}Trainer._save_checkpoint (TRL 1.14.1-1.16): the package's state travels with it
        super()._save_checkpoint(model, trial)
        if self.args.should_save and self.zero_std is not None:
            self.zero_std.save(trl_layout.checkpoint_dir(self, trial), trl_layout.generation_phase(self))

    def _load_optimizer_and_scheduler(self, checkpoint: str | None) -> None:
        # follows {GRPO,RLOO}Trainer._load_optimizer_and_scheduler (TRL 1.14.1-1.16): restores the package's state
        super()._load_optimizer_and_scheduler(checkpoint)
        if checkpoint and self.zero_std is not None:
            for notice in self.zero_std.load(checkpoint):
                self._log({}, notice)

    def _over_ranks(self, value: int, reduction: str) -> int:
        """``value`` reduced over every rank (``"sum"``, ``"max"``): a collective, every rank calls it."""
        return int(self.accelerator.reduce(torch.tensor(value, device=self.accelerator.device), reduction=reduction))

    def _log(self, metrics: dict[str, float], notice: str | None = None) -> None:
        """Train metrics into TRL's store; a notice (the stall monitor's, a resume's) to the main process's log."""
        trl_layout.log_metrics(self, metrics)
        if notice is not None and self.accelerator.is_main_process:
            logger.warning(notice)
