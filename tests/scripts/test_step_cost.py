import pytest

from benchmarks.step_cost import StepCostArguments, main


def test_a_step_count_per_arm_is_required():
    with pytest.raises(ValueError, match="--steps needs one count per arm"):
        main(StepCostArguments(arms=["trl", "trl-g4"], steps=[3]))
