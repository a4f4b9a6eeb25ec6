"""Config fields of the package (SEMANTICS.md "Names"), as a mixin for TRL's GRPO and RLOO configs."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Literal

from trl import GRPOConfig, RLOOConfig


@dataclass
class ZeroStdArguments:
    """The fields this package adds. A plain ``GRPOConfig``/``RLOOConfig`` gets these defaults."""

    mask_zero_std_groups: bool = field(
        default=True,
        metadata={
            "help": "In training, mask every group whose valid rows all got the same reward (max - min <= "
            "zero_std_atol): zero advantage, zero loss mask, zero gradient (KL term included)."
        },
    )
    zero_std_atol: float = field(
        default=1e-6,
        metadata={"help": "A group is zero-variance when max - min of its weighted task reward is at most this."},
    )
    zero_std_normalization: Literal["keep", "exclude"] = field(
        default="keep",
        metadata={
            "help": "'keep': loss normalisers (token/row counts, num_items_in_batch) are the base trainer's, so "
            "with beta=0 the gradients equal TRL's. 'exclude': rows this package masks leave every normaliser."
        },
    )
    exclude_masked_from_baseline: bool = field(
        default=True,
        metadata={
            "help": "Leave masked rows (zero-variance, truncated, unscorable, rejected) out of every group mean/std, "
            "leave-one-out baseline and batch statistic that other rows' advantages come from."
        },
    )
    skip_masked_rows: bool = field(
        default=True,
        metadata={
            "help": "Do not forward masked rows: not in the policy update, and not in the reference and old-policy "
            "forwards while scoring (rewards are then computed first). Same loss and gradients, less compute. "
            "False keeps TRL's full forwards, for comparison."
        },
    )


ZERO_STD_FIELDS = tuple(f.name for f in fields(ZeroStdArguments))


def masking_settings(args) -> ZeroStdArguments:
    """The package's settings from any TRL config (missing fields take their defaults), validated."""
    settings = ZeroStdArguments(**{name: getattr(args, name) for name in ZERO_STD_FIELDS if hasattr(args, name)})
    validate_settings(settings)
    return settings


def validate_settings(settings: ZeroStdArguments) -> None:
    """Raise ValueError naming the field at fault."""
    if settings.zero_std_normalization not in ("keep", "exclude"):
        raise ValueError(
            f"zero_std_normalization must be 'keep' or 'exclude', got {settings.zero_std_normalization!r}."
        )
    if not settings.zero_std_atol >= 0:  # also rejects NaN
        raise ValueError(f"zero_std_atol must be >= 0 (reward units), got {settings.zero_std_atol!r}.")


def check_num_generations(config) -> None:
    """Group-relative advantages compare at least 2 completions of a prompt in training."""
    if config.num_generations is not None and config.num_generations < 2:
        raise ValueError(
            f"num_generations must be at least 2 in training (got {config.num_generations}): a group of one "
            "completion has no baseline to compare with. num_generations_eval may be 1."
        )


@dataclass
class ZeroStdGRPOConfig(GRPOConfig, ZeroStdArguments):
    """``GRPOConfig`` plus the fields of ``ZeroStdArguments``."""

    def __post_init__(self):
        validate_settings(self)
        check_num_generations(self)
        super().__post_init__()


@dataclass
class ZeroStdRLOOConfig(RLOOConfig, ZeroStdArguments):
    """``RLOOConfig`` plus the fields of ``ZeroStdArguments``."""

    def __post_init__(self):
        validate_settings(self)
        check_num_generations(self)
        super().__post_init__()
