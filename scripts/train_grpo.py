"""Fine-tune with ZeroStdGRPOTrainer: TRL's GRPO whose zero-variance groups have no influence on training.

With no argument it trains the embedded default (a tiny local model, warm started on single-digit addition, on
CPU in a few minutes) and writes the model, metrics.json and metrics.png to outputs/grpo-tiny:

    python scripts/train_grpo.py
    python scripts/train_grpo.py --max_steps 100 --zero_std_normalization exclude
    accelerate launch scripts/train_grpo.py --model_name_or_path Qwen/Qwen2.5-0.5B-Instruct \\
        --dataset_name trl-lib/DeepMath-103K --reward_funcs accuracy_reward --learning_rate 1e-6 \\
        --max_completion_length 512 --per_device_train_batch_size 8 --output_dir outputs/grpo-qwen

Every field of ZeroStdGRPOConfig, trl.ModelConfig and train_cli.ScriptArguments is a flag (--help lists
them); --config file.yaml sets them from a file.
"""

from demo.train_cli import main
from trl_zerostd import ZeroStdGRPOConfig, ZeroStdGRPOTrainer

if __name__ == "__main__":
    main(ZeroStdGRPOTrainer, ZeroStdGRPOConfig, output_dir="outputs/grpo-tiny")
