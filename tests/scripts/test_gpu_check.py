"""``scripts/studies/gpu_check.py`` (``make gpu-check``) on CPU: without a GPU the command says so and exits 0, so CI
is unaffected; its pure helpers (row alignment, syncs per step, stale rounds, the verdict, the table) are exact."""

import os

from studies.gpu_check import (
    CASES_BY_NAME,
    EXIT_LIMIT_S,
    MAX_STEPS,
    NO_GPU,
    CaseResult,
    evaluate,
    exit_code,
    format_table,
    misaligned_rows,
    per_step_counts,
    stale_generations,
)
from tests.support.launching import one_process_command, run_from_root

COMMAND = one_process_command("scripts/studies/gpu_check.py")  # make gpu-check


def test_without_a_gpu_it_says_so_and_exits_0(tmp_path):
    out = tmp_path / "table.md"
    done = run_from_root([*COMMAND, "--out", str(out)], timeout=120, env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    assert done.returncode == 0, done.stderr[-2000:]
    assert NO_GPU in done.stdout
    assert not out.exists()  # nothing measured, nothing written


def test_help_lists_the_cases():
    done = run_from_root([*COMMAND, "--help"], timeout=60)
    assert done.returncode == 0 and "--only" in done.stdout and "server-dynamic" in done.stdout


def test_misaligned_rows():
    assert misaligned_rows([[1, 2], [3]], [(1, 2), [3]]) == []
    assert misaligned_rows([[1, 2], [3], [3]], [[1, 2], [1, 2], [3]]) == [1]
    # a round that came back with fewer (or more) rows than it sent: the rows one side lacks are misaligned
    assert misaligned_rows([[1], [2], [3]], [[1]]) == [1, 2]
    assert misaligned_rows([[1]], [[1], [1]]) == [1]


def test_per_step_counts():
    events = [("sync", 0), ("generate", 0), ("generate", 0), ("sync", 1), ("generate", 1)]
    assert per_step_counts(events, "sync") == {0: 1, 1: 1}
    assert per_step_counts(events, "generate") == {0: 2, 1: 1}


def test_stale_generations():
    fresh = [("sync", 0), ("generate", 0), ("generate", 0), ("sync", 1), ("generate", 1)]
    assert stale_generations(fresh) == []
    assert stale_generations([("generate", 0)]) == [0]  # never synced
    assert stale_generations([("sync", 0), ("generate", 0), ("generate", 1)]) == [2]  # stepped, not synced
    # sleep mode (level 2) discards the weights: a round after a sleep needs its own sync
    slept = [("sync", 0), ("generate", 0), ("sleep", 0), ("generate", 0)]
    assert stale_generations(slept) == [3]
    assert stale_generations([*slept[:3], ("sync", 0), ("generate", 0)]) == []


def good_record(**changes):
    record = {
        "global_step": MAX_STEPS,
        "train_end": 0.0,
        "events": [("sync", 0), ("generate", 0), ("sync", 1), ("generate", 1)],
        "calls": [{"step": 0, "prompts": [[1, 2]] * 4, "returned": [[1, 2]] * 4}],
        "probes": [True, True],
        "zero_grad": {"tensors": 3, "nonzero": []},
    }
    return {**record, **changes}


def test_evaluate_passes_a_good_record():
    result = evaluate(CASES_BY_NAME["colocate-masking"], good_record(), 0, 5.0)
    assert result.status == "pass" and result.failures == []
    assert result.cells["rows aligned"] == "4/4"
    assert result.cells["syncs / rounds per step"] == "1 / 1"
    assert result.cells["engine = policy after sync"] == "2/2"
    assert result.cells["masked micro-batch grads"] == "3/3 zero"


def test_evaluate_fails_each_invariant():
    case = CASES_BY_NAME["colocate-masking"]
    misaligned = {"step": 0, "prompts": [[1], [1], [2], [2]], "returned": [[1], [1], [1], [1]]}
    broken = {
        "misaligned": (good_record(calls=[misaligned]), 0, 1.0),
        "stale": (good_record(events=[("sync", 0), ("generate", 0), ("generate", 1)]), 0, 1.0),
        "probe": (good_record(probes=[True, False]), 0, 1.0),
        "grads": (good_record(zero_grad={"tensors": 3, "nonzero": ["lm_head.weight"]}), 0, 1.0),
        "vacuous": (good_record(zero_grad={"tensors": 0, "nonzero": []}), 0, 1.0),
        "slow exit": (good_record(), 0, EXIT_LIMIT_S + 1),
        "exit code": (good_record(), 1, 1.0),
        "steps": (good_record(global_step=MAX_STEPS - 1), 0, 1.0),
        "no record": (None, None, None),
    }
    for why, (record, returncode, exit_s) in broken.items():
        result = evaluate(case, record, returncode, exit_s)
        assert result.status == "FAIL" and result.failures, why
    assert "2 of 4 rows" in evaluate(case, *broken["misaligned"]).failures[0]


def test_evaluate_hf_and_sleep_cases():
    hf = evaluate(CASES_BY_NAME["hf-zero3"], {"global_step": MAX_STEPS, "train_end": 0.0, "zero_grad": {
        "tensors": 2, "nonzero": []}}, 0, 3.0)  # fmt: skip
    assert hf.status == "pass" and "rows aligned" not in hf.cells
    # sleep mode: TRL re-syncs before every round of a step
    events = [("sync", 0), ("generate", 0), ("sync", 0), ("generate", 0)]
    sleep = evaluate(CASES_BY_NAME["colocate-sleep-dynamic"], good_record(events=events), 0, 3.0)
    assert sleep.status == "pass" and sleep.cells["syncs / rounds per step"] == "2 / 2"


def test_format_table():
    results = [
        CaseResult("a", "vLLM colocate", "pass", {"steps": "4/4", "rows aligned": "16/16", "wall (s)": "40"}),
        CaseResult("b", "HF | FSDP2", "FAIL", {"steps": "2/4"}, ["trained 2 of 4 steps"]),
        CaseResult("c", "vLLM server", "skipped: vllm not installed"),
    ]
    table = format_table(results, ["# GPU check"])
    lines = table.splitlines()
    assert lines[:2] == ["# GPU check", ""]
    assert lines[2] == (
        "| case | what | result | steps | rows aligned | syncs / rounds per step | engine = policy after sync | "
        "masked micro-batch grads | exit after train (s) | wall (s) |"
    )
    assert lines[3] == "|" + "---|" * 10
    assert lines[4] == "| a | vLLM colocate | pass | 4/4 | 16/16 | - | - | - | - | 40 |"
    assert lines[5] == "| b | HF \\| FSDP2 | FAIL | 2/4 | - | - | - | - | - | - |"
    assert lines[6] == "| c | vLLM server | skipped: vllm not installed | - | - | - | - | - | - | - |"
    assert lines[7:] == ["", "Failures:", "", "- b: trained 2 of 4 steps"]
    assert exit_code(results) == 1 and exit_code([results[0], results[2]]) == 0
