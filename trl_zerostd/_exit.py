"""Ending a multi-process run cleanly without a line in the user's script.

Torch leaves gloo's worker threads (and FSDP's or DeepSpeed's communication handles, held by the accelerator's models
and optimizers) alive into interpreter shutdown unless the process group is destroyed first; a two-process CPU run
can then abort after training finished (``terminate called without an active exception``, exit code 1;
``tests/stress_launches.py`` shows it with plain torch and no TRL). A trainer that finds a process group registers,
once per process, an ``atexit`` handler that drops the accelerator's models and optimizers and destroys the group
while the interpreter is still whole. It runs only at exit, so a script that goes on after ``train()`` (evaluates,
saves, trains again) keeps its group; a script that already destroyed it is left as it is.
"""

from __future__ import annotations

import atexit
import gc
import weakref

import torch

_registered = False


def end_process_group_at_exit(accelerator) -> None:
    """Register the exit handler for ``accelerator``'s run if a process group is initialised (once per process)."""
    global _registered
    if _registered or not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return
    atexit.register(_end_process_group, weakref.ref(accelerator))
    _registered = True


def _end_process_group(accelerator_ref: weakref.ref) -> None:
    accelerator = accelerator_ref()
    if accelerator is not None:
        accelerator.free_memory()
    gc.collect()
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
