"""Seeing a stall coming: masked zero-variance groups put no gradient, so a policy whose groups all fail together
gets no pull back toward the reference and can stay there (docs/studies/stability.md). Pure Python: no trainer
import."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field


def stall_advice(
    cause: str = "failed",
    zero_std_kl: str = "mask",
    dynamic_sampling: bool = False,
    beta: float = 0.0,
    kind: str = "grpo",
) -> str:
    """Why a stall of this ``cause`` happens and the ways out that would help and that the run does not use yet:
    ``"failed"`` (groups tied at the lowest reward seen), ``"solved"`` (at the highest), ``"tied"`` (at the one reward
    seen so far), ``"truncated"`` (rows cut at max_completion_length and masked). ``zero_std_kl='keep_failed'`` is
    offered to GRPO only, and with ``beta=0`` together with ``beta > 0``: with no KL term it has nothing to keep."""
    if cause == "truncated":
        return (
            "Most rows were truncated (no EOS within max_completion_length) and masked by "
            "mask_truncated_completions, so no group has a reward signal to train on. Options: a higher "
            "max_completion_length; mask_truncated_completions=False (truncated rows then train on their reward)."
        )
    refill = [] if dynamic_sampling else ["dynamic_sampling=True (refills the batch with informative groups)"]
    if cause == "tied":
        return (
            "Every group tied at the one reward seen so far, so no group has a signal to train on. Options: "
            f"{'; '.join(['reward functions that tell completions apart (partial credit)', *refill])}."
        )
    if cause == "solved":
        return (
            "The groups tie at the highest reward seen: the prompts are solved and give no policy gradient. "
            f"Options: {'; '.join(['harder prompts', *refill])}."
        )
    options = ["a lower learning_rate"]
    if kind == "grpo" and zero_std_kl == "mask":
        keep = "zero_std_kl='keep_failed' (keeps the KL term on groups that failed together)"
        options.append(keep if beta > 0 else f"beta > 0 with {keep}; with beta=0 there is no KL term to keep")
    return (
        "Masked zero-variance groups put no policy gradient, so little pulls a policy whose groups all fail back "
        f"toward the reference. Options: {'; '.join(options + refill)}."
    )


@dataclass
class StallMonitor:
    """Warns once when training stalls.

    A stall is ``patience`` consecutive optimizer steps that trained no row, or a mean share of groups tied at the
    lowest reward (binary verifier: all wrong) above ``low_tied_threshold`` over the last ``window`` generation
    batches. ``observe_*`` return the warning text the first time either happens, else None; its advice
    (``advice(cause)``) follows the cause the last generation batch shows, since what helps depends on it.
    """

    patience: int = 3
    window: int = 20
    low_tied_threshold: float = 0.5
    advice: Callable[[str], str] = stall_advice
    untrained_run: int = 0
    low_tied: deque = field(default_factory=deque)
    warned: bool = False
    cause: str = "failed"

    def observe_step(self, trained_rows: int) -> str | None:
        """One optimizer step that trained ``trained_rows`` rows, all ranks together."""
        self.untrained_run = 0 if trained_rows else self.untrained_run + 1
        if self.untrained_run >= self.patience:
            return self._warn(f"{self.untrained_run} optimizer steps in a row trained no row (zero gradient)")
        return None

    def observe_batch(
        self, low_tied_frac: float, high_tied_frac: float = 0.0, truncated_frac: float = 0.0
    ) -> str | None:
        """One generation batch in which ``low_tied_frac`` / ``high_tied_frac`` of the groups tied at the lowest /
        highest reward seen and ``truncated_frac`` of the rows were masked as truncated."""
        if truncated_frac >= 0.5:
            self.cause = "truncated"
        elif low_tied_frac == high_tied_frac == 0:
            self.cause = "tied"
        else:
            self.cause = "solved" if high_tied_frac > low_tied_frac else "failed"
        self.low_tied.append(low_tied_frac)
        while len(self.low_tied) > self.window:
            self.low_tied.popleft()
        mean = sum(self.low_tied) / len(self.low_tied)
        if len(self.low_tied) == self.window and mean > self.low_tied_threshold:
            return self._warn(
                f"{mean:.0%} of the groups of the last {self.window} generation batches tied at the lowest reward "
                f"seen (threshold {self.low_tied_threshold:.0%})",
                "failed",
            )
        return None

    def _warn(self, reason: str, cause: str | None = None) -> str | None:
        if self.warned:
            return None
        self.warned = True
        return f"trl_zerostd: training is stalling: {reason}. {self.advice(cause or self.cause)}"

    def state_dict(self) -> dict:
        return {
            "untrained_run": self.untrained_run, "low_tied": list(self.low_tied), "warned": self.warned,
            "cause": self.cause,
        }  # fmt: skip

    def load_state_dict(self, state: dict) -> None:
        self.untrained_run = state["untrained_run"]
        self.low_tied = deque(state["low_tied"])
        self.warned = state["warned"]
        self.cause = state.get("cause", "failed")
