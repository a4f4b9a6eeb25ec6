"""The package's settings (pure; SEMANTICS.md "Names"): the fields it adds to TRL's configs (``ZeroStdArguments``,
a mixin of ``trainer.config``'s GRPO and RLOO configs), the checks of their values and of each other
(``validate_settings``), and the fields an earlier version had (``REMOVED_FIELDS``), refused by name wherever they
appear. The checks against TRL's own fields are ``trainer.config.check_compatible``."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Literal, get_args, get_origin, get_type_hints


@dataclass
class ZeroStdArguments:
    """The fields this package adds. A plain ``GRPOConfig``/``RLOOConfig`` gets these defaults."""

    mask_zero_std_groups: bool = field(
        default=True,
        metadata={
            "help": "In training, mask every group whose valid rows all got the same reward (max - min <= "
            "zero_std_atol): zero advantage, zero loss mask, zero gradient (KL term included, see zero_std_kl)."
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
    zero_std_kl: Literal["mask", "keep_failed", "keep"] = field(
        default="mask",
        metadata={
            "help": "GRPO with beta > 0: the KL term of zero-variance rows. 'mask': none (every masked row puts zero "
            "gradient). 'keep_failed': kept on groups tied at the lowest task reward seen in training (binary "
            "verifier: all wrong), which pulls a collapsed policy back toward the reference. 'keep': kept on every "
            "zero-variance group. Kept rows train on their KL term only and stay out of every statistic."
        },
    )
    tied_group_entropy_scale: float = field(
        default=0.0,
        metadata={
            "help": "GRPO (RL-ZVP): above 0, the rows of a zero-variance group with at least two valid rows, all tied "
            "at the lowest or highest task reward seen in training, train on token advantages from the policy's "
            "entropy at this scale (per nat): +scale*H(t) on an all-right group, -scale*(max H - H(t)) on an "
            "all-wrong one. Their rows then train (policy and KL terms) and count in every normaliser; they never "
            "enter another group's advantage. 0.2 led 0.1 and 0.4 on the real model. 0: they are masked."
        },
    )
    dynamic_sampling: bool = field(
        default=False,
        metadata={
            "help": "Refill each generation batch with further prompts (a seeded stream over the train dataset) until "
            "it holds generation_batch_size / num_generations informative groups (two valid rows with different task "
            "rewards); the other groups are dropped. At the cap (dynamic_sampling_max_rounds) the batch is "
            "completed with the best groups generated, which train masked (a warning once)."
        },
    )
    dynamic_sampling_max_rounds: int = field(
        default=10, metadata={"help": "Generation rounds per batch, the first included, before the cap applies."}
    )
    zero_std_reward_funcs: list[str] | None = field(
        default=None,
        metadata={
            "help": "The reward functions (TRL's names: a function's __name__, a model's name) whose weighted sum "
            "decides whether a group is informative: masking, dynamic sampling and prompt skipping read it. "
            "None: all. Gate on the verifier of a shaped reward (format plus correctness), or an all-wrong group "
            "whose formats differ trains. A row for which every one of them returned None does not count toward the "
            "decision; advantages still come from every function, as in TRL."
        },
    )
    skip_zero_std_prompts: bool = field(
        default=False,
        metadata={
            "help": "Draw every training prompt from a seeded stream over the train dataset and skip, before "
            "generating it, a prompt predicted to give a zero-variance group: each prompt's success rate over its "
            "recent groups, around its skip_prior_key group's rate, and the chance that it ties forever (a prompt "
            "whose groups all tied on one side) give the chance that its next group is informative, its own "
            "outcomes weighing less as its skip_prior_key group's rate (all prompts' without one) moves from what it "
            "was at its last draw; the prompt is "
            "drawn with (that chance / a never-drawn prompt's of the best group)**2, never below "
            "skip_min_draw_prob. With or without dynamic_sampling."
        },
    )
    skip_min_draw_prob: float = field(
        default=0.05,
        metadata={"help": "Floor of the probability of drawing a prompt: no prompt is dropped for good (> 0)."},
    )
    skip_history_key: str | None = field(
        default=None,
        metadata={
            "help": "Prompt skipping: None keeps one outcome history per dataset row. The name of a train_dataset "
            "column makes the rows that share its value share one history: a difficulty label ('difficulty', "
            "'level', 'source') lets the first prompts of a level predict the others, from the first pass on; "
            "'prompt' makes duplicate prompts share theirs. A streaming (iterable) train_dataset always keys its "
            "history by a hash of this field of each row (default 'prompt')."
        },
    )
    skip_prior_key: str | None = field(
        default=None,
        metadata={
            "help": "Prompt skipping, one history per row: the name of a train_dataset column (a difficulty label, a "
            "source) whose value groups the prompts. A prompt's success rate starts at its group's rate over the "
            "last ~10 generation batches instead of every prompt's: a level the model cannot solve yet, or always "
            "solves, is skipped from the first pass on. Map-style train_dataset only."
        },
    )


ZERO_STD_FIELDS = tuple(f.name for f in fields(ZeroStdArguments))
# Fields that decide only how each batch trains (what it masks, the normalisers, the KL choice): no object carries
# them across steps, so a resume may change them. Every other field configures an object with state (the prompt
# stream, the refill, the skipper and its histories) and may not change on resume; zero_std_atol decides masking too,
# but the refill's counts and the skip histories were counted under it.
PER_BATCH_FIELDS = (
    "mask_zero_std_groups", "zero_std_normalization", "zero_std_kl", "tied_group_entropy_scale",
)  # fmt: skip
# A field set away from its default needs a feature on: (field, the feature, what the field does for it)
NEEDS = (
    ("dynamic_sampling_max_rounds", "dynamic_sampling", "caps the rounds of dynamic sampling"),
    ("skip_min_draw_prob", "skip_zero_std_prompts", "sets the floor of prompt skipping's draw probability"),
    ("skip_history_key", "skip_zero_std_prompts", "keys the histories of prompt skipping"),
    ("skip_prior_key", "skip_zero_std_prompts", "sets the prior of prompt skipping's success rates"),
)
# Fields of version 0.1 (docs/CHANGELOG.md): each with the value that is now always in force (None: none, the feature
# is gone) and what to do instead. A config, YAML file or flag that names one is refused; so is a checkpoint that
# set one away from the value now in force.
REMOVED_FIELDS: dict[str, tuple[object, str]] = {
    "per_prompt_budgets": (False, "per-prompt budgets are gone (they cost more tokens to TRL's accuracy than TRL "
                           "with num_generations=4): set num_generations=4 for smaller groups"),
    "budget_step": (2, "per-prompt budgets are gone: set num_generations=4 for smaller groups"),
    "budget_stop_rule": ("chance", "per-prompt budgets are gone: set num_generations=4 for smaller groups"),
    "budget_continue_prob": (None, "per-prompt budgets are gone: set num_generations=4 for smaller groups"),
    "dynamic_sampling_screen": (0, "the screen is gone: dynamic_sampling generates whole groups"),
    "dynamic_sampling_on_cap": ("mask", "at the cap the batch is always completed with masked groups (warned "
                                "once): raise dynamic_sampling_max_rounds to reach the cap less often"),
    "skip_refill": (True, "a skipped prompt's place always goes to the next prompt drawn: for fewer tokens a step "
                    "set num_generations=4"),
    "skip_predictor": ("success_rate", "the success rate is the only predictor; leave it out"),
    "skip_target_zero_std_frac": (0.25, "the streak predictor it steered is gone; the success rate has no target"),
    "exclude_masked_from_baseline": (True, "masked rows always leave every baseline and batch statistic"),
    "skip_masked_rows": (True, "masked rows are never forwarded (same gradients, less compute)"),
}  # fmt: skip


def removed_field_error(names: list[str], where: str) -> ValueError:
    """The error for ``names`` of ``REMOVED_FIELDS`` found in ``where`` (a config, a flag, a file)."""
    advice = "; ".join(f"{name}: {REMOVED_FIELDS[name][1]}" for name in names)
    return ValueError(f"{where} sets {names}, removed in trl-zerostd 0.2 (docs/CHANGELOG.md): {advice}.")


def checkpoint_settings(saved: dict) -> dict:
    """The settings of a checkpoint's ``trl_zerostd.json`` without the fields of ``REMOVED_FIELDS`` that hold the
    value now always in force (an earlier version wrote every field); one set otherwise ran a feature that is gone
    and is refused, naming it and what to use instead. A field this version never had is refused, naming it."""
    unknown = [name for name in saved if name not in ZERO_STD_FIELDS and name not in REMOVED_FIELDS]
    if unknown:
        raise ValueError(
            f"The checkpoint's trl_zerostd.json sets {unknown}, which this version of trl_zerostd does not have: "
            "it was written by another version. Resume with that version, or start a new run."
        )
    removed = [name for name in saved if name in REMOVED_FIELDS]
    departed = [name for name in removed if saved[name] != REMOVED_FIELDS[name][0]]
    if departed:
        raise removed_field_error(departed, "The checkpoint's trl_zerostd.json")
    return {name: value for name, value in saved.items() if name not in removed}


def refuse_removed_fields(names, where: str) -> None:
    """Raise ``removed_field_error`` for the names of ``REMOVED_FIELDS`` among ``names``."""
    removed = [name for name in names if name in REMOVED_FIELDS]
    if removed:
        raise removed_field_error(removed, where)


def refuse_removed_flags(argv: list[str]) -> None:
    """Refuse command-line flags (``--name value``, ``--name=value``) and YAML files (``--config file``) that set a
    removed field, before a parser reports them as unknown."""
    flags = [arg[2:].split("=", 1)[0] for arg in argv if arg.startswith("--")]
    refuse_removed_fields(flags, "The command line")
    for flag, value in zip(argv, argv[1:]):
        if flag == "--config":
            import yaml

            with open(value) as config_file:
                refuse_removed_fields(list(yaml.safe_load(config_file) or {}), f"The config file {value}")


def masking_settings(args) -> ZeroStdArguments:
    """The package's settings from any TRL config (missing fields take their defaults), validated."""
    settings = ZeroStdArguments(**{name: getattr(args, name) for name in ZERO_STD_FIELDS if hasattr(args, name)})
    validate_settings(settings)
    return settings


