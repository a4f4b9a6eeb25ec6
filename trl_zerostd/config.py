"""Config fields of the package (SEMANTICS.md "Names"), as a mixin for TRL's GRPO and RLOO configs."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Literal, get_args, get_origin, get_type_hints

from trl import GRPOConfig, RLOOConfig


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
            "forwards while scoring. Same loss and gradients, less compute. False keeps TRL's full forwards, for "
            "comparison."
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
    dynamic_sampling: bool = field(
        default=False,
        metadata={
            "help": "Refill each generation batch with further prompts (a seeded stream over the train dataset) until "
            "it holds generation_batch_size / num_generations informative groups (two valid rows with different task "
            "rewards); the other groups are dropped."
        },
    )
    dynamic_sampling_max_rounds: int = field(
        default=10, metadata={"help": "Generation rounds per batch, the first included, before the cap applies."}
    )
    dynamic_sampling_on_cap: Literal["mask", "error"] = field(
        default="mask",
        metadata={
            "help": "At the cap, 'mask': complete the batch with the best groups generated, which train masked (a "
            "warning once, then the metric dynamic_sampling/cap_reached); 'error': raise."
        },
    )
    dynamic_sampling_screen: int = field(
        default=0,
        metadata={
            "help": "Dynamic sampling: generate this many completions of each drawn prompt first, and the other "
            "num_generations - dynamic_sampling_screen only for the prompts whose first ones differ in task reward; a "
            "prompt tied on its screen is dropped after it (SPEED, arXiv 2506.09016). 0: off (whole groups); else "
            ">= 2 and < num_generations."
        },
    )
    per_prompt_budgets: bool = field(
        default=False,
        metadata={
            "help": "Size each prompt's group: generate budget_step completions of every prompt of the batch first; a "
            "prompt whose completions differ in task reward is completed to num_generations, one whose completions "
            "all tie goes on or stops by budget_stop_rule, from the chance that the rest of its group would break "
            "the tie, read off the prompt's success rate (skip_predictor='success_rate': its recent "
            "groups, and with skip_prior_key its level's rate, without skipping unless skip_zero_std_prompts; "
            "'streak': a uniform prior). Completions never generated are empty slots: never forwarded, in no "
            "normaliser. Every prompt comes from a seeded stream over the train dataset."
        },
    )
    budget_step: int = field(
        default=2,
        metadata={"help": "per_prompt_budgets: completions generated per prompt at a time (>= 2, < num_generations)."},
    )
    budget_stop_rule: Literal["chance", "yield"] = field(
        default="chance",
        metadata={
            "help": "per_prompt_budgets: when a tied prompt stops. 'chance': it gets budget_step more completions "
            "while the chance that the rest of its group breaks the tie is at least budget_continue_prob. 'yield': "
            "it is completed to num_generations when that chance per completion it would cost is at least the "
            "informative groups per completion of earlier batches (decayed), else it stops: two rounds in one "
            "process (rows that make a round even over ranks can add one)."
        },
    )
    budget_continue_prob: float | None = field(
        default=None,
        metadata={
            "help": "per_prompt_budgets under budget_stop_rule='chance': a tied prompt gets more completions while "
            "the predicted probability that the rest of its group breaks the tie is at least this; 0: every group is "
            "completed, 1: none that ties. None: 0.5."
        },
    )
    zero_std_reward_funcs: list[str] | None = field(
        default=None,
        metadata={
            "help": "The reward functions (TRL's names: a function's __name__, a model's name) whose weighted sum "
            "decides whether a group is informative: masking, dynamic sampling, prompt skipping and budgets read it. "
            "None: all. Gate on the verifier of a shaped reward (format plus correctness), or an all-wrong group "
            "whose formats differ trains. A row for which every one of them returned None does not count toward the "
            "decision; advantages still come from every function, as in TRL."
        },
    )
    skip_zero_std_prompts: bool = field(
        default=False,
        metadata={
            "help": "Draw every training prompt from a seeded stream over the train dataset and skip, before "
            "generating it, a prompt that skip_predictor predicts to give a zero-variance group (all-low or "
            "all-high). With or without dynamic_sampling."
        },
    )
    skip_refill: bool = field(
        default=True,
        metadata={
            "help": "Prompt skipping without dynamic_sampling. True: a skipped prompt's place in the batch goes to "
            "the next prompt drawn, so a step generates and trains as many groups as TRL's. False: a step takes the "
            "stream's next generation_batch_size / num_generations places and generates only the prompts drawn "
            "there; a skipped prompt's place stays an empty slot (logged as prompt_skip/empty_slot_frac), never "
            "generated, never forwarded, in no normaliser: a step costs fewer tokens instead of training more groups, "
            "and trains as TRL would on the groups it generated. At least one prompt generates a step."
        },
    )
    skip_predictor: Literal["streak", "success_rate"] = field(
        default="success_rate",
        metadata={
            "help": "Prompt skipping (and budgets' prior): how a prompt's earlier groups set its draw probability. "
            "'streak': p**k after k "
            "zero-variance groups of one kind in a row (GRESO). 'success_rate': a success rate per prompt over its "
            "recent groups (each new group halves the weight of the earlier ones), Beta-distributed around its "
            "skip_prior_key group's rate (or every prompt's), and for a prompt whose groups all tied on one side the "
            "chance that it is stuck (ties forever), give the chance that its next group is informative; "
            "the prompt is drawn with (that chance / a never-drawn prompt's of the best group)**2, never below "
            "skip_min_draw_prob; skip_target_zero_std_frac is not used; the default."
        },
    )
    skip_target_zero_std_frac: float = field(
        default=0.25,
        metadata={
            "help": "skip_predictor='streak': share of zero-variance groups among those generated that the "
            "exploration p aims at."
        },
    )
    skip_min_draw_prob: float = field(
        default=0.05,
        metadata={"help": "Floor of the probability of drawing a prompt: no prompt is dropped for good (> 0)."},
    )
    skip_history_key: str | None = field(
        default=None,
        metadata={
            "help": "Prompt histories (skipping, budgets): None keeps one outcome history per dataset row. The name "
            "of a train_dataset "
            "column makes the rows that share its value share one history: a difficulty label ('difficulty', "
            "'level', 'source') lets the first prompts of a level predict the others, from the first pass on; "
            "'prompt' makes duplicate prompts share theirs. A streaming (iterable) train_dataset always keys its "
            "history by a hash of this field of each row (default 'prompt')."
        },
    )
    skip_prior_key: str | None = field(
        default=None,
        metadata={
            "help": "Prompt histories (skipping, budgets), one history per row: the name of a train_dataset column "
            "(a difficulty label, a "
            "source) whose value groups the prompts. A prompt never drawn is then drawn with its group's informative "
            "rate over the last ~10 generation batches, relative to the best group's (never below "
            "skip_min_draw_prob), instead of always: a level the model cannot solve yet, or always solves, is skipped "
            "from the first pass on. Map-style train_dataset only."
        },
    )


ZERO_STD_FIELDS = tuple(f.name for f in fields(ZeroStdArguments))
# Fields that decide only how each batch trains (what it masks, the normalisers, the KL choice, which rows are
# forwarded): no object carries them across steps, so a resume may change them. Every other field configures an
# object with state (the prompt stream, the refill, the skipper and its histories) and may not change on resume;
# zero_std_atol decides masking too, but the refill's counts and the skip histories were counted under it.
PER_BATCH_FIELDS = (
    "mask_zero_std_groups", "zero_std_normalization", "exclude_masked_from_baseline", "skip_masked_rows",
    "zero_std_kl",
)  # fmt: skip
STATEFUL_FIELDS = tuple(name for name in ZERO_STD_FIELDS if name not in PER_BATCH_FIELDS)


def masking_settings(args) -> ZeroStdArguments:
    """The package's settings from any TRL config (missing fields take their defaults), validated."""
    settings = ZeroStdArguments(**{name: getattr(args, name) for name in ZERO_STD_FIELDS if hasattr(args, name)})
    validate_settings(settings)
    return settings


