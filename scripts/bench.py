"""Benchmark ZeroStdGRPOTrainer against TRL's GRPOTrainer in one run (issue: masked rows cost no compute).

    python scripts/bench.py                                  # tiny local model, ~3M parameters
    python scripts/bench.py --fractions 0 0.5 --repeats 3    # quicker
    python scripts/bench.py --model_name_or_path Qwen/Qwen2.5-0.5B   # a real model (needs the hub or a local path)

Writes the table as JSON (--json) and a PNG plot (--plot), and prints it as Markdown.
"""

from trl import TrlParser

from trl_zerostd.benchmark import BenchArguments, format_table, run_benchmark

if __name__ == "__main__":
    (args,) = TrlParser((BenchArguments,)).parse_args_and_config()
    print(format_table(run_benchmark(args)))
