"""The budgets study's floor: runs re-costed as if each tied group had cost only the first round."""

from types import SimpleNamespace

import pytest

from benchmarks.time_to_accuracy_arms import arm_flags, groups_per_step
from benchmarks.time_to_accuracy_checks import budget_floor
from benchmarks.time_to_accuracy_metrics import crossing, ties_cut_to_first_round

ARGS = SimpleNamespace(num_generations=8, seeds=[0])


def run(arm: str, tied: list, **extra) -> dict:
    """Four steps of 800 tokens each (8 completions of 100 a prompt), evaluated at steps 0, 2 and 4."""
    return {
        "arm": arm, "seed": 0, "num_tokens": [800.0, 1600.0, 2400.0, 3200.0], "step_time": [1.0] * 4,
        "generation_s": [0.5] * 4, "frac_reward_zero_std": tied, "eval": [[0, 0.0], [2, 0.5], [4, 1.0]], **extra,
    }  # fmt: skip


def test_tied_groups_cost_the_first_round_and_the_others_the_whole_group():
    record = run("trl", [0.0, 1.0, 0.5, None])
    cut = ties_cut_to_first_round(record, first_round=2, group=8)
    assert cut["generated_tokens"] == [800.0, 1000.0, 1500.0, 2300.0]  # +800, +200, +500, +800 (None: as run)
    assert record["num_tokens"] == [800.0, 1600.0, 2400.0, 3200.0]  # the record itself is left as run
    assert crossing(cut, 0.5) == (1000.0, 2.0)  # tokens re-costed, wall time as run


def test_a_budgeted_step_is_re_costed_from_what_it_spent():
    # 4 completions a prompt spent, half the groups tied: the floor is 2 x 0.5 + 8 x 0.5 = 5 of the 4 spent
    record = run("budgets", [0.5, 0.5], completions_per_prompt=[4.0, 8.0], generated_tokens=[400.0, 1200.0])
    assert ties_cut_to_first_round(record, 2, 8)["generated_tokens"] == [500.0, 1000.0]  # its own tokens, not TRL's


def test_floor_rows_for_trl_and_each_budgets_arm_the_peer_left_out():
    records = {
        "trl": [run("trl", [0.5] * 4)],
        "keep_failed": [run("keep_failed", [0.0] * 4)],
        "budgets-prior": [run("budgets-prior", [0.5] * 4, completions_per_prompt=[6.0, 6.0, 4.0, 4.0])],
        "budgets-prior-yield": [run("budgets-prior-yield", [0.5] * 4)],  # a run that did not log its spend
        "cgrpo": [run("cgrpo", [0.5] * 4, completions_per_prompt=[17.0] * 4)],
    }
    lines = budget_floor(records, {0: 0.5}, ARGS)
    assert "| trl | 1.00 | 0.62 | 1.00 -> 0.62 |" in lines  # every step half tied: (4 + 1) / 8 of the tokens
    assert "| keep_failed | 1.00 | 1.00 | 1.00 -> 1.00 |" in lines  # nothing tied: nothing to cut
    assert "| budgets-prior | 1.00 | 0.83 | 1.00 -> 0.83 |" in lines  # 5 of the 6 its first two steps spent
    assert "| budgets-prior | 5.00 | 0.50 | 5.00 | 1.00 |" in lines  # floor: 2 x 0.5 + 8 x 0.5
    assert "| budgets-prior-yield | 1.00 | ? | 1.00 -> ? |" in lines  # not re-costed as if it had spent 8
    assert "| budgets-prior-yield | not logged | | | |" in lines
    assert not any(line.startswith("| cgrpo") for line in lines)
    assert budget_floor({"trl": records["trl"]}, {0: 0.5}, ARGS) == []


def test_a_spend_list_of_another_length_fails():
    with pytest.raises(ValueError):
        ties_cut_to_first_round(run("budgets", [0.5] * 4, completions_per_prompt=[4.0]), 2, 8)


def test_an_arm_with_groups_of_4_is_floored_at_its_own_group():
    # the arm's --num_generations 4: a tie costs 2 of 4, so half the groups tied floor at 2 x 0.5 + 4 x 0.5 = 3
    arm = "budgets-prior-yield-kf-g4"
    records = {
        "trl": [run("trl", [0.5] * 4)],
        arm: [run(arm, [0.5] * 4, completions_per_prompt=[3.0] * 4, generated_tokens=[300.0, 600.0, 900.0, 1200.0])],
    }
    lines = budget_floor(records, {0: 0.5}, ARGS)
    assert f"| {arm} | 3.00 | 0.50 | 3.00 | 1.00 |" in lines
    assert f"| {arm} | 0.38 | 0.38 | 0.38 -> 0.38 |" in lines  # re-costed at 4 a group it spent 3: as run


@pytest.mark.parametrize(("arm", "batch"), [("trl-g4", "16"), ("trl-g2", "8"), ("budgets-prior-yield-kf-g4", "16")])
def test_smaller_groups_keep_the_study_s_prompts_a_step(arm, batch):
    study = SimpleNamespace(completions_per_step=32, num_generations=8, difficulty_column="level")
    assert groups_per_step(arm, study) == groups_per_step("trl", study) == 4
    assert arm_flags(arm, study)[-2:] == ["--per_device_train_batch_size", batch]
