"""Two-process data-parallel training on CPU (gloo) gives the rows, advantages and metrics of one process.

Launched as users launch it: ``accelerate launch --multi_gpu --num_processes 2`` with ``use_cpu=True`` in the
training config (``tests/launch/dp_worker.py``), every scenario in one launch (``ddp_runs``). The global batch is
two groups of 4, one per rank at first.
"""

import json

import pytest

from tests.launch.dp_worker import SCENARIOS, run_name, train_one
from tests.support.launching import by_row
from trl_zerostd.sampling.skipping import history_key


def results_of(ddp_runs, model_dir, out_dir, kind, scenario, num_processes=2):
    """The per-rank results of ``scenario``: in 2 processes, from the session's one data-parallel launch of every run
    (``ddp_runs``); in 1, trained in this process."""
    if num_processes == 2:
        return ddp_runs[run_name(kind, scenario)]
    assert num_processes == 1
    out_dir.mkdir()
    train_one(model_dir, str(out_dir), kind, scenario)
    result = json.loads((out_dir / "rank0.json").read_text())
    assert result["world_size"] == 1
    return [result]


@pytest.mark.parametrize("kind", ["grpo", "rloo"])
@pytest.mark.parametrize("scenario", ["masking", "masking_exclude"])
def test_two_processes_match_one(ddp_runs, tiny_model_dir, tmp_path, kind, scenario):
    """One rank gets the tied group only (all its rows masked: one row forwarded at zero weight) and finishes; under
    "exclude" each rank still hands TRL's loss as many rows (it gathers one value per row across ranks)."""
    ranks = results_of(ddp_runs, tiny_model_dir, tmp_path / "dp", kind, scenario)
    assert {row["prompt"] for row in ranks[0]["rows"]} != {row["prompt"] for row in ranks[1]["rows"]}
    single = results_of(ddp_runs, tiny_model_dir, tmp_path / "single", kind, scenario, num_processes=1)
    assert by_row(ranks) == by_row(single)  # advantages bit-identical
    tied = [row for row in single[0]["rows"] if row["prompt"] == "1+1="]
    assert tied and all(row["tokens"] == 0 and row["advantage"] == 0.0 for row in tied)
    for key in ("zero_std/masked_group_frac", "zero_std/masked_token_frac", "masked/row_frac/zero_std"):
        assert ranks[0]["logs"][0][key] == pytest.approx(single[0]["logs"][0][key]), key
    assert single[0]["logs"][0]["zero_std/masked_group_frac"] == 0.5


def test_entropy_signal_two_processes_match_one(ddp_runs, tiny_model_dir, tmp_path):
    """At the first step one rank gets the tied group only, the other the informative one: the tied rows train on
    their entropy-shaped advantages, the parameters are one process's, and the logged advantage sizes are summed over
    ranks."""
    ranks = results_of(ddp_runs, tiny_model_dir, tmp_path / "dp", "grpo", "entropy")
    single = results_of(ddp_runs, tiny_model_dir, tmp_path / "single", "grpo", "entropy", num_processes=1)
    assert {"1+1="} in [{row["prompt"] for row in rank["rows"][:4]} for rank in ranks]  # the first step's
    assert by_row(ranks) == by_row(single)
    tied = [row for row in single[0]["rows"] if row["prompt"] == "1+1="]
    assert tied and all(row["tokens"] > 0 for row in tied)  # trained, their advantages shaped at the loss
    assert ranks[0]["checksum"] == pytest.approx(single[0]["checksum"], rel=1e-6)
    for dp_step, single_step in zip(ranks[0]["logs"], single[0]["logs"], strict=True):
        sizes = {key: value for key, value in single_step.items() if key.endswith("_adv_abs_mean")}
        assert sizes["zero_std/tied_high_adv_abs_mean"] > 0 and sizes["zero_std/informative_adv_abs_mean"] > 0
        assert {key: dp_step.get(key) for key in sizes} == pytest.approx(sizes, rel=1e-5)
        assert dp_step["zero_std/tied_trained_group_frac"] == single_step["zero_std/tied_trained_group_frac"] == 0.5


