"""The arms of ``time_to_accuracy.py``, as data: each an ``Arm`` with its flags and its run setting, in ``ARMS`` by
name. An arm's name is only its label: what the study reads of an arm (its flags, trainer, steps, learning rate, the
TRL run at its setting) is in its fields."""

from __future__ import annotations

from dataclasses import dataclass, replace

DIFFICULTY = "<difficulty column>"  # stands for the study's --difficulty_column among an arm's flags
WIDE_BATCH = "<4 x completions per step>"  # stands for 4 x the study's --completions_per_step (groups of 32)
PROMPTS_TIMES = "<prompts per step x "  # "<prompts per step x 4>": the study's prompts a step x 4 (groups of 4)


def flag_value(flags: tuple[str, ...] | list[str], flag: str, default: int) -> int:
    """The integer value of ``flag`` in a flag list, ``default`` where the list does not set it."""
    return int(flags[flags.index(flag) + 1]) if flag in flags else default


@dataclass(frozen=True)
class Arm:
    """A study arm: the flags its runs add to the task's and the main job's defaults.

    ``trl``: it trains TRL's own GRPOTrainer (base TRL, the package's flags dropped). ``setting``: its run-setting
    suffixes, a setting base TRL can be given too ("-mu2", "-x2", "-half", "-lr05", "-lr2", "-g4", "-g2", in the name's
    order); ``steps``: how many times max_steps it runs; ``lr_scale``: the factor on --learning_rate;
    ``retired_at``: the commit that keeps the code of a setting the arm sets, or of the predictor it ran, and the
    package no longer has (its records are read, it is not run here: ``check_runnable``)."""

    name: str
    flags: tuple[str, ...] = ()
    trl: bool = False
    setting: str = ""
    steps: float = 1.0
    lr_scale: float = 1.0
    retired_at: str = ""

    def value(self, flag: str, default: int) -> int:
        """The integer value of ``flag`` among the arm's flags, ``default`` where it does not set it (a placeholder
        value fails: read those from ``arm_flags``)."""
        return flag_value(self.flags, flag, default)

    @property
    def iterations(self) -> int:
        """Optimizer steps each generation batch trains: the arm's --num_iterations (TRL's default 1)."""
        return self.value("--num_iterations", 1)

    @property
    def twin(self) -> str | None:
        """Base TRL given the arm's run setting: "trl-mu2-x2-lr05" for "keep_failed-mu2-x2-lr05"; None for an arm
        at TRL's own settings, or for TRL."""
        return f"trl{self.setting}" if self.setting and not self.trl else None

    def variant(self, suffix: str, *flags: str, setting: bool = False, steps: float = 0.0, lr_scale: float = 0.0):
        """The arm with ``suffix`` on its name and ``flags`` after its own; ``setting``: the suffix is a run setting
        (``steps`` and ``lr_scale``, where given, replace the arm's)."""
        return replace(
            self, name=self.name + suffix, flags=(*self.flags, *flags),
            setting=self.setting + suffix if setting else self.setting,
            steps=steps or self.steps, lr_scale=lr_scale or self.lr_scale,
        )  # fmt: skip


SKIP = ("--skip_zero_std_prompts", "true")  # prompt skipping; its predictor is each prompt's success rate ("-rate")
DYNAMIC = ("--dynamic_sampling", "true")
PRIOR = ("--skip_prior_key", DIFFICULTY)  # a prior by difficulty band for prompts never drawn
HALF_BATCH = ("--per_device_train_batch_size", "64")  # 8 groups a step instead of 16
LOW_FLOOR = ("--skip_min_draw_prob", "0.02")  # a prompt predicted zero-variance is drawn 1 time in 50, not 1 in 20
KEEP_FAILED = ("--zero_std_kl", "keep_failed")
REUSE = ("--num_iterations", "2")  # TRL's num_iterations=2 (GRPO's mu)
LR_SCALES = {"-lr05": 0.5, "-lr2": 2.0}
ENTROPY_SCALE = "--tied_group_entropy_scale"  # RL-ZVP: tied groups train on entropy-shaped advantages at this scale
ZVP_SCALES = {"-a005": "0.05", "-a01": "0.1", "-a02": "0.2", "-a04": "0.4"}
# the commit that keeps tied_group_signal="calibrated", which paid nowhere (docs/studies/tied_groups.md); its fields
# there were tied_group_signal and tied_group_scale
CALIBRATED_COMMIT = "92928d9"
CALIBRATED_SIGNAL = ("--tied_group_signal", "calibrated")  # tied groups against the prompt's success-rate estimate
ARMS: dict[str, Arm] = {}


