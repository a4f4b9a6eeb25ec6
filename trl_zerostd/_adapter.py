"""Trainer plumbing shared by the GRPO and RLOO adapters: call TRL, then apply the pure core.

Training mode only; in eval every override returns TRL's own result. A generation batch flows as (docs/flow.md)::

    _generate_and_score_completions   opens a GenerationBatch, refills it (dynamic sampling, prompt skipping: rounds
                                      of TRL's prompt preparation and _generate), runs TRL's on the rows that train,
                                      applies the plan to TRL's output
      _generate                       TRL generates (or the refill's generation is given back); the rewards are
                                      scored and the RowPlan decided, once (_generation.py)
      _get_per_token_logps_and_...    TRL's scoring forwards (old policy, reference) forward the plan's rows
      _calculate_rewards              TRL's own call gets the rewards already scored
    _compute_loss                     TRL's loss on the plan's rows of the micro-batch (a LossCall)
      _get_per_token_logps_and_...    forwards the rows that train; the others get constant log-probs
"""

from __future__ import annotations

import logging
import os
from typing import ClassVar

import torch
from accelerate.utils import gather, gather_object
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from . import _trl, core
from ._batch import GenerationBatch
from ._exit import end_process_group_at_exit
from ._generation import GenerationSide
from ._hooks import TrainerHooks
from ._loss import BASE_LOSS_MASK_KEY, ROLE_KEY, LossCall, loss_forward, rows_forward, select_rows
from .config import masking_settings
from .state import ZeroStdState, build_state

logger = logging.getLogger("trl_zerostd")


