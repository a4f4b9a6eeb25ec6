"""Drop-in GRPO/RLOO trainers for TRL in which rows masked out of training have no influence anywhere."""

from ._compat import check_trl_version

check_trl_version()

from .config import ZeroStdArguments, ZeroStdGRPOConfig, ZeroStdRLOOConfig  # noqa: E402
from .grpo import ZeroStdGRPOTrainer  # noqa: E402
from .rloo import ZeroStdRLOOTrainer  # noqa: E402

__all__ = ["ZeroStdArguments", "ZeroStdGRPOConfig", "ZeroStdGRPOTrainer", "ZeroStdRLOOConfig", "ZeroStdRLOOTrainer"]
__version__ = "0.2.0"