def add(*arms: Arm) -> None:
    ARMS.update({arm.name: arm for arm in arms})


add(Arm("trl", trl=True), Arm("masking"), Arm("keep_failed", KEEP_FAILED), Arm("dynamic", DYNAMIC))
add(*(arm.variant("-8g", *HALF_BATCH) for arm in list(ARMS.values())))
# Prompt skipping, by each prompt's success rate (named "-rate" from when a streak predictor was the other choice)
add(Arm("skip-rate", SKIP), Arm("skip-rate-prior", (*SKIP, *PRIOR)))
add(ARMS["skip-rate-prior"].variant("-f02", *LOW_FLOOR))
# Each generation batch trains two optimizer steps, the second with PPO's clipped ratio to the policy that generated
# it. "-mu2" keeps the 300 optimizer steps and their learning-rate schedule (what a TRL user gets by setting it: half
# the generation batches); "-mu2-x2" runs twice the steps, so that it generates as many batches as the others. Every
# arm is evaluated every eval_steps generation batches.
for arm in ("trl", "masking", "keep_failed", "skip-rate-prior", "skip-rate-prior-f02"):
    add(mu2 := ARMS[arm].variant("-mu2", *REUSE, setting=True))
    add(mu2.variant("-x2", setting=True, steps=2.0))
# Half the steps: the learning rate decays over 150 generation batches, as under "-mu2", without the second pass
add(*(ARMS[arm].variant("-half", setting=True, steps=0.5) for arm in ("trl", "skip-rate-prior-f02")))
# The learning rate times 0.5 ("-lr05") or 2 ("-lr2"), the schedule otherwise the same: is --learning_rate TRL's best,
# and does an arm of ours learn faster at another? The target stays base TRL's at --learning_rate.
for arm in ("trl", "skip-rate-prior-f02", "keep_failed"):
    for variant in (arm, f"{arm}-mu2", f"{arm}-mu2-x2"):
        add(*(ARMS[variant].variant(suffix, setting=True, lr_scale=scale) for suffix, scale in LR_SCALES.items()))
add(ARMS["skip-rate-prior"].variant("-lr2", setting=True, lr_scale=2.0))


def arm_flags(arm: str, args) -> list[str]:
    """The arm's flags, its difficulty column named (``args.difficulty_column``) and its batch sized."""
    named = {DIFFICULTY: args.difficulty_column, WIDE_BATCH: str(4 * args.completions_per_step)}
    prompts = args.completions_per_step // args.num_generations

    def resolved(flag: str) -> str:
        if flag.startswith(PROMPTS_TIMES):
            return str(prompts * int(flag.removeprefix(PROMPTS_TIMES).rstrip(">")))
        return named.get(flag, flag)

    return [resolved(flag) for flag in ARMS[arm].flags]


def check_runnable(arm: str) -> None:
    """Refuse to train an arm whose setting or predictor left the package, naming the commit that trains it."""
    commit = ARMS[arm].retired_at if arm in ARMS else ""
    if commit:
        raise ValueError(
            f"Arm {arm!r} trains a setting or a predictor this package no longer has: train it at commit {commit} "
            f"(git checkout {commit}); its records are read where they exist."
        )


def groups_per_step(arm: str, args) -> int:
    """Groups a step trains: the study's completions a step (or the arm's --per_device_train_batch_size) over G."""
    flags = arm_flags(arm, args)
    batch = flag_value(flags, "--per_device_train_batch_size", args.completions_per_step)
    return batch // flag_value(flags, "--num_generations", args.num_generations)


