"""What the package logs and keeps across a run: plan metrics, the stall warning, and checkpointed state.

Metrics go through TRL's own metric store (``self._metrics["train"]``), so every tracker TRL reports to gets them.
A checkpoint carries ``trl_zerostd.json``: the package's settings (a resume under other settings is refused) and
its running state (the task-reward range that ``zero_std_kl="keep_failed"`` reads, the stall monitor, the prompt
stream of dynamic sampling and prompt skipping), and with prompt skipping ``trl_zerostd_prompt_skip.pt``: the
per-prompt history (two bytes a dataset row, too large for JSON) and the exploration probabilities.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import asdict

import torch
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from . import core
from .config import ZeroStdArguments

STATE_FILE = "trl_zerostd.json"
SKIP_STATE_FILE = "trl_zerostd_prompt_skip.pt"

logger = logging.getLogger("trl_zerostd")


class RunStateMixin:
    """Needs ``masking``, ``reward_range`` and ``stall_monitor`` (set by ``RowPlanMixin._init_row_plan``)."""

    def _log_plan(self, plan: core.RowPlan, row_tokens: torch.Tensor) -> None:
        """Train metrics of one generation batch; ``row_tokens`` ``(N,)`` are TRL's loss tokens per row."""
        metrics = self._metrics["train"]
        low_tied = plan.low_tied_groups.float().mean().item()
        metrics["zero_std/masked_group_frac"].append(plan.zero_std_groups.float().mean().item())
        metrics["zero_std/all_low_group_frac"].append(low_tied)
        metrics["zero_std/all_high_group_frac"].append(plan.high_tied_groups.float().mean().item())
        zero_std_tokens = (row_tokens * plan.reasons["zero_std"]).sum()
        metrics["zero_std/masked_token_frac"].append((zero_std_tokens / row_tokens.sum().clamp(min=1)).item())
        if self.masking.zero_std_kl != "mask":
            metrics["zero_std/kl_kept_row_frac"].append((plan.role == core.RowRole.KL_ONLY).float().mean().item())
        for reason in core.MASK_REASONS:
            metrics[f"masked/row_frac/{reason}"].append(plan.reasons[reason].float().mean().item())
        self._warn_once(self.stall_monitor.observe_batch(low_tied))

    def _replace_logged_advantages(self, advantages: torch.Tensor) -> None:
        """The completions table shows the advantages that train: TRL logged its own for the last ``N`` rows."""
        logged = self._logs["advantages"]
        for _ in range(len(advantages)):
            logged.pop()
        logged.extend(advantages.tolist())

    def _warn_once(self, message: str | None) -> None:
        if message is not None and self.accelerator.is_main_process:
            logger.warning(message)

    def _save_checkpoint(self, model, trial):
        # follows {GRPO,RLOO}Trainer._save_checkpoint (TRL 1.16): the package's settings and state travel with it
        super()._save_checkpoint(model, trial)
        if self.args.should_save and self.masking is not None:
            folder = os.path.join(
                self._get_output_dir(trial=trial), f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
            )
            with open(os.path.join(folder, STATE_FILE), "w") as f:
                json.dump(self._package_state(), f, indent=2)
            if self.prompt_skipper is not None:
                torch.save(self.prompt_skipper.state_dict(), os.path.join(folder, SKIP_STATE_FILE))

    def _load_optimizer_and_scheduler(self, checkpoint):
        # follows {GRPO,RLOO}Trainer._load_optimizer_and_scheduler (TRL 1.16): resuming restores the package's state
        super()._load_optimizer_and_scheduler(checkpoint)
        path = os.path.join(checkpoint, STATE_FILE) if checkpoint and self.masking is not None else None
        if path and os.path.exists(path):
            with open(path) as f:
                self._restore_package_state(json.load(f))
        skip_state = os.path.join(checkpoint, SKIP_STATE_FILE) if checkpoint else None
        if self.prompt_skipper is not None and skip_state and os.path.exists(skip_state):
            self.prompt_skipper.load_state_dict(torch.load(skip_state))

    def _package_state(self) -> dict:
        return {
            "settings": asdict(self.masking),
            "reward_range": self.reward_range,
            "stall_monitor": self.stall_monitor.state_dict(),
            "prompt_stream": self.prompt_stream.state_dict() if self.prompt_stream is not None else None,
            "informative_history": self.informative_history,
        }

    def _restore_package_state(self, state: dict) -> None:
        # The run's objects (prompt stream, skipper, stall monitor) were built from the run's own settings and
        # checked against its TRL config: a checkpoint made under other settings cannot be restored into them.
        saved = asdict(ZeroStdArguments(**state["settings"]))
        changed = [f"{k}: this run {getattr(self.masking, k)!r}, the checkpoint {v!r}"
                   for k, v in saved.items() if getattr(self.masking, k) != v]  # fmt: skip
        if changed:
            raise ValueError(
                "Resuming from a checkpoint made with other trl_zerostd settings: " + "; ".join(changed) + ". Resume "
                "with the checkpoint's settings, or start a new run (its state would not match these settings)."
            )
        self.reward_range = tuple(state["reward_range"]) if state["reward_range"] is not None else None
        self.stall_monitor.load_state_dict(state["stall_monitor"])
        if self.prompt_stream is not None and state.get("prompt_stream") is not None:
            self.prompt_stream.load_state_dict(state["prompt_stream"])
            self.informative_history = tuple(state["informative_history"])
