"""Fine-tune with ZeroStdRLOOTrainer: TRL's RLOO whose zero task-reward-variance groups have no influence.

The twin of scripts/train_grpo.py (same CLI, scripts/demo/train_cli.py). With no argument it trains the embedded
default and writes the model, metrics.json and metrics.png to outputs/rloo-tiny:

    python scripts/train_rloo.py
    python scripts/train_rloo.py --normalize_advantages true --zero_std_normalization exclude
    accelerate launch scripts/train_rloo.py --model_name_or_path Qwen/Qwen2.5-0.5B-Instruct ...

Every field of ZeroStdRLOOConfig, trl.ModelConfig and train_cli.ScriptArguments is a flag (--help).
"""

from demo.train_cli import main
from trl_zerostd import ZeroStdRLOOConfig, ZeroStdRLOOTrainer

if __name__ == "__main__":
    main(ZeroStdRLOOTrainer, ZeroStdRLOOConfig, output_dir="outputs/rloo-tiny")
