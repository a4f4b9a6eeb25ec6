"""Ending a multi-process run cleanly without a line in the user's script.

Torch leaves gloo's worker threads (and FSDP's or DeepSpeed's communication handles, held by the accelerator's models
and optimizers) alive into interpreter shutdown unless the process group is destroyed first; a two-process CPU run
can then abort after training finished (``terminate called without an active exception``, exit code 1;
``tests/tools/stress_launches.py`` shows it with plain torch and no TRL). A trainer that finds a process group arms,
once per process, an ``atexit`` handler that drops the accelerator's models and optimizers and destroys the group while
the interpreter is still whole. It runs only at exit, so a script that goes on after ``train()`` (evaluates, saves,
trains again) keeps its group; a script that already destroyed it is left as it is.

The handler is registered when this module is imported, before any trainer exists, and armed later: ``atexit`` runs
handlers last-registered first, so whatever registers its own shutdown while a trainer is built (colocated vLLM, whose
engine sets up process groups of its own over the trainer's) shuts down before the groups it uses are destroyed.
Where vLLM is loaded, its model-parallel groups are destroyed first, as vLLM's own teardown does.
"""

from __future__ import annotations

import atexit
import gc
import logging
import sys
import weakref

import torch

logger = logging.getLogger("trl_zerostd")
_armed: weakref.ref | None = None


def end_process_group_at_exit(accelerator) -> None:
    """Arm the exit handler for ``accelerator``'s run if a process group is initialised (the first trainer's)."""
    global _armed
    if _armed is not None or not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return
    _armed = weakref.ref(accelerator)


def _end_process_group() -> None:
    if _armed is None:
        return
    accelerator = _armed()
    if accelerator is not None:
        accelerator.free_memory()
    gc.collect()
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return
    parallel_state = sys.modules.get("vllm.distributed.parallel_state")
    if parallel_state is not None:
        try:
            parallel_state.destroy_model_parallel()
        except Exception as error:  # vLLM's teardown is its own; ours still destroys the group
            logger.warning(f"vLLM's destroy_model_parallel failed at exit: {error}")
    torch.distributed.destroy_process_group()


atexit.register(_end_process_group)
