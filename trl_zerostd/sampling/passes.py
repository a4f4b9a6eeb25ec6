"""The dataloader's passes over the train set, the same in a resumed run as in an unbroken one (pure).

A trainer resumed from a checkpoint builds its sampler afresh. A seeded sampler whose order comes from a generator that
runs on from pass to pass (TRL's ``RepeatSampler``) then draws the first pass's order again: resumed inside pass
``e > 0``, the trainer skips the batches already trained but of the wrong order, so the rest of that pass trains some
prompts twice and misses others, and every later pass repeats an earlier one. This bites where a run revisits its
prompts (several passes) and is resumed.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator

import torch
from torch.utils.data import Sampler

TRAINER_STATE = "trainer_state.json"  # transformers' TRAINER_STATE_NAME, in each checkpoint


def pass_in_progress(checkpoint: str) -> int:
    """The pass over the train set that a run resumed from ``checkpoint`` goes on in (0: the first): transformers'
    ``Trainer`` counts ``epoch`` as the passes done plus the share of the current one trained, exactly the next whole
    number at a pass's last step, and resumes in pass ``int(epoch)``; in the first where the checkpoint has no trainer
    state, as transformers does."""
    path = os.path.join(checkpoint, TRAINER_STATE)
    if not os.path.exists(path):
        return 0
    with open(path) as file:
        return int(json.load(file)["epoch"])


class ReplayedPasses(Sampler[int]):
    """``sampler`` (seeded with ``seed``, its randomness all in ``generator``), each pass the order that pass draws in
    an unbroken run. ``epoch`` is the pass the next ``__iter__`` draws: it counts the passes begun, and a resumed run
    sets it (``resume_at``) from the trainer's own count of passes, not from how far the sampler was read (a loader
    reads ahead of training, its worker processes several batches). The first pass after a resume reaches
    its order by drawing the passes before it (each a pass over the sampler's indices: cheap next to training on
    them)."""

    def __init__(self, sampler, generator: torch.Generator, seed: int):
        self.sampler, self.generator, self.seed = sampler, generator, seed
        self.epoch = 0
        self._generator_at: tuple[int, torch.Tensor] | None = None  # (pass, generator state at its start)

    def __len__(self) -> int:
        return len(self.sampler)

    def __iter__(self) -> Iterator[int]:
        epoch, self.epoch = self.epoch, self.epoch + 1
        if self._generator_at is not None and self._generator_at[0] == epoch:
            self.generator.set_state(self._generator_at[1])
        else:
            self.generator.manual_seed(self.seed)
            for _ in range(epoch):
                for _ in self.sampler:
                    pass
        yield from self.sampler
        self._generator_at = (epoch + 1, self.generator.get_state())

    def resume_at(self, epoch: int) -> None:
        """The next pass drawn is pass ``epoch`` (0: the first), as the resumed trainer counts it."""
        self.epoch, self._generator_at = epoch, None
