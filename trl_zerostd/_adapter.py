"""Trainer plumbing shared by the GRPO and RLOO adapters: call TRL, then apply the pure core.

Training mode only; in eval every override returns TRL's own result. A generation batch flows as (docs/flow.md)::

    _generate_and_score_completions   opens a GenerationBatch, refills it (dynamic sampling, prompt skipping: rounds
                                      of TRL's prompt preparation and _generate), runs TRL's on the rows that train,
                                      applies the plan to TRL's output
      _generate                       TRL generates (or the refill's generation is given back); the rewards are
                                      scored and the RowPlan decided, once
      _get_per_token_logps_and_...    TRL's scoring forwards (old policy, reference) forward the plan's rows
      _calculate_rewards              TRL's own call gets the rewards already scored
    _compute_loss                     TRL's loss on the plan's rows of the micro-batch (a LossCall)
      _get_per_token_logps_and_...    forwards the rows that train; the others get constant log-probs
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import torch
from accelerate.utils import gather, gather_object

from . import core
from ._loss import BASE_LOSS_MASK_KEY, ROLE_KEY, LossCall, LossMixin, select_rows
from ._refill import DynamicSamplingMixin
from ._run_state import RunStateMixin
from .config import ZeroStdArguments, check_compatible, masking_settings
from .estimators import get_advantage_estimator
from .monitor import StallMonitor, stall_advice


@dataclass
class GenerationBatch:
    """What one training generation batch carries between TRL's calls into our overrides.

    ``inputs``: this rank's dataset rows (TRL's list). ``generated``: what TRL's ``_generate`` returned (with dynamic
    sampling or prompt skipping, set before TRL's ``_generate_and_score_completions`` runs). ``preparing``: TRL's
    method is running only to prepare prompts (``_prepared_prompts``).
    ``rewards_per_func`` ``(N, K)`` and ``truncated`` ``(N,)`` are gathered. ``scoring_logps``: the ``(B, T)``
    log-probs and completion masks of TRL's scoring forwards, in call order (RLOO's KL penalty reads them).
    """

    inputs: list[dict]
    generated: tuple | None = None
    preparing: bool = False
    rewards_per_func: torch.Tensor | None = None
    truncated: torch.Tensor | None = None
    plan: core.RowPlan | None = None
    scoring_rows: torch.Tensor | None = None
    whole_old_forward: bool = False
    scoring_logps: list[tuple[torch.Tensor, torch.Tensor]] = field(default_factory=list)


class PreparedPrompts(Exception):  # noqa: N818 - not an error: carries TRL's prepared prompts out of its method
    """Raised by ``_generate`` while ``_prepared_prompts`` runs TRL's method only up to its ``_generate`` call."""

    def __init__(self, prompts: list):
        super().__init__()
        self.prompts = prompts


def merge_extra_fields(inputs: list[dict], extra_fields: dict) -> None:
    """Merge a rollout_func's ``extra_fields`` into ``inputs`` in place, as GRPOTrainer does (TRL 1.16) just before
    ``_calculate_rewards``: a list gives row ``i`` its ``i``-th value, anything else goes to every row."""
    for i, example in enumerate(inputs):
        for key, values in extra_fields.items():
            if not isinstance(values, list):
                example[key] = values
            elif i < len(values):
                example[key] = values[i]