def allowed_values() -> dict[str, tuple]:
    """The allowed values of each field whose type is a ``Literal``, read from its annotation."""
    hints = get_type_hints(ZeroStdArguments)
    return {name: get_args(hint) for name, hint in hints.items() if get_origin(hint) is Literal}


def validate_settings(settings: ZeroStdArguments) -> None:
    """Raise ValueError naming the field at fault: a value outside its ``Literal`` type or its range, or a field
    that needs a feature that is off (``NEEDS``)."""
    for name, allowed in allowed_values().items():
        if getattr(settings, name) not in allowed:
            raise ValueError(f"{name} must be one of {list(allowed)}, got {getattr(settings, name)!r}.")
    defaults = {f.name: f.default for f in fields(ZeroStdArguments)}
    for name, feature, role in NEEDS:
        value = getattr(settings, name)
        if value != defaults[name] and not getattr(settings, feature):
            raise ValueError(f"{name}={value!r} {role}, which is off: set {feature}=True, or leave {name} unset.")
    if not settings.zero_std_atol >= 0:  # also rejects NaN
        raise ValueError(f"zero_std_atol must be >= 0 (reward units), got {settings.zero_std_atol!r}.")
    _validate_tied_groups(settings)
    if not settings.dynamic_sampling_max_rounds >= 1:
        raise ValueError(
            "dynamic_sampling_max_rounds must be >= 1 (the first round included), "
            f"got {settings.dynamic_sampling_max_rounds!r}."
        )
    funcs = settings.zero_std_reward_funcs
    names_ok = funcs is None or (
        not isinstance(funcs, str) and all(isinstance(f, str) for f in funcs) and 0 < len(set(funcs)) == len(funcs)
    )
    if not names_ok:
        raise ValueError(
            f"zero_std_reward_funcs must be a non-empty list of distinct reward function names, or None: {funcs!r}."
        )
    if not 0 < settings.skip_min_draw_prob <= 1:
        raise ValueError(
            "skip_min_draw_prob must be in (0, 1]: a floor of 0 would drop prompts for good, "
            f"got {settings.skip_min_draw_prob!r}."
        )
    if settings.skip_prior_key is not None and settings.skip_history_key is not None:
        raise ValueError(
            f"skip_prior_key={settings.skip_prior_key!r} with skip_history_key={settings.skip_history_key!r}: "
            "the prior is for prompts with no history of their own, and skip_history_key pools every prompt of "
            "a key into one history. Set one of them."
        )


def _validate_tied_groups(settings: ZeroStdArguments) -> None:
    """The checks of ``tied_group_entropy_scale`` (``validate_settings``)."""
    scale = settings.tied_group_entropy_scale
    if not (math.isfinite(scale) and scale >= 0):
        raise ValueError(
            f"tied_group_entropy_scale must be finite and >= 0 (0 leaves tied groups masked), got {scale!r}."
        )
    if tied_groups_train(settings) and not settings.mask_zero_std_groups:
        raise ValueError(
            f"tied_group_entropy_scale={scale!r} trains the zero-variance groups that mask_zero_std_groups=False "
            "never finds: set mask_zero_std_groups=True."
        )


def tied_groups_train(settings: ZeroStdArguments) -> bool:
    """Whether the rows of tied groups train on entropy-shaped advantages (``tied_group_entropy_scale > 0``)."""
    return settings.tied_group_entropy_scale > 0
