"""The wall-time table against base TRL made again (`trl-rerun`) under the later arms' load."""

from studies.time_to_accuracy_checks import wall_against_rerun


def run(arm: str, seed: int, step_s: float) -> dict:
    """Four steps of 800 tokens, ``step_s`` seconds each, the held-out reward 0, 0.5, 1 at steps 0, 2, 4."""
    return {
        "arm": arm, "seed": seed, "num_tokens": [800.0, 1600.0, 2400.0, 3200.0], "step_time": [step_s] * 4,
        "generation_s": [step_s / 2] * 4, "eval": [[0, 0.0], [2, 0.5], [4, 1.0]],
    }  # fmt: skip


def test_wall_ratios_are_taken_over_the_re_runs_on_their_seeds_only():
    per_arm = {
        "trl": [run("trl", 0, 1.0), run("trl", 1, 1.0)],
        "trl-g4": [run("trl-g4", 0, 1.0), run("trl-g4", 1, 0.25)],
        "trl-rerun": [run("trl-rerun", 0, 2.0)],  # made again on seed 0 only, at twice the cached step time
    }
    lines = wall_against_rerun(per_arm, {0: 0.5, 1: 0.5})
    assert lines[-4:-3] == ["| arm | tokens / TRL made again (median) | wall / TRL made again (median) | seed 0 |"]
    assert "| trl | 1.00 | 0.50 | 0.50 |" in lines  # the cached run took half the re-run's wall time
    assert "| trl-g4 | 1.00 | 0.50 | 0.50 |" in lines  # seed 1 (0.25 of the cached run) has no re-run
    assert not any(line.startswith("| trl-rerun") for line in lines)


def test_no_re_run_no_table():
    assert wall_against_rerun({"trl": [run("trl", 0, 1.0)]}, {0: 0.5}) == []


def test_a_re_run_that_never_reaches_the_target_gives_no_column():
    per_arm = {"trl": [run("trl", 0, 1.0), run("trl", 1, 1.0)], "trl-rerun": [run("trl-rerun", 0, 2.0)]}
    per_arm["trl-rerun"].append(dict(run("trl-rerun", 1, 2.0), eval=[[0, 0.0], [4, 0.25]]))
    lines = wall_against_rerun(per_arm, {0: 0.5, 1: 0.5})
    assert "seed 1" not in lines[3] and "| trl | 1.00 | 0.50 | 0.50 |" in lines
    per_arm["trl-rerun"] = per_arm["trl-rerun"][1:]
    assert wall_against_rerun(per_arm, {0: 0.5, 1: 0.5}) == []