# A field set away from its default needs a feature on: (field, the features of which one must be on, what the field
# does for them). The prompt histories serve prompt skipping and the prior of per-prompt budgets.
HISTORIES = ("skip_zero_std_prompts", "per_prompt_budgets")
NEEDS = (
    ("dynamic_sampling_screen", ("dynamic_sampling",), "screens the prompts of dynamic sampling"),
    ("skip_refill", ("skip_zero_std_prompts",), "sets what a skipped prompt's place in the batch gets"),
    ("skip_predictor", HISTORIES, "sets the predictor of the prompt histories"),
    ("skip_history_key", HISTORIES, "keys the prompt histories"),
    ("skip_prior_key", HISTORIES, "sets the prior of the prompt histories"),
    ("budget_step", ("per_prompt_budgets",), "sets the increments of per-prompt budgets"),
    ("budget_stop_rule", ("per_prompt_budgets",), "sets the rule that stops a tied prompt of per-prompt budgets"),
    ("budget_continue_prob", ("per_prompt_budgets",), "sets when a tied prompt of per-prompt budgets stops"),
)


def allowed_values() -> dict[str, tuple]:
    """The allowed values of each field whose type is a ``Literal``, read from its annotation."""
    hints = get_type_hints(ZeroStdArguments)
    return {name: get_args(hint) for name, hint in hints.items() if get_origin(hint) is Literal}


