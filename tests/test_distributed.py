"""Two-process data-parallel training on CPU (gloo) gives the masks, advantages and metrics of one process.

Launched as users launch it: ``accelerate launch --multi_gpu --num_processes 2`` with ``use_cpu=True`` in the
training config. The global batch is one tied group and one informative group, one group per rank, so one rank's
rows are all masked: that rank forwards one row at zero weight and the step must finish (no hang).
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from dp_worker import main as run_worker

WORKER = Path(__file__).parent / "dp_worker.py"
TIMEOUT_S = 300


def launch_two_processes(model_dir, out_dir, kind):
    command = [
        sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
        "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", "29533",
        str(WORKER), model_dir, str(out_dir), kind,
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT_S)
    assert done.returncode == 0, done.stderr[-4000:]
    return [json.loads((out_dir / f"rank{rank}.json").read_text()) for rank in (0, 1)]


def by_row(rows):
    return sorted((row["prompt"], row["completion"], row["advantage"], row["tokens"]) for row in rows)


@pytest.mark.parametrize("kind", ["grpo", "rloo"])
def test_two_processes_match_one(tiny_model_dir, tmp_path, kind):
    (tmp_path / "dp").mkdir()
    ranks = launch_two_processes(tiny_model_dir, tmp_path / "dp", kind)
    assert [r["world_size"] for r in ranks] == [2, 2]
    assert ranks[0]["checksum"] == ranks[1]["checksum"]  # DDP kept the replicas in sync
    assert {row["prompt"] for row in ranks[0]["rows"]} != {row["prompt"] for row in ranks[1]["rows"]}

    (tmp_path / "single").mkdir()
    run_worker(tiny_model_dir, str(tmp_path / "single"), kind)  # one process, same global batch of 8 rows
    single = json.loads((tmp_path / "single" / "rank0.json").read_text())
    assert single["world_size"] == 1
    assert by_row(ranks[0]["rows"] + ranks[1]["rows"]) == by_row(single["rows"])  # advantages bit-identical
    tied = [row for row in single["rows"] if row["prompt"] == "1+1="]
    assert tied and all(row["tokens"] == 0 and row["advantage"] == 0.0 for row in tied)

    for key in ("zero_std/masked_group_frac", "zero_std/masked_token_frac", "masked/row_frac/zero_std"):
        assert ranks[0]["logs"][0][key] == pytest.approx(single["logs"][0][key]), key
    assert single["logs"][0]["zero_std/masked_group_frac"] == 0.5
