"""Sharded training (FSDP2, DeepSpeed ZeRO-3) on CPU with a lopsided batch: both trainers, and base TRL's trainers
as the control, launched with ``accelerate launch --config_file fsdp2.yaml``.

accelerate 1.15 has no FSDP path on CPU: with ``use_cpu`` it runs an FSDP config as DDP (``MULTI_CPU``), which the
first test shows. The others set ``ZEROSTD_TEST_CPU_FSDP=1``, which makes the worker switch accelerate's state to FSDP
(``tests/launch/dp_worker.force_cpu_fsdp``), so PyTorch's FSDP2 shards the model (DTensor parameters, asserted)
over gloo.

The batch puts the tied group on one rank and the informative group on the other, so one rank forwards a single
row at zero weight while the other trains (with ``tied_group_entropy_scale=0.2``, the tied rank trains its rows on
their entropy-shaped advantages): FSDP's parameter gathers must stay in step. The run must finish within the
timeout, and make the update of the DDP run on the same data.
"""

import json
import os
import sys

import pytest

from tests.launch.test_distributed import launch
from tests.support.launching import DP_WORKER, ROOT, free_port, run_from_root

CONFIG = ROOT / "scripts" / "accelerate" / "fsdp2.yaml"
ZERO3_CONFIG = CONFIG.with_name("deepspeed_zero3.yaml")
TIMEOUT_S = 300
SHARDED_CASES = [("grpo", "masking"), ("rloo", "masking"), ("grpo", "entropy")]  # (kind, dp_worker scenario)


def launch_fsdp(model_dir, out_dir, kind, trainer="ours", force=True, config=CONFIG, env=None, scenario="masking"):
    out_dir.mkdir()
    command = [
        sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(config), "--num_processes", "2",
        "--mixed_precision", "no", "--main_process_port", free_port(),
        "-m", DP_WORKER, model_dir, str(out_dir), kind, scenario, trainer,
    ]  # fmt: skip
    env = {**os.environ, "ACCELERATE_USE_CPU": "true", "ZEROSTD_TEST_CPU_FSDP": "1" if force else "0", **(env or {})}
    done = run_from_root(command, timeout=TIMEOUT_S, env=env)
    assert done.returncode == 0, done.stderr[-4000:]
    return [json.loads((out_dir / f"rank{rank}.json").read_text()) for rank in (0, 1)]


def test_accelerate_runs_an_fsdp_config_as_ddp_on_cpu(tiny_model_dir, tmp_path):
    """Why the harness is needed: the same launch without it trains, but unsharded, as DDP."""
    ranks = launch_fsdp(tiny_model_dir, tmp_path / "plain", "grpo", force=False)
    assert {r["distributed_type"] for r in ranks} == {"DistributedType.MULTI_CPU"}
    assert not any(r["sharded"] for r in ranks)


@pytest.fixture(scope="module")
def ddp_updates(tiny_model_dir, tmp_path_factory):
    """The DDP run of each trainer and scenario on the same data: the update the sharded runs must reproduce."""
    return {
        (kind, scenario): update(
            launch(tiny_model_dir, tmp_path_factory.mktemp(f"ddp-{kind}-{scenario}") / "run", kind, scenario)[0]
        )
        for kind, scenario in SHARDED_CASES
    }


def update(result):
    """How much one step moved the parameter sum (learning rate 1e-2: clearly non-zero)."""
    return result["checksum"] - result["checksum_before"]


@pytest.mark.parametrize(("kind", "scenario"), SHARDED_CASES)
def test_fsdp_with_a_lopsided_batch_matches_ddp(tiny_model_dir, tmp_path, ddp_updates, kind, scenario):
    """``entropy``: the tied rank's rows train instead, on their entropy-shaped advantages."""
    ranks = launch_fsdp(tiny_model_dir, tmp_path / "fsdp", kind, scenario=scenario)
    assert [r["world_size"] for r in ranks] == [2, 2] and all(r["sharded"] for r in ranks)
    assert {r["distributed_type"] for r in ranks} == {"DistributedType.FSDP"}
    assert ranks[0]["checksum"] == ranks[1]["checksum"]  # every rank sees the same whole parameters
    tied_rank = next(r for r in ranks if {row["prompt"] for row in r["rows"][:4]} == {"1+1="})
    tied_tokens = [row["tokens"] for row in tied_rank["rows"][:4]]
    assert all(tokens > 0 for tokens in tied_tokens) if scenario == "entropy" else not any(tied_tokens)
    expected = ddp_updates[kind, scenario]
    assert abs(expected) > 1e-3 and update(ranks[0]) == pytest.approx(expected, rel=1e-4)


@pytest.mark.parametrize(("kind", "scenario"), SHARDED_CASES)
def test_deepspeed_zero3_with_a_lopsided_batch_matches_ddp(tiny_model_dir, tmp_path, ddp_updates, kind, scenario):
    """DeepSpeed ZeRO-3 (its CPU accelerator, over gloo; the worker switches accelerate's state to DeepSpeed, which
    accelerate also enables only from a GPU-like distributed type): the same run, the same update."""
    pytest.importorskip("deepspeed")
    ranks = launch_fsdp(
        tiny_model_dir,
        tmp_path / "zero3",
        kind,
        config=ZERO3_CONFIG,
        force=False,
        env={"DS_ACCELERATOR": "cpu", "ACCELERATE_USE_CPU": "false"},
        scenario=scenario,
    )
    assert {r["distributed_type"] for r in ranks} == {"DistributedType.DEEPSPEED"}
    assert ranks[0]["checksum"] == ranks[1]["checksum"]
    assert update(ranks[0]) == pytest.approx(ddp_updates[kind, scenario], rel=1e-4)


@pytest.mark.parametrize("kind", ["grpo", "rloo"])
def test_base_trl_runs_under_fsdp_on_cpu(tiny_model_dir, tmp_path, kind):
    """The control: TRL's own trainers run the same launch."""
    ranks = launch_fsdp(tiny_model_dir, tmp_path / "base", kind, trainer="base")
    assert all(r["sharded"] for r in ranks)
    assert ranks[0]["checksum"] == ranks[1]["checksum"] and abs(update(ranks[0])) > 1e-3
