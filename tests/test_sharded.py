"""Sharded training (FSDP2) on CPU with an all-masked rank: both trainers, with and without skipping masked rows,
and base TRL's trainers as the control. Launched as users launch it (``accelerate launch --config_file
examples/accelerate/fsdp2.yaml``), with the CPU overrides a GPU user would not need.

The batch puts the tied group on one rank and the informative group on the other, so one rank forwards a single
row at zero weight while the other trains: FSDP's parameter gathers must stay in step. The run must finish within the
timeout, keep the replicas equal, and make the update of the DDP run on the same data.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from test_distributed import WORKER, launch

CONFIG = Path(__file__).resolve().parents[1] / "examples" / "accelerate" / "fsdp2.yaml"
TIMEOUT_S = 300


def launch_fsdp(model_dir, out_dir, kind, trainer="ours", skip="skip"):
    out_dir.mkdir()
    command = [
        sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(CONFIG), "--num_processes", "2",
        "--mixed_precision", "no", "--main_process_port", "29534",
        str(WORKER), model_dir, str(out_dir), kind, "masking", trainer, skip,
    ]  # fmt: skip
    env = {"ACCELERATE_USE_CPU": "true"}
    done = subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT_S, check=False,
                          env={**__import__("os").environ, **env})  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    return [json.loads((out_dir / f"rank{rank}.json").read_text()) for rank in (0, 1)]


@pytest.fixture(scope="module")
def ddp_checksums(tiny_model_dir, tmp_path_factory):
    """The DDP run of each trainer on the same data: the update FSDP must reproduce."""
    return {
        kind: launch(tiny_model_dir, tmp_path_factory.mktemp(f"ddp-{kind}") / "run", kind, "masking")[0]["checksum"]
        for kind in ("grpo", "rloo")
    }


@pytest.mark.parametrize("skip", ["skip", "noskip"])
@pytest.mark.parametrize("kind", ["grpo", "rloo"])
def test_fsdp_with_an_all_masked_rank_matches_ddp(tiny_model_dir, tmp_path, ddp_checksums, kind, skip):
    ranks = launch_fsdp(tiny_model_dir, tmp_path / "fsdp", kind, skip=skip)
    assert [r["world_size"] for r in ranks] == [2, 2]
    assert ranks[0]["checksum"] == ranks[1]["checksum"]  # every rank sees the same whole parameters
    assert ranks[0]["checksum"] != ranks[0]["checksum_before"]  # the informative group trained
    tied_rank = next(r for r in ranks if {row["prompt"] for row in r["rows"]} == {"1+1="})
    assert all(row["tokens"] == 0 for row in tied_rank["rows"])  # one rank held only masked rows
    assert ranks[0]["checksum"] == pytest.approx(ddp_checksums[kind], rel=1e-6)


@pytest.mark.parametrize("kind", ["grpo", "rloo"])
def test_base_trl_runs_under_fsdp_on_cpu(tiny_model_dir, tmp_path, kind):
    """The control: TRL's own trainers run the same launch."""
    ranks = launch_fsdp(tiny_model_dir, tmp_path / "base", kind, trainer="base")
    assert ranks[0]["checksum"] == ranks[1]["checksum"] != ranks[0]["checksum_before"]
