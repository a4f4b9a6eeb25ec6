import pytest

from benchmarks.step_cost import StepCostArguments, main


@pytest.mark.parametrize(("arms", "steps"), [(["trl", "trl-g4"], [3]), (["trl"], [0]), (["trl", "trl"], [3, 3])])
def test_bad_arms_or_step_counts_fail_before_training(arms, steps):
    with pytest.raises(ValueError, match="--steps|--arms"):
        main(StepCostArguments(arms=arms, steps=steps))
