"""``trl-zerostd grpo ...`` and ``trl-zerostd rloo ...``: TRL's own ``trl grpo`` / ``trl rloo`` with this package's
trainer and config.

The same flags as TRL's command (models and datasets from the hub or local, reward functions by name from
``trl.rewards`` or a dotted import path, ``--config file.yaml``, ``--datasets`` mixtures), plus this package's
fields; runnable under ``accelerate launch``. The training itself is TRL's script function (``trl.scripts.grpo.main``,
TRL 1.16), called with the trainer class it imports from ``trl`` set to ours for the call: nothing of TRL's script
is copied.
"""

from __future__ import annotations

import importlib
import sys
from contextlib import contextmanager

import trl

from .core.settings import refuse_removed_flags
from .trainer.config import ZeroStdGRPOConfig, ZeroStdRLOOConfig
from .trainer.grpo import ZeroStdGRPOTrainer
from .trainer.rloo import ZeroStdRLOOTrainer

# command -> (TRL's script module, its script-arguments class, the trainer name its main imports from trl, ours)
COMMANDS = {
    "grpo": ("trl.scripts.grpo", "GRPOScriptArguments", "GRPOTrainer", ZeroStdGRPOConfig, ZeroStdGRPOTrainer),
    "rloo": ("trl.scripts.rloo", "RLOOScriptArguments", "RLOOTrainer", ZeroStdRLOOConfig, ZeroStdRLOOTrainer),
}
USAGE = "usage: trl-zerostd {grpo,rloo} [--help] [--config CONFIG.yaml] [TRL's and trl_zerostd's flags]"
HELP = "\n".join(
    f"  {command}    TRL's `trl {command}` with {trainer.__name__}" for command, (*_, trainer) in COMMANDS.items()
)


@contextmanager
def trainer_named(name: str, trainer_cls: type):
    """Within the block, ``trl.<name>`` is ``trainer_cls``: what TRL's script function imports when it runs."""
    original = getattr(trl, name)
    setattr(trl, name, trainer_cls)
    try:
        yield
    finally:
        setattr(trl, name, original)


def main(argv: list[str] | None = None) -> None:
    """Parse ``argv`` (default ``sys.argv[1:]``): a command, then its flags; train."""
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in ("-h", "--help"):  # asked for, so not an error: exit 0, as `trl --help` does
        print(f"{USAGE}\n\ncommands:\n{HELP}\n\n`trl-zerostd COMMAND --help` lists the flags of a command.")
        raise SystemExit(0)
    if not argv or argv[0] not in COMMANDS:
        raise SystemExit(f"{USAGE}\ntrl-zerostd: the first argument must be one of {sorted(COMMANDS)}.")
    command, *flags = argv
    try:
        refuse_removed_flags(flags)
    except ValueError as error:  # a flag of an earlier version: said like argparse's errors, without a traceback
        raise SystemExit(f"{USAGE}\ntrl-zerostd: {error}") from None
    module_name, script_arguments, trainer_name, config_cls, trainer_cls = COMMANDS[command]
    script = importlib.import_module(module_name)
    dataclass_types = (getattr(script, script_arguments), config_cls, trl.ModelConfig, trl.DatasetMixtureConfig)
    # transformers types its argument as its NewType DataClassType, which no class matches
    parser = trl.TrlParser(dataclass_types, prog=f"trl-zerostd {command}")  # type: ignore[arg-type]
    script_args, training_args, model_args, dataset_args = parser.parse_args_and_config(flags)
    with trainer_named(trainer_name, trainer_cls):
        script.main(script_args, training_args, model_args, dataset_args)


if __name__ == "__main__":
    main()