def groups_of(width: int) -> tuple[str, ...]:
    """Flags for groups of ``width`` completions with as many prompts a step as the study's."""
    return ("--num_generations", str(width), "--per_device_train_batch_size", f"{PROMPTS_TIMES}{width}>")


# Groups of 4 ("-g4") or 2 ("-g2"), as many prompts a step as the study's (half or a quarter of its completions at G=8)
for arm in ("trl", "keep_failed"):
    add(ARMS[arm].variant("-g4", *groups_of(4), setting=True))
add(ARMS["trl"].variant("-g2", *groups_of(2), setting=True))
# Tied groups that learn (docs/studies/tied_groups.md): RL-ZVP's entropy-shaped advantages at each scale; "zvp" alone
# trains the tied groups in full, which keep_failed's KL term on the failed ones is a part of
add(*(Arm(f"zvp{suffix}", (ENTROPY_SCALE, scale)) for suffix, scale in ZVP_SCALES.items()))
add(*(ARMS[f"zvp{suffix}"].variant("-g4", *groups_of(4), setting=True) for suffix in ZVP_SCALES))
# Do dynamic sampling and prompt skipping still pay once tied groups teach? Both take away what the rule learns from
add(*(ARMS[arm].variant("-zvp-a02", ENTROPY_SCALE, "0.2") for arm in ("dynamic", "skip-rate-prior")))
# beta=0, TRL's default: no KL term, so keep_failed has nothing to keep and the rule is the only signal from tied
# groups; masking there trains TRL's gradients ("keep" normalisers), so "masking-b0" stands for base TRL at beta=0
add(*(ARMS[arm].variant("-b0", "--beta", "0.0") for arm in ("masking", "zvp-a02")))
# The calibrated rule over skipping (it reads skipping's estimate, with the prior by level) at scale 1, and with the
# estimate kept but nothing skipped (a draw floor of 1 draws every prompt): retired, their records kept
CALIBRATED_ONE = (*CALIBRATED_SIGNAL, "--tied_group_scale", "1.0")
ESTIMATE_ONLY = (*SKIP, *PRIOR, "--skip_min_draw_prob", "1")
add(
    replace(ARMS["skip-rate-prior"].variant("-cal1", *CALIBRATED_ONE), retired_at=CALIBRATED_COMMIT),
    Arm("estimate-prior-cal1", (*ESTIMATE_ONLY, *CALIBRATED_ONE), retired_at=CALIBRATED_COMMIT),
)
# Base TRL made again, two runs at a time as the later arms ran, evaluated at steps 5 and 15 too: what the cached TRL
# runs' 10-step evaluation grid and conditions not recorded (running alone ruled out) do to the ratios against them
add(Arm("trl-rerun", trl=True))
# The PyPI peer trl-cgrpo (scripts/studies/peer_cgrpo.py): its conformal budgets with the grid capped at TRL's group
# width ("-g8": 2, 4, 8), and its default grid (2 ... 32: groups of 32, as many prompts a step as TRL)
add(Arm("cgrpo-g8", ("--budget_grid", "2", "4", "8")))
add(Arm("cgrpo", ("--budget_grid", "2", "4", "8", "16", "32", "--num_generations", "32",
                  "--per_device_train_batch_size", WIDE_BATCH)))  # fmt: skip
# Prompts that come back (revisited_prompts.py): does skipping pay over keep_failed once a prompt's own history exists?
add(*(ARMS[arm].variant("-kf", *KEEP_FAILED) for arm in ("skip-rate-prior", "skip-rate")))
# The same flags on the predictor whose evidence faded as a prompt's level's rate moved (success_rate.EVIDENCE_FADE 1):
# "skip-fade*", retired (it did not pay); FADE_COMMIT trains them. The "skip-rate*" arms train the package's predictor,
# whose evidence does not fade, as every record of them did.
FADE_COMMIT = "37ad2b1"
for arm in ("skip-rate-prior-kf", "skip-rate-kf"):
    add(replace(ARMS[arm], name=arm.replace("skip-rate", "skip-fade"), retired_at=FADE_COMMIT))
