"""Trainer plumbing shared by the GRPO and RLOO adapters: call TRL, then apply the core (``core.py``).

Training mode only; in eval every override returns TRL's own result untouched. The flow per generation batch:

1. ``_calculate_rewards`` computes TRL's gathered ``(N, K)`` rewards once and keeps them.
2. ``_generate_and_score_completions`` checks that every group shares one dataset prompt and runs TRL inside
   ``_scoring``: that records TRL's no-grad log-probs and, with ``skip_masked_rows``, scores the batch before TRL's
   reference/old-policy forwards so that those forward only rows that can train. Then it decides the row masks on
   the gathered batch, recomputes the advantages over the rows allowed into the statistics, zeroes the masked rows'
   loss masks and stores ``base_loss_mask`` (TRL's loss mask before ours) for the loss.
3. ``_compute_loss`` hands TRL the micro-batch rows the normalisation mode keeps and forwards only the rows that
   train; the others are placeholders whose log-probs are constants, so they add exactly zero loss and gradient.
"""

from __future__ import annotations

import json
import logging
import os
from contextlib import contextmanager
from dataclasses import asdict

import torch
from accelerate.utils import gather, gather_object
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from . import core
from .config import ZeroStdArguments, masking_settings

IMAGE_KEYS = ("pixel_values", "num_images")
SETTINGS_FILE = "zero_std_settings.json"

logger = logging.getLogger(__name__)


@contextmanager
def patched(obj, **replacements):
    """Within the block ``obj.<name>`` is the replacement; after it, the instance's own attribute (a test's stub,
    say) comes back, or the class's method shows through again."""
    previous = {name: vars(obj)[name] for name in replacements if name in vars(obj)}
    for name, replacement in replacements.items():
        setattr(obj, name, replacement)
    try:
        yield
    finally:
        for name in replacements:
            if name in previous:
                setattr(obj, name, previous[name])
            else:
                delattr(obj, name)


def merge_extra_fields(inputs: list[dict], extra_fields: dict) -> None:
    """Merge a rollout_func's ``extra_fields`` into ``inputs`` in place, as GRPOTrainer does (TRL 1.16) just before
    ``_calculate_rewards``: a list gives row ``i`` its ``i``-th value, anything else goes to every row."""
    for i, example in enumerate(inputs):
        for key, values in extra_fields.items():
            if isinstance(values, list) and i < len(values):
                example[key] = values[i]
            elif not isinstance(values, list):
                example[key] = values


def rows_to_forward(skippable: torch.Tensor, rank: int) -> torch.Tensor | None:
    """This rank's rows for a scoring forward, from the gathered ``(world_size, B)`` bool ``skippable``.

    Every rank forwards as many rows, the most unskippable rows any rank has (at least one): TRL chunks the forward
    by a fixed batch size, so every rank makes the same number of model calls (DDP, ZeRO-3/FSDP gathers). A rank
    with fewer pads with skippable rows. Returns ``(R,)`` row indices, or None when the rank forwards every row.
    """
    count = max(int((~skippable).sum(dim=1).max()), 1)
    if count == skippable.shape[1]:
        return None
    return torch.argsort(skippable[rank].int(), stable=True)[:count]


def select_rows(batch: dict, rows: torch.Tensor, batch_size: int) -> dict:
    """The given rows of every per-row entry (first dimension ``batch_size``); other entries as they are."""
    selected = {}
    for key, value in batch.items():
        if isinstance(value, torch.Tensor) and value.ndim > 0 and value.shape[0] == batch_size:
            selected[key] = value[rows.to(value.device)]
        elif isinstance(value, list) and len(value) == batch_size:
            selected[key] = [value[i] for i in rows.tolist()]
        else:
            selected[key] = value
    return selected


