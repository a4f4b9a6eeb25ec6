"""Train TRL's GRPOTrainer and ZeroStdGRPOTrainer from the same seed on the same data, and plot them side by side.

    python scripts/compare.py                       # the embedded default; writes outputs/compare/compare.png
    python scripts/compare.py --max_steps 100 --beta 0.1 --compare_dir outputs/compare-beta

Every other flag goes to both runs (see ``python scripts/train_grpo.py --help``; flags of this package apply to
ours only).
"""

from dataclasses import dataclass, field
from pathlib import Path

from transformers import HfArgumentParser
from trl import GRPOConfig, GRPOTrainer

from demo.train_cli import plot_metrics, reward_summary, run, without_package_flags
from trl_zerostd import ZeroStdGRPOConfig, ZeroStdGRPOTrainer


@dataclass
class CompareArguments:
    compare_dir: str = field(default="outputs/compare", metadata={"help": "Parent of the two runs and the plot."})


if __name__ == "__main__":
    compare_args, argv = HfArgumentParser(CompareArguments).parse_args_into_dataclasses(return_remaining_strings=True)
    runs = {
        "TRL GRPOTrainer": (GRPOTrainer, GRPOConfig, without_package_flags(argv), "base"),
        "ZeroStdGRPOTrainer": (ZeroStdGRPOTrainer, ZeroStdGRPOConfig, argv, "ours"),
    }
    histories = {}
    for name, (trainer_cls, config_cls, run_argv, folder) in runs.items():
        output_dir = Path(compare_args.compare_dir) / folder
        trainer = run(trainer_cls, config_cls, [*run_argv, "--plot", "false"], output_dir=str(output_dir))
        histories[name] = trainer.state.log_history
    path = Path(compare_args.compare_dir) / "compare.png"
    plot_metrics(histories, path)
    for name, history in histories.items():
        print(f"{name}: {reward_summary(history)}")
    print(f"Side-by-side plot: {path}")  # the process group, if any, is ended at exit by our trainer
