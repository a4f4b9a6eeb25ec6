"""``trl_zerostd/trainer/state.py``: the state built from the settings (a feature on exactly when its object
exists), saved and restored, and each setting classified as one a resume may change or one it refuses. (Resuming a
trainer: ``tests/trainer/test_resume_settings.py``; a killed run resumed: ``tests/launch/test_killed_and_resumed.py``.)
"""

import json
from types import SimpleNamespace

import pytest
import torch
from datasets import Dataset

from trl_zerostd.core import RowRole
from trl_zerostd.core import settings as config
from trl_zerostd.core.settings import ZeroStdArguments
from trl_zerostd.trainer.state import SKIP_STATE_FILE, STATE_FILE, build_state


def test_every_setting_either_may_change_on_resume_or_is_refused_by_name(tmp_path):
    """Each field is classified: a per-batch one loads with a notice naming it, any other is refused naming it."""
    base = dict(dynamic_sampling=True, skip_zero_std_prompts=True, tied_group_entropy_scale=0.2)
    other_values = {
        "mask_zero_std_groups": False, "zero_std_atol": 0.5, "zero_std_normalization": "exclude",
        "zero_std_kl": "keep_failed", "dynamic_sampling": False, "dynamic_sampling_max_rounds": 3,
        "skip_zero_std_prompts": False, "skip_min_draw_prob": 0.1, "skip_history_key": "level",
        "skip_prior_key": "level", "zero_std_reward_funcs": ["answer"], "tied_group_entropy_scale": 0.0,
    }  # fmt: skip
    assert set(other_values) == set(config.ZERO_STD_FIELDS)
    built(**base).save(str(tmp_path))
    for name, value in other_values.items():
        state = built(**{**base, name: value})
        if name in config.PER_BATCH_FIELDS:
            (notice,) = state.load(str(tmp_path))
            assert notice.count(": the checkpoint") == 1 and f"{name}: the checkpoint" in notice
        else:
            with pytest.raises(ValueError, match=f"settings of objects that carry state.*{name}: this run"):
                state.load(str(tmp_path))
    assert set(config.PER_BATCH_FIELDS) == {
        "mask_zero_std_groups",
        "zero_std_normalization",
        "zero_std_kl",
        "tied_group_entropy_scale",
    }


def built(**settings):
    dataset = Dataset.from_dict({"prompt": ["1+1=", "2+3=", "4+4=", "3+5="], "level": [1, 1, 2, 2]})
    args = ZeroStdArguments(**settings)
    return build_state(args, SimpleNamespace(seed=0), "grpo", dataset, 2, 1, 0, reward_func_names=["answer", "format"])


def test_build_state_makes_an_object_exactly_for_each_feature_on():
    assert built().refiller is None and built().skipper is None
    dynamic = built(dynamic_sampling=True)
    assert dynamic.refiller is not None and dynamic.skipper is None
    skipping = built(skip_zero_std_prompts=True, skip_prior_key="level")
    assert skipping.refiller is not None and skipping.skipper is not None
    assert skipping.skipper.rates.group_counts.shape == (2, 2)  # the prior's two levels
    with pytest.raises(ValueError, match="skip_prior_key='band' is not a column"):
        built(skip_zero_std_prompts=True, skip_prior_key="band")
    with pytest.raises(ValueError, match="zero_std_kl='keep_failed' applies to GRPO"):
        build_state(ZeroStdArguments(zero_std_kl="keep_failed"), SimpleNamespace(seed=0), "rloo", [], 2, 1, 0)


def test_state_saves_and_loads_every_part(tmp_path):
    state = built(skip_zero_std_prompts=True, dynamic_sampling=True)
    state.reward_range = (0.0, 1.0)
    state.stall_monitor.observe_step(0)
    state.refiller.informative_history = (1.5, 3.0)
    state.refiller.stream.draw(3, state.skipper.draw_prob)
    state.skipper.record([0, 1], torch.tensor([1, 0]), torch.tensor([0.0, 1.0]), torch.tensor([2.0, 2.0]))
    state.save(str(tmp_path))
    assert {STATE_FILE, SKIP_STATE_FILE} <= {path.name for path in tmp_path.iterdir()}
    restored = built(skip_zero_std_prompts=True, dynamic_sampling=True)
    restored.load(str(tmp_path))
    assert restored.state_dict() == state.state_dict()
    for name, saved in state.skipper.rates.state_dict().items():
        assert torch.equal(restored.skipper.rates.state_dict()[name], saved), name
    assert restored.skipper.rates.split.tolist() == [False, True, False, False]
    with pytest.raises(ValueError, match="dynamic_sampling: this run False, the checkpoint True"):
        built(skip_zero_std_prompts=True).load(str(tmp_path))


def test_decide_plan_decides_each_batch_against_the_reward_range_of_the_run_so_far():
    """keep_failed keeps the KL term of the groups tied at the lowest task reward seen in training, so the range must
    carry over batches: a batch tied at 1 after one that saw 0 is all-correct, and a group tied at 0 failed."""
    state = built(zero_std_kl="keep_failed")
    no_flags = torch.zeros(4, dtype=torch.bool)

    def plan(rewards):
        rewards = torch.tensor(rewards)
        return state.decide_plan(rewards, rewards.view(-1, 1), no_flags, no_flags, num_generations=2)

    first = plan([0.0, 1.0, 1.0, 1.0])
    assert state.reward_range == (0.0, 1.0) and first.high_tied_groups.tolist() == [False, True]
    second = plan([1.0, 1.0, 1.0, 1.0])
    assert state.reward_range == (0.0, 1.0)
    assert second.low_tied_groups.tolist() == [False, False] and second.high_tied_groups.tolist() == [True, True]
    third = plan([0.0, 0.0, 1.0, 1.0])
    assert third.low_tied_groups.tolist() == [True, False]
    assert third.role.tolist() == [RowRole.KL_ONLY] * 2 + [RowRole.OUT] * 2


def test_a_checkpoint_of_0_1_resumes_and_one_that_ran_a_removed_feature_is_refused_by_name(tmp_path):
    """Version 0.1 wrote every field: one at the value now in force is read as it; one set otherwise ran a feature
    that is gone, and the resume is refused naming the field and what to use instead."""
    state = built(dynamic_sampling=True)
    state.save(str(tmp_path))
    path = tmp_path / STATE_FILE
    saved = json.loads(path.read_text())
    removed = {name: value for name, (value, _) in config.REMOVED_FIELDS.items()}
    path.write_text(json.dumps({**saved, "settings": {**saved["settings"], **removed}}))
    assert built(dynamic_sampling=True).load(str(tmp_path)) == []
    for name, value in {"per_prompt_budgets": True, "skip_refill": False, "skip_predictor": "streak"}.items():
        path.write_text(json.dumps({**saved, "settings": {**saved["settings"], **removed, name: value}}))
        with pytest.raises(ValueError, match=f"trl_zerostd.json sets \\['{name}'\\], removed in trl-zerostd 0.2"):
            built(dynamic_sampling=True).load(str(tmp_path))


def test_a_checkpoint_with_a_field_this_version_never_had_is_refused_by_name(tmp_path):
    """A checkpoint written by another version with a field this one lacks fails naming the field, not deep inside
    the settings' constructor."""
    built().save(str(tmp_path))
    path = tmp_path / STATE_FILE
    saved = json.loads(path.read_text())
    path.write_text(json.dumps({**saved, "settings": {**saved["settings"], "tied_group_signal": "none"}}))
    with pytest.raises(ValueError, match=r"sets \['tied_group_signal'\], which this version of trl_zerostd does not"):
        built().load(str(tmp_path))