class RowMaskingMixin:
    """Mixed in before a TRL trainer class; see the module docstring."""

    def _init_row_masking(self) -> None:
        self.masking = masking_settings(self.args)
        self._gathered_rewards_per_func: torch.Tensor | None = None
        self._recorded_logps: list[tuple[torch.Tensor, torch.Tensor]] | None = None

    # -- hooks for the concrete trainers ----------------------------------------------------------------------

    def _task_rewards(self, rewards_per_func: torch.Tensor) -> torch.Tensor:
        """``(N,)`` reward that decides zero variance."""
        return core.weighted_task_reward(rewards_per_func, self.reward_weights)

    def _row_advantages(self, rewards_per_func: torch.Tensor, stat_rows: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def _generation_outputs(self, generated: tuple) -> tuple[list[list[int]], list, dict]:
        """``(completion_ids_list, completions, extra_fields)`` from what the trainer's ``_generate`` returned."""
        raise NotImplementedError

    def _scoring_skippable(self, masks: core.RowMasks) -> torch.Tensor:
        """``(N,)`` bool: rows whose scoring log-probs (reference, old policy) nothing reads. Masked rows: their loss
        mask is zeroed, so the loss treats them as placeholders."""
        return masks.masked

    def _skips_scoring_forward(self, call: int) -> bool:
        """Whether TRL's ``call``-th no-grad forward of the batch (0: the first) may leave skippable rows out."""
        return True

    def _token_mean_metrics(self) -> tuple[str, ...]:
        """Metrics TRL's loss logs as means over the loss mask's tokens, to which placeholders add zeros."""
        return ()

    def _finish_masked_output(self, output: dict, local_masked: torch.Tensor) -> None:
        """Make trainer-specific outputs consistent with the zeroed rows."""

    def _placeholder_inputs(self, inputs: dict, placeholders: torch.Tensor, base_loss_mask: torch.Tensor) -> dict:
        """Under ``"keep"``, adjust the rows the loss counts but does not train (``placeholders``, ``(B,)`` bool)."""
        return inputs

    # -- overrides ------------------------------------------------------------------------------------------

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        # follows {GRPO,RLOO}Trainer._calculate_rewards (TRL 1.16): once per generation batch, early (see _scoring)
        # or where TRL calls it; TRL's call then gets the kept gathered rewards, which our masks read too
        if self._gathered_rewards_per_func is None:
            self._gathered_rewards_per_func = super()._calculate_rewards(
                inputs, prompts, completions, completion_ids_list
            )
        return self._gathered_rewards_per_func

    def _generate_and_score_completions(self, inputs):
        # follows {GRPO,RLOO}Trainer._generate_and_score_completions (TRL 1.16): TRL within _scoring, then our masks
        self._gathered_rewards_per_func = None  # a new generation batch
        if not self.model.training:
            return super()._generate_and_score_completions(inputs)
        self._check_groups_share_prompt(inputs)
        with self._scoring(inputs):
            return self._mask_rows(super()._generate_and_score_completions(inputs))

    def _compute_loss(self, model, inputs):
        # follows {GRPO,RLOO}Trainer._compute_loss (TRL 1.16): TRL's loss on the planned rows
        if not self.model.training or "base_loss_mask" not in inputs:
            return super()._compute_loss(model, inputs)
        inputs = dict(inputs)
        base_loss_mask = inputs.pop("base_loss_mask")
        loss_mask = self._loss_mask(inputs)
        if any(key in inputs for key in IMAGE_KEYS):  # image tensors are not per row: keep and forward every row
            if self.masking.zero_std_normalization == "exclude":
                raise NotImplementedError("zero_std_normalization='exclude' does not support image inputs yet.")
            rows = core.LossRows(kept=torch.arange(len(loss_mask)), active=(loss_mask.sum(dim=1) > 0).nonzero()[:, 0])
            forward_all = True
        else:
            rows = core.plan_loss_rows(loss_mask, base_loss_mask, self.masking.zero_std_normalization)
            inputs = select_rows(inputs, rows.kept, len(loss_mask))
            base_loss_mask = base_loss_mask[rows.kept.to(base_loss_mask.device)]
            forward_all = not self.masking.skip_masked_rows
        active = rows.active.to(loss_mask.device)
        placeholders = torch.ones(len(base_loss_mask), dtype=torch.bool, device=loss_mask.device)
        placeholders[active] = False
        # Placeholder log-probs equal the old and the reference ones: importance ratio 1, KL 0, loss exactly 0.
        fill_logps = inputs.get("old_per_token_logps")
        if fill_logps is None:
            fill_logps = torch.zeros(inputs["completion_ids"].shape, device=loss_mask.device)
        if inputs.get("ref_per_token_logps") is not None:
            inputs["ref_per_token_logps"] = torch.where(
                placeholders.unsqueeze(1), fill_logps, inputs["ref_per_token_logps"]
            )
        if self.masking.zero_std_normalization == "keep":
            inputs = self._placeholder_inputs(inputs, placeholders, base_loss_mask)
        with self._forwarding_only(active, fill_logps, forward_all):
            loss = super()._compute_loss(model, inputs)
        if self.masking.zero_std_normalization == "keep" and self._token_mean_metrics():
            self._rescale_token_means(self._loss_mask(inputs), active)
        return loss

    def _rescale_token_means(self, loss_mask: torch.Tensor, active: torch.Tensor) -> None:
        """Under "keep", TRL's token means (``_token_mean_metrics``) count the placeholders' tokens, which add zeros:
        rescale the values just logged to means over the trained tokens, as TRL's own are."""
        counts = torch.stack([loss_mask.sum(), loss_mask[active].sum()]).float()
        all_tokens, trained_tokens = self.accelerator.reduce(counts, reduction="sum").tolist()
        if trained_tokens == 0:
            return
        for key in self._token_mean_metrics():
            values = self._metrics["train"].get(key)
            if values:
                values[-1] *= all_tokens / trained_tokens

    def _save_checkpoint(self, model, trial):
        # follows {GRPO,RLOO}Trainer._save_checkpoint (TRL 1.16): the package's fields travel with the checkpoint
        super()._save_checkpoint(model, trial)
        if self.args.should_save:
            folder = os.path.join(
                self._get_output_dir(trial=trial), f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
            )
            with open(os.path.join(folder, SETTINGS_FILE), "w") as f:
                json.dump(asdict(self.masking), f, indent=2)

    def _load_optimizer_and_scheduler(self, checkpoint):
        # follows {GRPO,RLOO}Trainer._load_optimizer_and_scheduler (TRL 1.16): resuming restores the package's fields
        super()._load_optimizer_and_scheduler(checkpoint)
        path = os.path.join(checkpoint, SETTINGS_FILE) if checkpoint else None
        if path and os.path.exists(path):
            with open(path) as f:
                saved = ZeroStdArguments(**json.load(f))
            changed = {k: v for k, v in asdict(saved).items() if getattr(self.masking, k) != v}
            if changed:
                logger.warning(f"Resuming with the checkpoint's trl_zerostd settings {changed} (the run's differ).")
            self.masking = saved

    # -- helpers --------------------------------------------------------------------------------------------

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

    def _truncated_rows(self, completion_ids: torch.Tensor, completion_mask: torch.Tensor) -> torch.Tensor:
        """``(B,)`` bool: rows TRL masked as truncated (``mask_truncated_completions``)."""
        truncated = core.truncated_rows(completion_ids, completion_mask, self.processing_class.pad_token_id)
        return truncated & bool(self.mask_truncated_completions)

    def _decide_masks(self, truncated: torch.Tensor, rejected: torch.Tensor) -> core.RowMasks:
        """The row masks of the gathered batch from the kept rewards and the gathered ``(N,)`` bool row flags."""
        rewards_per_func = self._gathered_rewards_per_func
        return core.decide_row_masks(
            self._task_rewards(rewards_per_func),
            self.num_generations,
            truncated=truncated,
            unscorable=core.unscorable_rows(rewards_per_func),
            rejected=rejected,
            mask_zero_std_groups=self.masking.mask_zero_std_groups,
            zero_std_atol=self.masking.zero_std_atol,
            exclude_masked_from_baseline=self.masking.exclude_masked_from_baseline,
        )

    def _mask_rows(self, output: dict) -> dict:
        """Decide the masks on the gathered batch, then apply this rank's slice of them to ``output``."""
        rewards_per_func = self._gathered_rewards_per_func
        loss_mask = self._loss_mask(output)
        local_batch = loss_mask.shape[0]
        device = loss_mask.device
        truncated = self._truncated_rows(output["completion_ids"], output["completion_mask"])
        is_mode = getattr(self, "vllm_importance_sampling_mode", None)  # RLOO has none
        rejected = core.rejected_rows(output.get("importance_sampling_ratio"), is_mode, local_batch).to(device)
        local_rows = torch.stack([truncated.long(), rejected.long(), loss_mask.sum(dim=1).long()], dim=1)
        truncated, rejected, row_tokens = gather(local_rows).unbind(dim=1)
        masks = self._decide_masks(truncated.bool(), rejected.bool())
        advantages = self._row_advantages(rewards_per_func, masks.stat_rows).masked_fill(masks.masked, 0.0)
        self._replace_logged_advantages(advantages)

        rank = self.accelerator.process_index
        process_slice = slice(rank * local_batch, (rank + 1) * local_batch)
        local_masked = masks.masked[process_slice].to(device)
        output["advantages"] = advantages[process_slice].to(output["advantages"].dtype)
        output["base_loss_mask"] = loss_mask
        keep_tokens = (~local_masked).unsqueeze(1).to(output["completion_mask"].dtype)
        output["completion_mask"] = output["completion_mask"] * keep_tokens
        if output.get("tool_mask") is not None:
            output["tool_mask"] = output["tool_mask"] * keep_tokens
        if self.masking.zero_std_normalization == "exclude" and "num_items_in_batch" in output:
            output["num_items_in_batch"] = (row_tokens * masks.trainable).sum().to(output["num_items_in_batch"])
        self._finish_masked_output(output, local_masked)
        self._log_masks(masks, row_tokens)
        return output

    def _replace_logged_advantages(self, advantages: torch.Tensor) -> None:
        """The completions table shows the advantages that train: TRL logged its own for the last ``N`` rows."""
        logged = self._logs["advantages"]
        for _ in range(len(advantages)):
            logged.pop()
        logged.extend(advantages.tolist())

    def _log_masks(self, masks: core.RowMasks, row_tokens: torch.Tensor) -> None:
        metrics = self._metrics["train"]
        metrics["zero_std/masked_group_frac"].append(masks.zero_std_groups.float().mean().item())
        zero_std_tokens = (row_tokens * masks.reasons["zero_std"]).sum()
        metrics["zero_std/masked_token_frac"].append((zero_std_tokens / row_tokens.sum().clamp(min=1)).item())
        for reason in core.MASK_REASONS:
            metrics[f"masked/row_frac/{reason}"].append(masks.reasons[reason].float().mean().item())

    @contextmanager
    def _scoring(self, inputs: list[dict]):
        """Within the block (TRL scoring one training batch), TRL's no-grad forwards append ``(logps,
        completion_mask)``, both ``(B, T)``, to ``_recorded_logps``; with ``skip_masked_rows`` they forward only the
        rows that can train.

        Which rows those are depends on the rewards, which TRL computes after these forwards. So on the first forward
        that may skip, the batch is scored early on exactly the arguments TRL will give ``_calculate_rewards`` (the
        prompts ``_generate`` got, its completions and ids, ``inputs`` with its extra fields merged), in TRL's grad
        mode; TRL's own call then gets the kept result. Skipped rows get log-probs 0: their loss mask is zeroed and
        they are outside every statistic (``_scoring_skippable``), so no output changes, only what TRL logs from
        those log-probs (RLOO's ``kl``, see ``ZeroStdRLOOTrainer``). Multimodal forwards (image tensors are not per
        row) forward every row.
        """
        trl_generate, trl_forward = self._generate, self._get_per_token_logps_and_entropies
        grad_enabled = torch.is_grad_enabled()
        generation = []  # [prompts, what _generate returned]
        plan = []  # [this rank's rows to forward, None for all], decided once
        self._recorded_logps = []

        def generate(prompts):
            generation[:] = [prompts, trl_generate(prompts)]
            return generation[1]

        def forward(model, input_ids, attention_mask, logits_to_keep, *args, **kwargs):
            completion_ids, completion_mask = input_ids[:, -logits_to_keep:], attention_mask[:, -logits_to_keep:]
            may_skip = (
                self.masking.skip_masked_rows
                and bool(generation)
                and self._skips_scoring_forward(len(self._recorded_logps))
                and all(value is None for key, value in kwargs.items() if key != "batch_size")  # text only
            )
            if may_skip and not plan:
                with torch.set_grad_enabled(grad_enabled):
                    skippable = self._score_early(inputs, *generation, completion_ids, completion_mask)
                world = self.accelerator.num_processes
                plan.append(rows_to_forward(skippable.view(world, -1), self.accelerator.process_index))
            rows = plan[0] if may_skip else None
            if rows is None:
                result = trl_forward(model, input_ids, attention_mask, logits_to_keep, *args, **kwargs)
            else:
                rows = rows.to(input_ids.device)
                logps, entropies, aux_loss = trl_forward(
                    model, input_ids[rows], attention_mask[rows], logits_to_keep, *args, **kwargs
                )
                result = (logps.new_zeros(completion_ids.shape).index_put((rows,), logps), entropies, aux_loss)
            self._recorded_logps.append((result[0], completion_mask))
            return result

        try:
            with patched(self, _generate=generate, _get_per_token_logps_and_entropies=forward):
                yield
        finally:
            self._recorded_logps = None

    def _score_early(
        self,
        inputs: list[dict],
        prompts: list,
        generated: tuple,
        completion_ids: torch.Tensor,
        completion_mask: torch.Tensor,
    ) -> torch.Tensor:
        """Compute (and keep) the rewards TRL will compute, then return the gathered ``(N,)`` bool skippable rows.

        ``completion_ids``/``completion_mask`` are this rank's ``(B, T)`` tensors TRL forwards. No row is known to be
        rejected yet; rejection only adds masked rows, so every row skipped here is masked in the end.
        """
        completion_ids_list, completions, extra_fields = self._generation_outputs(generated)
        if extra_fields:
            merge_extra_fields(inputs, extra_fields)
        self._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        truncated = gather(self._truncated_rows(completion_ids, completion_mask).long()).bool()
        return self._scoring_skippable(self._decide_masks(truncated, rejected=torch.zeros_like(truncated)))

    @contextmanager
    def _forwarding_only(self, active: torch.Tensor, fill_logps: torch.Tensor, forward_all: bool):
        """Within the block, the loss's policy forward trains only the ``active`` rows.

        Other rows get ``fill_logps`` ``(B, T)`` and zero entropy, as constants: zero loss, zero gradient. They are
        not forwarded unless ``forward_all``. With no active row one row is still forwarded at zero weight, so every
        rank runs the same forward and collectives (DDP, ZeRO-3/FSDP gathers).
        """
        trl_forward = self._get_per_token_logps_and_entropies

        def place(fill: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
            if forward_all:
                out = out[active]
            if len(active) == 0:
                return fill.to(out.dtype) + 0.0 * out.sum()
            return fill.to(out.dtype).index_put((active,), out)

        def forward(model, input_ids, attention_mask, logits_to_keep, *args, **kwargs):
            if forward_all:
                rows = torch.arange(input_ids.shape[0], device=input_ids.device)
            else:
                rows = active if len(active) else torch.zeros(1, dtype=torch.long, device=input_ids.device)
            logps, entropies, aux_loss = trl_forward(
                model, input_ids[rows], attention_mask[rows], logits_to_keep, *args, **kwargs
            )
            if entropies is not None:
                entropies = place(torch.zeros_like(fill_logps), entropies)
            if aux_loss is not None and len(active) == 0:
                aux_loss = 0.0 * aux_loss
            return place(fill_logps, logps), entropies, aux_loss

        with patched(self, _get_per_token_logps_and_entropies=forward):
            yield