class ZeroStdAdapter(GenerationSide, TrainerHooks):
    """Put before a TRL trainer class (``class ZeroStdGRPOTrainer(ZeroStdAdapter, GRPOTrainer)``): TRL's methods that
    this package overrides, each calling TRL's and applying the core (the generation side in ``_generation.py``). Its
    state is one attribute, ``zero_std`` (a ``ZeroStdState``); the batch being generated is ``_generation_batch``,
    the loss call running ``_loss_call``. Subclasses set ``trainer_kind`` and implement the hooks of
    ``_hooks.TrainerHooks`` (abstract: a trainer missing one cannot be built)."""

    trainer_kind: ClassVar[str]
    # Class-level defaults: a trainer made without __init__ (TRL's own tests build trainers with object.__new__) has
    # no state, and every override then returns TRL's own result.
    zero_std: ZeroStdState | None = None
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

    # -- generation batch -------------------------------------------------------------------------------------

    def _generate_and_score_completions(self, inputs):
        # follows {GRPO,RLOO}Trainer._generate_and_score_completions (TRL 1.16): TRL's, then the plan applied
        if not self.model.training or self.zero_std is None:
            return super()._generate_and_score_completions(inputs)
        self._check_groups_share_prompt(inputs)
        self._generation_batch = batch = GenerationBatch(inputs=inputs)
        try:
            if self.zero_std.refiller is not None:  # dynamic sampling, prompt skipping
                self._refill(self.zero_std.refiller, batch)
            return self._apply_plan(batch, super()._generate_and_score_completions(batch.inputs))
        finally:
            self._generation_batch = None

    def _decide_plan(self, batch: GenerationBatch, rejected: torch.Tensor) -> None:
        generation = batch.generation
        assert generation is not None, "the plan is decided on the batch's generation, once it is scored"
        task_rewards = self._task_rewards(generation.rewards_per_func)
        batch.plan = self._state.decide_plan(
            task_rewards, generation.rewards_per_func, generation.truncated, rejected, self._group_size
        )
        needed = batch.plan.forwarded.view(self.accelerator.num_processes, -1)  # what the loss reads
        batch.scoring_rows = core.forward_rows(needed, self.accelerator.process_index)

    def _apply_plan(self, batch: GenerationBatch, output: dict) -> dict:
        """The plan applied to this rank's slice of TRL's output: advantages, loss masks, row roles, metrics."""
        plan = batch.plan
        if plan is None:
            raise RuntimeError("No row plan was decided: TRL did not run the scoring forward it runs in TRL 1.16.")
        advantages = self._advantages(batch).masked_fill(plan.masked, 0.0)
        loss_mask = output_loss_mask(output)
        rows = slice(
            self.accelerator.process_index * len(loss_mask), (self.accelerator.process_index + 1) * len(loss_mask)
        )
        role = plan.role[rows].to(loss_mask.device)
        forwarded = (role >= core.RowRole.KL_ONLY).unsqueeze(1).to(loss_mask.dtype)
        output["advantages"] = advantages[rows].to(output["advantages"])
        output["completion_mask"] = output["completion_mask"] * forwarded
        if output.get("tool_mask") is not None:
            output["tool_mask"] = output["tool_mask"] * forwarded
        output[ROLE_KEY], output[BASE_LOSS_MASK_KEY] = role, loss_mask
        row_tokens = gather(loss_mask.sum(dim=1))
        exclude = self._state.settings.zero_std_normalization == "exclude"
        if exclude and not plan.forwarded.all() and "num_items_in_batch" in output:
            output["num_items_in_batch"] = (row_tokens * plan.forwarded).sum().to(output["num_items_in_batch"])
        self._finish_output(output, role)
        _trl.replace_logged_advantages(self, advantages)
        metrics = core.plan_metrics(plan, row_tokens, self._state.settings.zero_std_kl)
        _trl.log_metrics(self, metrics)
        low, high = metrics["zero_std/all_low_group_frac"], metrics["zero_std/all_high_group_frac"]
        self._warn_once(self._state.stall_monitor.observe_batch(low, high, metrics["masked/row_frac/truncated"]))
        return output

    # -- forwards and loss ------------------------------------------------------------------------------------

    def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep, *args, **kwargs):
        # follows {GRPO,RLOO}Trainer._get_per_token_logps_and_entropies (TRL 1.16): forwards the rows the plan reads
        forward = super()._get_per_token_logps_and_entropies
        if isinstance(self._loss_call, LossCall):
            return loss_forward(self._loss_call, forward, model, input_ids, attention_mask, logits_to_keep, *args,
                                **kwargs)  # fmt: skip
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

    def _compute_loss(self, model, inputs):
        # follows {GRPO,RLOO}Trainer._compute_loss (TRL 1.16): TRL's loss on the plan's rows of the micro-batch
        if ROLE_KEY not in inputs:
            return super()._compute_loss(model, inputs)
        settings, inputs = self.zero_std.settings, dict(inputs)
        role, base_loss_mask = inputs.pop(ROLE_KEY), inputs.pop(BASE_LOSS_MASK_KEY)
        needed = torch.tensor([core.loss_rows_needed(role.cpu(), settings.zero_std_normalization)], device=role.device)
        rows = core.plan_loss_rows(role.cpu(), settings.zero_std_normalization, int(gather(needed).max()))
        kept = rows.kept.to(role.device)
        if len(kept) < len(role):
            inputs = select_rows(inputs, kept, len(role))
        fill = inputs.get("old_per_token_logps")
        fill = torch.zeros(inputs["completion_ids"].shape, device=role.device) if fill is None else fill
        call = LossCall(rows=rows, fill_logps=fill)
        inputs = self._loss_inputs(inputs, call, base_loss_mask[kept])
        self._loss_call = call
        try:
            loss = super()._compute_loss(model, inputs)
        finally:
            self._loss_call = None
        self._observe_trained_rows(int((rows.role >= core.RowRole.KL_ONLY).sum()))
        return loss

    def _observe_trained_rows(self, rows: int) -> None:
        """Count the rows this micro-batch trained; at the optimizer-step boundary, log whether the step trained
        none (all ranks together) and let the stall monitor see it."""
        state = self._state
        state.rows_trained_this_step += rows
        if not self.accelerator.sync_gradients:
            return
        count = torch.tensor(state.rows_trained_this_step, device=self.accelerator.device)
        total = int(self.accelerator.reduce(count, reduction="sum"))
        state.rows_trained_this_step = 0
        _trl.log_metrics(self, {"zero_std/untrained_step_frac": float(total == 0)})
        self._warn_once(state.stall_monitor.observe_step(total))

    # -- checkpoints ------------------------------------------------------------------------------------------

    def _save_checkpoint(self, model, trial):
        # follows {GRPO,RLOO}Trainer._save_checkpoint (TRL 1.16): the package's state travels with the checkpoint
        super()._save_checkpoint(model, trial)
        if self.args.should_save and self.zero_std is not None:
            run_dir = self._get_output_dir(trial=trial)
            self.zero_std.save(os.path.join(run_dir, f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"))

    def _load_optimizer_and_scheduler(self, checkpoint):
        # follows {GRPO,RLOO}Trainer._load_optimizer_and_scheduler (TRL 1.16): resuming restores the package's state
        super()._load_optimizer_and_scheduler(checkpoint)
        if checkpoint and self.zero_std is not None:
            for notice in self.zero_std.load(checkpoint):
                self._warn_once(notice)

    # -- helpers ----------------------------------------------------------------------------------------------

    def _warn_once(self, message: str | None) -> None:
        if message is not None and self.accelerator.is_main_process:
            logger.warning(message)

    def _check_groups_share_prompt(self, inputs: list[dict]) -> None:
        core.check_groups_share_prompt(gather_object([row.get("prompt", row) for row in inputs]), self._group_size)


def output_loss_mask(output: dict) -> torch.Tensor:
    """``(B, T)`` the loss mask of TRL's output: completion tokens, tool tokens out."""
    mask = output["completion_mask"]
    return mask * output["tool_mask"] if output.get("tool_mask") is not None else mask