def validate_settings(settings: ZeroStdArguments) -> None:
    """Raise ValueError naming the field at fault: a value outside its ``Literal`` type or its range, a field that
    needs a feature that is off (``NEEDS``), or two fields that exclude each other."""
    for name, allowed in allowed_values().items():
        if getattr(settings, name) not in allowed:
            raise ValueError(f"{name} must be one of {list(allowed)}, got {getattr(settings, name)!r}.")
    defaults = {f.name: f.default for f in fields(ZeroStdArguments)}
    for name, features, role in NEEDS:
        value = getattr(settings, name)
        if value != defaults[name] and not any(getattr(settings, feature) for feature in features):
            turn_on = " or ".join(f"{feature}=True" for feature in features)
            off = "which is off" if len(features) == 1 else "which are off"
            raise ValueError(f"{name}={value!r} {role}, {off}: set {turn_on}, or leave {name} unset.")
    if not settings.zero_std_atol >= 0:  # also rejects NaN
        raise ValueError(f"zero_std_atol must be >= 0 (reward units), got {settings.zero_std_atol!r}.")
    if not settings.dynamic_sampling_max_rounds >= 1:
        raise ValueError(
            "dynamic_sampling_max_rounds must be >= 1 (the first round included), "
            f"got {settings.dynamic_sampling_max_rounds!r}."
        )
    if settings.dynamic_sampling_screen:
        if not settings.dynamic_sampling_screen >= 2:
            raise ValueError(
                "dynamic_sampling_screen must be 0 (off) or >= 2 (one completion cannot differ from itself), "
                f"got {settings.dynamic_sampling_screen!r}."
            )
        if not settings.dynamic_sampling_max_rounds >= 2:
            raise ValueError(
                "dynamic_sampling_screen needs dynamic_sampling_max_rounds >= 2 (a screen, then the rest of its "
                f"groups), got {settings.dynamic_sampling_max_rounds!r}."
            )
    if not settings.skip_refill and settings.dynamic_sampling:
        raise ValueError(
            "skip_refill=False with dynamic_sampling=True: dynamic sampling refills every batch to its informative "
            "groups, so a skipped prompt's place is always refilled. Leave skip_refill unset, or turn dynamic "
            "sampling off."
        )
    if settings.per_prompt_budgets and settings.dynamic_sampling:
        raise ValueError(
            "per_prompt_budgets with dynamic_sampling: dynamic sampling sizes groups by its own screen "
            "(dynamic_sampling_screen). Turn one of them off."
        )
    if settings.per_prompt_budgets and not settings.skip_refill:
        raise ValueError(
            "per_prompt_budgets with skip_refill=False: a budgeted batch draws every prompt it generates; leave "
            "skip_refill unset."
        )
    if isinstance(settings.budget_step, bool) or not isinstance(settings.budget_step, int) or settings.budget_step < 2:
        raise ValueError(
            f"budget_step must be >= 2 (one completion cannot differ from itself), got {settings.budget_step!r}."
        )
    if settings.budget_continue_prob is not None and not 0 <= settings.budget_continue_prob <= 1:
        raise ValueError(
            f"budget_continue_prob must be in [0, 1] (a probability), got {settings.budget_continue_prob!r}."
        )
    if settings.budget_stop_rule == "yield" and settings.budget_continue_prob is not None:
        raise ValueError(
            f"budget_continue_prob={settings.budget_continue_prob!r} with budget_stop_rule='yield': the yield rule "
            "sets its own threshold from earlier batches. Leave budget_continue_prob unset, or use "
            "budget_stop_rule='chance'."
        )
    funcs = settings.zero_std_reward_funcs
    names_ok = funcs is None or (
        not isinstance(funcs, str) and all(isinstance(f, str) for f in funcs) and 0 < len(set(funcs)) == len(funcs)
    )
    if not names_ok:
        raise ValueError(
            f"zero_std_reward_funcs must be a non-empty list of distinct reward function names, or None: {funcs!r}."
        )
    if not 0 <= settings.skip_target_zero_std_frac <= 1:
        raise ValueError(
            "skip_target_zero_std_frac must be in [0, 1] (a share of groups), "
            f"got {settings.skip_target_zero_std_frac!r}."
        )
    if (
        settings.skip_target_zero_std_frac != defaults["skip_target_zero_std_frac"]
        and settings.skip_predictor != "streak"
    ):
        raise ValueError(
            f"skip_target_zero_std_frac={settings.skip_target_zero_std_frac!r} is the target of "
            f"skip_predictor='streak'; skip_predictor={settings.skip_predictor!r} has none. Set "
            "skip_predictor='streak', or leave skip_target_zero_std_frac unset."
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


def check_compatible(settings: ZeroStdArguments, args, kind: str) -> None:
    """Refuse, naming the settings, the combinations with TRL's own fields that this package cannot honour."""
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


def check_num_generations(config) -> None:
    """Group-relative advantages compare at least 2 completions of a prompt in training; a screen is part of one."""
    if config.num_generations is not None and config.num_generations < 2:
        raise ValueError(
            f"num_generations must be at least 2 in training (got {config.num_generations}): a group of one "
            "completion has no baseline to compare with. num_generations_eval may be 1."
        )
    step = getattr(config, "budget_step", 2)
    if getattr(config, "per_prompt_budgets", False) and config.num_generations is not None:
        if config.num_generations < 3:
            raise ValueError(
                f"per_prompt_budgets with num_generations={config.num_generations}: a budget of at least 2 "
                "completions below the group's width needs num_generations >= 3."
            )
        if step >= config.num_generations:
            raise ValueError(
                f"budget_step={step} must be below num_generations={config.num_generations}: a budget is part of "
                "a group."
            )
    screen = getattr(config, "dynamic_sampling_screen", 0)
    if screen and config.num_generations is not None and screen >= config.num_generations:
        raise ValueError(
            f"dynamic_sampling_screen={screen} must be below num_generations={config.num_generations}: the screen "
            "is the first part of a group."
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
