"""Drop-in GRPO/RLOO trainers for TRL in which rows masked out of training have no influence anywhere.

The package is laid out as its design (docs/flow.md):

- ``core``: the pure tensor math (groups, masks, advantages, the row plan of a batch) and the settings;
- ``sampling``: the pure sampling side (prompt streams, the success-rate predictor, the refill planner);
- ``trainer``: the adapter over TRL's trainers, 1.14.1-1.16 (overrides, TRL's layout in one module, the configs).

``core`` and ``sampling`` import nothing of TRL, transformers, accelerate, datasets or peft; the trainers and configs
below are imported (and TRL's version checked) when first used.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

__version__ = "0.3.0"
__all__ = ["ZeroStdArguments", "ZeroStdGRPOConfig", "ZeroStdGRPOTrainer", "ZeroStdRLOOConfig", "ZeroStdRLOOTrainer"]
EXPORTS = {
    "ZeroStdArguments": "trl_zerostd.core.settings",
    "ZeroStdGRPOConfig": "trl_zerostd.trainer.config",
    "ZeroStdRLOOConfig": "trl_zerostd.trainer.config",
    "ZeroStdGRPOTrainer": "trl_zerostd.trainer.grpo",
    "ZeroStdRLOOTrainer": "trl_zerostd.trainer.rloo",
}

if TYPE_CHECKING:
    from .core.settings import ZeroStdArguments
    from .trainer.config import ZeroStdGRPOConfig, ZeroStdRLOOConfig
    from .trainer.grpo import ZeroStdGRPOTrainer
    from .trainer.rloo import ZeroStdRLOOTrainer


def __getattr__(name: str):
    if name in EXPORTS:
        return getattr(importlib.import_module(EXPORTS[name]), name)
    raise AttributeError(f"module 'trl_zerostd' has no attribute {name!r}")