class RowPlanMixin(LossMixin, RunStateMixin, DynamicSamplingMixin):
    """Mixed in before a TRL trainer class; see the module docstring. Subclasses set ``advantage_estimator`` (the
    estimator they dispatch to) and ``trainer_kind``."""

    advantage_estimator: ClassVar[str]
    trainer_kind: ClassVar[str]
    # Class-level defaults, set per instance by _init_row_plan: a trainer made without __init__ (TRL's own tests
    # build trainers with object.__new__) has no masking, and every override then returns TRL's own result.
    masking: ZeroStdArguments | None = None
    _generation_batch: GenerationBatch | None = None
    _loss_call: LossCall | None = None

    def _init_row_plan(self) -> None:
        self.masking = masking_settings(self.args)
        check_compatible(self.masking, self.args, self.trainer_kind)
        self.reward_range: tuple[float, float] | None = None
        self.stall_monitor = StallMonitor(advice=stall_advice(self.masking.zero_std_kl, self.masking.dynamic_sampling))
        self._generation_batch: GenerationBatch | None = None
        self._loss_call: LossCall | None = None
        self._rows_trained_this_step = 0
        self._init_dynamic_sampling()

    # -- hooks for the concrete trainers ----------------------------------------------------------------------

    def _generated_rows(self, generated: tuple) -> tuple[list[list[int]], list, dict]:
        """``(completion_ids, completions, extra_fields)`` from what the trainer's ``_generate`` returned."""
        raise NotImplementedError

    def _split_generated(self, generated: tuple) -> list[tuple]:
        """What the trainer's ``_generate`` returned, as one record per row (dynamic sampling regroups rows)."""
        raise NotImplementedError

    def _join_generated(self, records: list[tuple]) -> tuple:
        """The inverse of ``_split_generated``: TRL's ``_generate`` layout for the given rows."""
        raise NotImplementedError

    def _task_rewards(self, rewards_per_func: torch.Tensor) -> torch.Tensor:
        """``(N,)`` reward that decides zero variance."""
        return core.weighted_task_reward(rewards_per_func, self.reward_weights)

    def _advantage_options(self, batch: GenerationBatch) -> dict:
        """Keyword options of the trainer's advantage estimator (``estimators.py``)."""
        return {}

    def _scoring_needed(self, plan: core.RowPlan) -> torch.Tensor:
        """``(N,)`` bool: rows whose scoring log-probs (old policy, reference) something reads."""
        return plan.forwarded

    def _rejection_mode(self) -> bool:
        """Whether a row can be rejected by the old-policy forward's importance ratio (GRPO under vLLM)."""
        return False

    def _finish_output(self, output: dict, role: torch.Tensor) -> None:
        """Make trainer-specific outputs consistent with the rank's ``(B,)`` row roles."""

    # -- generation batch -------------------------------------------------------------------------------------

    def _generate_and_score_completions(self, inputs):
        # follows {GRPO,RLOO}Trainer._generate_and_score_completions (TRL 1.16): TRL's, then the plan applied
        if not self.model.training or self.masking is None:
            return super()._generate_and_score_completions(inputs)
        self._check_groups_share_prompt(inputs)
        self._generation_batch = batch = GenerationBatch(inputs=inputs)
        try:
            if self.prompt_stream is not None:  # dynamic sampling or prompt skipping
                refilled = self._generate_refilled(inputs, super()._generate)
                batch.inputs, batch.generated = refilled.rows, refilled.generated
                batch.rewards_per_func, batch.truncated = refilled.rewards_per_func, refilled.truncated
            return self._apply_plan(batch, super()._generate_and_score_completions(batch.inputs))
        finally:
            self._generation_batch = None

    def _prepared_prompts(self, rows: list[dict]) -> list:
        """TRL's prompts for this rank's ``rows`` as its ``_generate_and_score_completions`` prepares them (images
        put into the messages; environments drawn from TRL's pool, reset with their rows, observations appended, tool
        dicts built): TRL's method runs up to its ``_generate`` call, which hands the prompts back."""
        batch = self._generation_batch
        batch.preparing = True
        try:
            super()._generate_and_score_completions(rows)
        except PreparedPrompts as prepared:
            return prepared.prompts
        finally:
            batch.preparing = False
        raise RuntimeError("TRL's _generate_and_score_completions did not call _generate, as it does in TRL 1.16.")

    def _generate(self, prompts):
        # follows {GRPO,RLOO}Trainer._generate (TRL 1.16); relies on TRL giving _calculate_rewards these same prompts
        # and inputs
        batch = self._generation_batch
        if batch is None:
            return super()._generate(prompts)
        if batch.preparing:
            raise PreparedPrompts(prompts)
        if batch.generated is None:  # TRL's rows, generated once
            generated = super()._generate(prompts)
            batch.rewards_per_func, batch.truncated = self._score_generation(batch.inputs, prompts, generated)
            batch.generated = generated
        batch.whole_old_forward = self._rejection_mode()
        if not batch.whole_old_forward:
            self._decide_plan(batch, rejected=torch.zeros_like(batch.truncated))
        return batch.generated

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        # follows {GRPO,RLOO}Trainer._calculate_rewards (TRL 1.16): a training batch's rewards were scored in _generate
        batch = self._generation_batch
        if batch is not None and batch.rewards_per_func is not None:
            return batch.rewards_per_func
        return super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)

    def _score_generation(self, rows: list[dict], prompts: list, generated: tuple):
        """The gathered ``(N, K)`` rewards (TRL's arguments, once) and ``(N,)`` truncation of what was just generated
        for ``rows``, this rank's dataset rows (a rollout's extra fields are merged into them, as TRL does)."""
        completion_ids, completions, extra_fields = self._generated_rows(generated)
        merge_extra_fields(rows, extra_fields)
        rewards_per_func = super()._calculate_rewards(rows, prompts, completions, completion_ids)
        stop_tokens = [*self.eos_token_ids, self._tokenizer.pad_token_id]
        truncated = core.truncated_rows(completion_ids, stop_tokens) & bool(self.mask_truncated_completions)
        return rewards_per_func, gather(truncated.to(self.accelerator.device)).bool()

    def _decide_plan(self, batch: GenerationBatch, rejected: torch.Tensor) -> None:
        task_rewards = self._task_rewards(batch.rewards_per_func)
        valid = ~(batch.truncated | rejected)
        self.reward_range = core.widen_reward_range(self.reward_range, task_rewards, valid)
        batch.plan = core.decide_row_plan(
            task_rewards,
            self.num_generations,
            truncated=batch.truncated,
            unscorable=core.unscorable_rows(batch.rewards_per_func),
            rejected=rejected,
            mask_zero_std_groups=self.masking.mask_zero_std_groups,
            zero_std_atol=self.masking.zero_std_atol,
            exclude_masked_from_baseline=self.masking.exclude_masked_from_baseline,
            zero_std_kl=self.masking.zero_std_kl,
            reward_range=self.reward_range,
        )
        if self.masking.skip_masked_rows:
            needed = self._scoring_needed(batch.plan).view(self.accelerator.num_processes, -1)
            batch.scoring_rows = core.forward_rows(needed, self.accelerator.process_index)

    def _apply_plan(self, batch: GenerationBatch, output: dict) -> dict:
        """The plan applied to this rank's slice of TRL's output: advantages, loss masks, row roles, metrics."""
        plan = batch.plan
        if plan is None:
            raise RuntimeError("No row plan was decided: TRL did not run the scoring forward it runs in TRL 1.16.")
        advantages = get_advantage_estimator(self.advantage_estimator)(
            batch.rewards_per_func, self.reward_weights, self.num_generations, plan.stat_rows,
            **self._advantage_options(batch),
        ).masked_fill(plan.masked, 0.0)  # fmt: skip
        loss_mask = self._loss_mask(output)
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
        if self.masking.zero_std_normalization == "exclude" and "num_items_in_batch" in output:
            output["num_items_in_batch"] = (row_tokens * plan.forwarded).sum().to(output["num_items_in_batch"])
        self._finish_output(output, role)
        self._replace_logged_advantages(advantages)
        self._log_plan(plan, row_tokens)
        return output

    # -- forwards ---------------------------------------------------------------------------------------------

    def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep, *args, **kwargs):
        # follows {GRPO,RLOO}Trainer._get_per_token_logps_and_entropies (TRL 1.16): forwards the rows the plan reads
        forward = super()._get_per_token_logps_and_entropies
        if isinstance(self._loss_call, LossCall):
            return self._loss_forward(forward, model, input_ids, attention_mask, logits_to_keep, *args, **kwargs)
        batch = self._generation_batch
        if batch is None:
            return forward(model, input_ids, attention_mask, logits_to_keep, *args, **kwargs)
        rows = None if batch.whole_old_forward else batch.scoring_rows
        if rows is None:
            result = forward(model, input_ids, attention_mask, logits_to_keep, *args, **kwargs)
        else:
            rows = rows.to(input_ids.device)
            kwargs = select_rows(kwargs, rows, input_ids.shape[0])
            logps, entropies, aux_loss = forward(model, input_ids[rows], attention_mask[rows], logits_to_keep,
                                                 *args, **kwargs)  # fmt: skip
            result = (
                logps.new_zeros(input_ids.shape[0], logits_to_keep).index_put((rows,), logps),
                entropies,
                aux_loss,
            )
        completion_mask = attention_mask[:, -logits_to_keep:]
        batch.scoring_logps.append((result[0], completion_mask))
        if batch.whole_old_forward:  # TRL 1.16 under vLLM: the first scoring forward is the old policy's
            batch.whole_old_forward = False
            self._decide_plan(batch, rejected=self._rejected_rows(batch, result[0], completion_mask))
        return result

    def _rejected_rows(self, batch: GenerationBatch, old_logps: torch.Tensor, completion_mask: torch.Tensor):
        """``(N,)`` bool rows the old-policy forward's importance ratio rejects (GRPO under vLLM)."""
        raise NotImplementedError

    # -- helpers ----------------------------------------------------------------------------------------------

    @staticmethod
    def _loss_mask(batch: dict) -> torch.Tensor:
        mask = batch["completion_mask"]
        return mask * batch["tool_mask"] if batch.get("tool_mask") is not None else mask

    def _check_groups_share_prompt(self, inputs: list[dict]) -> None:
        prompts = gather_object([example.get("prompt", example) for example in inputs])
        bad_groups = core.mismatched_groups(prompts, self.num_generations)
        if bad_groups:
            first = bad_groups[0] * self.num_generations
            raise ValueError(
                f"Group(s) {bad_groups} of the generation batch mix dataset prompts (rows {first}.."
                f"{first + self.num_generations - 1}); each group must be num_generations={self.num_generations} "
                "consecutive rows of one prompt, as TRL's RepeatSampler gives them. Check a custom sampler, "
                "dataloader or rollout_func."
            )
