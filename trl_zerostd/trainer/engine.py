"""How a training generation batch reaches the generation engine (vLLM or HF generate) through TRL's
``_generate_single_turn``, whatever shape a refill round has (docs/flow.md, "Generation engines").

- ``engine_calls``: a round is decoded in calls of at most TRL's own generation batch (the rows TRL sized vLLM's
  ``max_num_seqs`` and the user's HF-generate memory for), never more at once.
- ``aligned_copies``: TRL's server mode gathers every rank's prompts, keeps every ``n``-th one, asks the server for
  ``n`` completions of each and slices the result back by rank. That is right only where the gathered prompts are
  consecutive blocks of ``n`` identical ones; a call asks for the largest such ``n`` (TRL's ``num_generations`` on
  TRL's own batches, fewer on a refill round whose rows are not in aligned groups, down to one per row).
- ``HeldSleep``: colocated vLLM under sleep mode sleeps (weights discarded) after every generate call and is sent
  every weight again before the next; the policy does not change within a generation batch, so the engine stays
  awake between a batch's calls and sleeps once, after its last.

``aligned_copies`` and ``engine_calls`` are pure; ``decode_in_calls`` runs TRL's decode in those calls;
``HeldSleep`` wraps TRL's ``VLLMGeneration`` (its engine, mode and sleep flag through ``trl_layout``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from accelerate.utils import gather_object

from . import trl_layout


def aligned_copies(gathered_prompts: list, most: int) -> int:
    """The largest ``n <= most`` such that ``gathered_prompts`` (every rank's prompt token ids, rank-major) are
    consecutive blocks of ``n`` identical prompts; 1 at least (a block of one is always aligned)."""
    total = len(gathered_prompts)
    for n in range(min(most, total), 1, -1):
        if total % n == 0 and all(gathered_prompts[i] == gathered_prompts[i - i % n] for i in range(total)):
            return n
    return 1


def prompt_key(prompt_ids: list[int], images: list | None) -> tuple:
    """What makes two rows' prompts the same for the engine: their token ids and, with images, the images' pixels
    (two images of one size give the same image tokens; TRL's server path sends a block's first image only)."""
    if not images:
        return tuple(prompt_ids)
    digests = tuple(hashlib.blake2b(image.tobytes(), digest_size=8).hexdigest() + f"{image.size}{image.mode}"
                    for image in images)  # fmt: skip
    return tuple(prompt_ids), digests


def engine_calls(rows: int, most: int) -> list[slice]:
    """This rank's ``rows`` in consecutive calls of at most ``most`` rows (one call when they fit)."""
    most = max(most, 1)
    return [slice(start, min(start + most, rows)) for start in range(0, max(rows, 1), most)]


def decode_in_calls(
    prompt_ids: list,
    images: list | None,
    multimodal_fields: dict,
    copies: int,
    decode: Callable,
    most: int,
    server: bool,
    vllm_generation,
) -> list:
    """``decode(prompt_ids, images, multimodal_fields, copies)`` (TRL's ``_generate_single_turn``) as calls of at most
    ``most`` rows (TRL's generation batch; one call for HF generate with image fields, flat over images), each asking
    vLLM's ``server`` for as many ``copies`` per prompt as its gathered prompts (and images) hold aligned; the calls'
    results in row order. ``vllm_generation``: TRL's ``VLLMGeneration`` (None under HF generate)."""
    flat_images = vllm_generation is None and bool(multimodal_fields)
    results = []
    for rows in [slice(None)] if flat_images else engine_calls(len(prompt_ids), most):
        ids, call_images, n = prompt_ids[rows], None if images is None else images[rows], copies
        if server:  # every rank gathers, whether or not its rows have images
            keys = [prompt_key(row, None if call_images is None else call_images[i]) for i, row in enumerate(ids)]
            n = aligned_copies(gather_object(keys), copies)
        before_engine_call(vllm_generation)
        results.append(decode(ids, call_images, multimodal_fields, n))
    return results


class HeldSleep:
    """Stands in for a colocated ``vllm.LLM`` (``VLLMGeneration.llm``) over one generation batch: TRL's ``sleep`` is
    held until the batch ends, a ``wake_up`` of an engine that never slept is not passed on, and everything else is
    vLLM's own."""

    def __init__(self, vllm_generation) -> None:
        self._vllm_generation = vllm_generation
        self._llm = trl_layout.engine(vllm_generation)
        self.held_level: int | None = None

    def sleep(self, level: int = 1) -> None:
        self.held_level = level

    def wake_up(self, tags: list[str] | None = None) -> None:
        if self.held_level is None:
            self._llm.wake_up(tags=tags)

    def __getattr__(self, name):
        return getattr(self._llm, name)

    def before_call(self) -> None:
        """TRL marked the weights discarded after the last call; they were not (its sleep is held)."""
        if self.held_level is not None:
            trl_layout.set_weights_sleeping(self._vllm_generation, False)

    def release(self) -> None:
        """Give TRL its engine back and put it to sleep as TRL asked."""
        trl_layout.set_engine(self._vllm_generation, self._llm)
        if self.held_level is not None:
            self._llm.sleep(level=self.held_level)
            trl_layout.set_weights_sleeping(self._vllm_generation, True)


@contextmanager
def one_sleep_per_batch(vllm_generation) -> Iterator[None]:
    """Within the block, a colocated engine under sleep mode sleeps once, at the end (``HeldSleep``); any other
    engine (server mode, no sleep mode, HF generate: ``vllm_generation`` None) is left as it is."""
    if vllm_generation is None or not trl_layout.sleeps_after_each_call(vllm_generation):
        yield
        return
    if isinstance(trl_layout.engine(vllm_generation), HeldSleep):  # already held by an enclosing block
        yield
        return
    held = HeldSleep(vllm_generation)
    trl_layout.set_engine(vllm_generation, held)
    try:
        yield
    finally:
        held.release()


def before_engine_call(vllm_generation) -> None:
    """Called before each generate call of a batch: a held sleep keeps the weights TRL would send again."""
    held = None if vllm_generation is None else trl_layout.engine(vllm_generation)
    if isinstance(held, HeldSleep):
        held.before_call()
