"""Seeing a stall coming: masked zero-variance groups put no gradient, so a policy whose groups all fail together
gets no pull back toward the reference and can stay there (docs/stability.md). Pure Python: no trainer import."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

OPTIONS = {
    "learning_rate": "a lower learning_rate",
    "zero_std_kl": "zero_std_kl='keep_failed' (keeps the KL term on groups that failed together)",
    "dynamic_sampling": "dynamic_sampling=True (refills the batch with informative groups)",
}


def stall_advice(zero_std_kl: str = "mask", dynamic_sampling: bool = False) -> str:
    """Why a stall happens and the ways out that the run does not use yet."""
    options = [OPTIONS["learning_rate"]]
    options += [OPTIONS["zero_std_kl"]] if zero_std_kl == "mask" else []
    options += [OPTIONS["dynamic_sampling"]] if not dynamic_sampling else []
    return (
        "Masked zero-variance groups put no policy gradient, so little pulls a policy whose groups all fail back "
        f"toward the reference. Options: {'; '.join(options)}."
    )


@dataclass
class StallMonitor:
    """Warns once when training stalls.

    A stall is ``patience`` consecutive optimizer steps that trained no row, or a mean share of groups tied at the
    lowest reward (binary verifier: all wrong) above ``low_tied_threshold`` over the last ``window`` generation
    batches. ``observe_*`` return the warning text the first time either happens, else None.
    """

    patience: int = 3
    window: int = 20
    low_tied_threshold: float = 0.5
    advice: str = field(default_factory=stall_advice)
    untrained_run: int = 0
    low_tied: deque = field(default_factory=deque)
    warned: bool = False

    def observe_step(self, trained_rows: int) -> str | None:
        """One optimizer step that trained ``trained_rows`` rows, all ranks together."""
        self.untrained_run = 0 if trained_rows else self.untrained_run + 1
        if self.untrained_run >= self.patience:
            return self._warn(f"{self.untrained_run} optimizer steps in a row trained no row (zero gradient)")
        return None

    def observe_batch(self, low_tied_frac: float) -> str | None:
        """One generation batch in which ``low_tied_frac`` of the groups tied at the lowest reward seen."""
        self.low_tied.append(low_tied_frac)
        while len(self.low_tied) > self.window:
            self.low_tied.popleft()
        mean = sum(self.low_tied) / len(self.low_tied)
        if len(self.low_tied) == self.window and mean > self.low_tied_threshold:
            return self._warn(
                f"{mean:.0%} of the groups of the last {self.window} generation batches tied at the lowest reward "
                f"seen (threshold {self.low_tied_threshold:.0%})"
            )
        return None

    def _warn(self, reason: str) -> str | None:
        if self.warned:
            return None
        self.warned = True
        return f"trl_zerostd: training is stalling: {reason}. {self.advice}"

    def state_dict(self) -> dict:
        return {"untrained_run": self.untrained_run, "low_tied": list(self.low_tied), "warned": self.warned}

    def load_state_dict(self, state: dict) -> None:
        self.untrained_run = state["untrained_run"]
        self.low_tied = deque(state["low_tied"])
        self.warned = state["warned"]