@pytest.mark.every_trl
def test_dynamic_sampling_two_processes_match_one(ddp_runs, tiny_model_dir, tmp_path):
    """Same rounds, same groups kept, same rows and advantages on 2 ranks as on one; no trained group is tied."""
    ranks = results_of(ddp_runs, tiny_model_dir, tmp_path / "dp", "grpo", "dynamic")
    single = results_of(ddp_runs, tiny_model_dir, tmp_path / "single", "grpo", "dynamic", num_processes=1)
    assert by_row(ranks) == by_row(single)
    assert all(row["tokens"] > 0 for row in single[0]["rows"]) and "1+1=" not in {
        r["prompt"] for r in single[0]["rows"]
    }
    rounds = [[entry["dynamic_sampling/rounds"] for entry in result[0]["logs"]] for result in (ranks, single)]
    assert rounds[0] == rounds[1] and max(rounds[1]) >= 2  # a refill happened
    assert ranks[0]["checksum"] == pytest.approx(single[0]["checksum"], rel=1e-6)


@pytest.mark.parametrize("num_processes", [1, 2])
def test_dynamic_sampling_at_the_cap_finishes_with_zero_gradient(ddp_runs, tiny_model_dir, tmp_path, num_processes):
    """Every group zero-variance: 3 rounds, then the batch trains masked; no rank hangs, no parameter moves."""
    results = results_of(
        ddp_runs, tiny_model_dir, tmp_path / "run", "grpo", "dynamic_cap", num_processes=num_processes
    )
    for result in results:
        assert result["checksum"] == result["checksum_before"]
    assert results[0]["logs"][0]["dynamic_sampling/cap_reached"] == 1.0
    assert results[0]["logs"][0]["dynamic_sampling/rounds"] == 3


@pytest.mark.parametrize("scenario", ["skipping", "skipping_alone", "skipping_streaming"])
def test_prompt_skipping_two_processes_match_one(ddp_runs, tiny_model_dir, tmp_path, scenario):
    """Every rank records the same success rates per prompt and takes the same skip decisions as one process (a
    streaming dataset: every rank reads the same rows and keys their histories by the same hashes)."""
    ranks = results_of(ddp_runs, tiny_model_dir, tmp_path / "dp", "grpo", scenario)
    single = results_of(ddp_runs, tiny_model_dir, tmp_path / "single", "grpo", scenario, num_processes=1)
    assert by_row(ranks) == by_row(single)
    for result in ranks:
        assert result["skip_rates"] == single[0]["skip_rates"]
        assert result.get("skip_keys") == single[0].get("skip_keys")
    prompts = SCENARIOS[scenario]["prompts"]
    rates = single[0]["skip_rates"]
    order = list(range(len(prompts)))
    if scenario == "skipping_streaming":  # the hashed slots in use, put back in the order of the prompts
        order = [single[0]["skip_keys"].index(history_key(prompt)) for prompt in prompts]
    one_sided = dict(zip(prompts, [rates["one_sided"][i] for i in order], strict=True))
    split = dict(zip(prompts, [rates["split"][i] for i in order], strict=True))
    assert one_sided["1+1="] > 0 and not split["1+1="]  # drawn at least once, always all right: tied high
    assert all(split[p] for p in ("2+3=", "4+4=", "3+5="))  # informative
    drawn = [entry["prompt_skip/prompts_drawn"] for entry in ranks[0]["logs"]]
    assert drawn == [entry["prompt_skip/prompts_drawn"] for entry in single[0]["logs"]]
    skipped = [entry["prompt_skip/skipped_frac"] for entry in ranks[0]["logs"]]
    assert skipped == [entry["prompt_skip/skipped_frac"] for entry in single[0]["logs"]]
