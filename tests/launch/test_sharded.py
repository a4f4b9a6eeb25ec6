"""Sharded training (FSDP2, DeepSpeed ZeRO-3) on CPU with a lopsided batch: both trainers, and base TRL's trainers
as the control, launched with ``accelerate launch --config_file fsdp2.yaml``.

accelerate 1.15 has no FSDP path on CPU: with ``use_cpu`` it runs an FSDP config as DDP (``MULTI_CPU``), which the
first test shows. The others set ``ZEROSTD_TEST_CPU_FSDP=1``, which makes the worker switch accelerate's state to FSDP
(``tests/launch/dp_worker.force_cpu_fsdp``), so PyTorch's FSDP2 shards the model (DTensor parameters, asserted)
over gloo. Each layout runs every case in one launch (``fsdp_runs``, ``zero3_runs``); the data-parallel reference is
the session's launch (``ddp_runs``).

The batch puts the tied group on one rank and the informative group on the other, so one rank forwards a single
row at zero weight while the other trains (with ``tied_group_entropy_scale=0.2``, the tied rank trains its rows on
their entropy-shaped advantages): FSDP's parameter gathers must stay in step. The run must finish within the
timeout, and make the update of the DDP run on the same data.
"""

import os

import pytest

from tests.launch.dp_worker import run_name
from tests.support.launching import DP_WORKER, ROOT, launch_runs, two_process_command

CONFIG = ROOT / "scripts" / "accelerate" / "fsdp2.yaml"
ZERO3_CONFIG = CONFIG.with_name("deepspeed_zero3.yaml")
TIMEOUT_S = 600
SHARDED_CASES = [("grpo", "masking"), ("rloo", "masking"), ("grpo", "entropy")]  # (kind, dp_worker scenario)
BASE_RUNS = [run_name(kind, "masking", "base") for kind in ("grpo", "rloo")]  # TRL's own trainers, the control


def cases_marking(every_trl_case):
    """SHARDED_CASES with ``every_trl_case`` marked to run on every TRL release of the range."""
    every_trl = pytest.mark.every_trl
    return [pytest.param(*case, marks=every_trl) if case == every_trl_case else case for case in SHARDED_CASES]


def launch_sharded(model_dir, out_root, runs, config=CONFIG, env=None):
    """``runs`` (dp_worker run names) in one 2-process launch under ``config``: ``{run: per-rank results}``."""
    command = two_process_command(DP_WORKER, model_dir, str(out_root), *runs, config_file=config)
    env = {**os.environ, "ACCELERATE_USE_CPU": "true", **(env or {})}
    return launch_runs(command, out_root, runs, num_processes=2, timeout=TIMEOUT_S, env=env)


@pytest.fixture(scope="module")
def fsdp_runs(tiny_model_dir, tmp_path_factory):
    """Every case, and TRL's own trainers, under FSDP2 (``ZEROSTD_TEST_CPU_FSDP=1``), in one launch."""
    runs = [run_name(kind, scenario) for kind, scenario in SHARDED_CASES] + BASE_RUNS
    return launch_sharded(tiny_model_dir, tmp_path_factory.mktemp("fsdp"), runs, env={"ZEROSTD_TEST_CPU_FSDP": "1"})


@pytest.fixture(scope="module")
def zero3_runs(tiny_model_dir, tmp_path_factory):
    """Every case under DeepSpeed ZeRO-3, in one launch."""
    pytest.importorskip("deepspeed")
    runs = [run_name(kind, scenario) for kind, scenario in SHARDED_CASES]
    env = {"DS_ACCELERATOR": "cpu", "ACCELERATE_USE_CPU": "false"}
    return launch_sharded(tiny_model_dir, tmp_path_factory.mktemp("zero3"), runs, config=ZERO3_CONFIG, env=env)


def test_accelerate_runs_an_fsdp_config_as_ddp_on_cpu(tiny_model_dir, tmp_path):
    """Why the harness is needed: the same launch without it trains, but unsharded, as DDP."""
    run = run_name("grpo", "masking")
    ranks = launch_sharded(tiny_model_dir, tmp_path, [run], env={"ZEROSTD_TEST_CPU_FSDP": "0"})[run]
    assert {r["distributed_type"] for r in ranks} == {"DistributedType.MULTI_CPU"}
    assert not any(r["sharded"] for r in ranks)


def ddp_update(ddp_runs, kind, scenario):
    """The update of the data-parallel run on the same data (``ddp_runs``): what the sharded runs must reproduce."""
    return update(ddp_runs[run_name(kind, scenario)][0])


def update(result):
    """How much one step moved the parameter sum (learning rate 1e-2: clearly non-zero)."""
    return result["checksum"] - result["checksum_before"]


@pytest.mark.parametrize(("kind", "scenario"), cases_marking(("grpo", "masking")))
def test_fsdp_with_a_lopsided_batch_matches_ddp(fsdp_runs, ddp_runs, kind, scenario):
    """``entropy``: the tied rank's rows train instead, on their entropy-shaped advantages."""
    ranks = fsdp_runs[run_name(kind, scenario)]
    assert [r["world_size"] for r in ranks] == [2, 2] and all(r["sharded"] for r in ranks)
    assert {r["distributed_type"] for r in ranks} == {"DistributedType.FSDP"}
    assert ranks[0]["checksum"] == ranks[1]["checksum"]  # every rank sees the same whole parameters
    tied_rank = next(r for r in ranks if {row["prompt"] for row in r["rows"][:4]} == {"1+1="})
    tied_tokens = [row["tokens"] for row in tied_rank["rows"][:4]]
    assert all(tokens > 0 for tokens in tied_tokens) if scenario == "entropy" else not any(tied_tokens)
    expected = ddp_update(ddp_runs, kind, scenario)
    assert abs(expected) > 1e-3 and update(ranks[0]) == pytest.approx(expected, rel=1e-4)


@pytest.mark.parametrize(("kind", "scenario"), cases_marking(("rloo", "masking")))
def test_deepspeed_zero3_with_a_lopsided_batch_matches_ddp(zero3_runs, ddp_runs, kind, scenario):
    """DeepSpeed ZeRO-3 (its CPU accelerator, over gloo; the worker switches accelerate's state to DeepSpeed, which
    accelerate also enables only from a GPU-like distributed type): the same run, the same update."""
    ranks = zero3_runs[run_name(kind, scenario)]
    assert {r["distributed_type"] for r in ranks} == {"DistributedType.DEEPSPEED"}
    assert ranks[0]["checksum"] == ranks[1]["checksum"]
    assert update(ranks[0]) == pytest.approx(ddp_update(ddp_runs, kind, scenario), rel=1e-4)


@pytest.mark.every_trl
@pytest.mark.parametrize("kind", ["grpo", "rloo"])
def test_base_trl_runs_under_fsdp_on_cpu(fsdp_runs, kind):
    """The control: TRL's own trainers run the same launch."""
    ranks = fsdp_runs[run_name(kind, "masking", "base")]
    assert all(r["sharded"] for r in ranks)
    assert ranks[0]["checksum"] == ranks[1]["checksum"] and abs(update(ranks[0])) > 1e-3
