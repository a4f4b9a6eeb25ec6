"""The runs of the vLLM tests (``tests/trainer/test_vllm.py`` in one process, ``tests/launch/vllm_worker.py`` in two):
the prompts, the stand-in engine's completions for each, the config of each feature and the reward that records
rows scored against another prompt's completion."""

from __future__ import annotations

from tests.support.fake_vllm import answer, origin

DATA = ["1+1=", "2+3=", "4+4=", "3+5="]
SUMS = {p: str(sum(int(x) for x in p.rstrip("=").split("+"))) for p in DATA}
# "1+1=" is always right (a tied group); the others alternate right and wrong
TEXTS = {p: [SUMS[p]] if p == "1+1=" else [SUMS[p], "9"] for p in DATA}
VLLM = {"use_vllm": True, "max_completion_length": 8, "beta": 0.1}
GLOBAL_BATCH = 8
FEATURES = {
    "masking": {},
    "dynamic": {"dynamic_sampling": True},
    "skipping": {"skip_zero_std_prompts": True},
    "dynamic_skipping": {"dynamic_sampling": True, "skip_zero_std_prompts": True},
    "entropy": {"tied_group_entropy_scale": 0.2},  # GRPO only
}


class OriginReward:
    """The task reward of a fake completion, recording every scored row whose completion came from another prompt."""

    __name__ = "origin_reward"

    def __init__(self):
        self.rows = 0
        self.foreign = []

    def __call__(self, completions, prompts, **kwargs):
        self.rows += len(completions)
        self.foreign += [(p, c) for p, c in zip(prompts, completions) if origin(c) != p]
        return [float(answer(c) == SUMS[p]) for p, c in zip(prompts, completions)]
