"""TRL's GRPO and RLOO configs with the package's fields (``core.settings.ZeroStdArguments``), and the checks of the
settings against TRL's own fields (``check_compatible``, ``check_num_generations``)."""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, TypeVar

from trl import GRPOConfig, RLOOConfig

from ..core.settings import ZeroStdArguments, refuse_removed_fields, tied_groups_train, validate_settings

ConfigClass = TypeVar("ConfigClass", bound=type)


def check_num_generations(config) -> None:
    """Group-relative advantages compare at least 2 completions of a prompt in training."""
    if config.num_generations is not None and config.num_generations < 2:
        raise ValueError(
            f"num_generations must be at least 2 in training (got {config.num_generations}): a group of one "
            "completion has no baseline to compare with. num_generations_eval may be 1."
        )


def check_compatible(settings: ZeroStdArguments, args, kind: str, has_rollout_func: bool = False) -> None:
    """Refuse, naming the settings, the combinations with TRL's own fields (and a trainer's ``rollout_func``) that
    this package cannot honour."""
    if kind == "rloo" and tied_groups_train(settings):
        raise ValueError(
            f"tied_group_entropy_scale={settings.tied_group_entropy_scale!r} needs GRPO's loss: a row that trains on "
            "its group's tie carries its policy and KL terms (docs/SEMANTICS.md), and RLOO folds beta * KL into the "
            "reward before its baseline, so a tied group has no KL term of its own. Use ZeroStdGRPOTrainer, or leave "
            "tied_group_entropy_scale at 0."
        )
    if kind == "rloo" and settings.zero_std_kl != "mask":
        raise ValueError(
            f"zero_std_kl={settings.zero_std_kl!r} applies to GRPO's KL loss term; RLOO folds beta * KL into the "
            "reward before its baseline, so a tied group has no KL term of its own to keep. Use zero_std_kl='mask'."
        )
    if kind == "grpo" and settings.zero_std_kl != "mask" and getattr(args, "beta", None) == 0.0:
        raise ValueError(
            f"zero_std_kl={settings.zero_std_kl!r} with beta=0 (TRL's GRPO default): it keeps the KL term of tied "
            "groups, and with beta=0 there is none, so those rows would train nothing. Set beta > 0 (e.g. 0.04), or "
            "leave zero_std_kl='mask'."
        )
    # TRL's adaptive-entropy controller reads the mean entropy over the loss mask; rows in that mask without a
    # policy term would enter it (rule 3) unless top_entropy_quantile < 1, whose quantile we take over trained rows.
    if getattr(args, "use_adaptive_entropy", False) and getattr(args, "top_entropy_quantile", 1.0) >= 1.0:
        if settings.zero_std_kl != "mask":
            raise ValueError(
                f"use_adaptive_entropy with zero_std_kl={settings.zero_std_kl!r}: the rows kept for their KL term "
                "would enter the controller's mean entropy. Use zero_std_kl='mask' or top_entropy_quantile < 1."
            )
        if args.loss_type == "bnpo" and settings.zero_std_normalization == "keep":
            raise ValueError(
                "use_adaptive_entropy with loss_type='bnpo' and zero_std_normalization='keep': bnpo's token "
                "normaliser and the controller's mean entropy read one mask in TRL, so the masked rows' tokens would "
                "enter the controller. Use zero_std_normalization='exclude', another loss_type, or "
                "top_entropy_quantile < 1."
            )
    # A refill round hands a rollout_func rows that are not aligned groups of num_generations copies (a round's share
    # on a rank), and TRL's server path needs them aligned: VLLMGeneration.generate, which a rollout_func calls with
    # the trainer's num_generations, asks the server for them of every num_generations-th gathered prompt (TRL 1.16
    # trl/generation/vllm_generation.py, line 605), so a completion would train against another prompt.
    refills = settings.dynamic_sampling or settings.skip_zero_std_prompts
    server = getattr(args, "use_vllm", False) and getattr(args, "vllm_mode", "") == "server"
    if refills and has_rollout_func and server:
        raise ValueError(
            "dynamic_sampling and skip_zero_std_prompts with a rollout_func under use_vllm=True, vllm_mode='server': "
            "a refill round's rows are not aligned groups of num_generations copies, which TRL's server path "
            "assumes, so a completion could be trained against another prompt. Use vllm_mode='colocate', or turn "
            "dynamic_sampling and skip_zero_std_prompts off."
        )


def _refusing_removed_fields(config_cls: ConfigClass) -> ConfigClass:
    """``config_cls`` whose constructor refuses, by name, the fields of ``REMOVED_FIELDS``."""
    cls: Any = config_cls  # its generated __init__ is replaced, which the type checker cannot follow
    init = cls.__init__

    def __init__(self, *args, **kwargs):
        refuse_removed_fields(list(kwargs), cls.__name__)
        init(self, *args, **kwargs)

    __init__.__signature__ = inspect.signature(init)  # type: ignore[attr-defined]
    cls.__init__ = __init__
    return config_cls


@_refusing_removed_fields
@dataclass
class ZeroStdGRPOConfig(GRPOConfig, ZeroStdArguments):
    """``GRPOConfig`` plus the fields of ``ZeroStdArguments``."""

    def __post_init__(self):
        validate_settings(self)
        check_num_generations(self)
        super().__post_init__()


@_refusing_removed_fields
@dataclass
class ZeroStdRLOOConfig(RLOOConfig, ZeroStdArguments):
    """``RLOOConfig`` plus the fields of ``ZeroStdArguments``."""

    def __post_init__(self):
        validate_settings(self)
        check_num_generations(self)
        super().__post_init__()
