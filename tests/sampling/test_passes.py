"""``trl_zerostd/sampling/passes.py``: a seeded sampler's passes drawn as an unbroken run draws them, whether the
sampler ran them all or was built afresh at a later pass (a resumed run)."""

import torch
from torch.utils.data import RandomSampler

from trl_zerostd.sampling.passes import ReplayedPasses


def seeded(seed: int = 3) -> tuple[RandomSampler, torch.Generator]:
    """A sampler whose randomness is all in its generator, seeded with ``seed`` (as TRL's ``RepeatSampler``)."""
    generator = torch.Generator().manual_seed(seed)
    return RandomSampler(range(10), generator=generator), generator


def test_an_unbroken_run_draws_the_sampler_s_own_passes():
    plain, _ = seeded()
    own = [list(plain) for _ in range(4)]
    replayed = ReplayedPasses(*seeded(), seed=3)
    assert [list(replayed) for _ in range(4)] == own
    assert len({tuple(order) for order in own}) == 4 and replayed.state_dict() == {"epoch": 4}


def test_a_sampler_built_afresh_at_a_pass_draws_that_pass_and_the_ones_after():
    plain, _ = seeded()
    own = [list(plain) for _ in range(4)]
    resumed = ReplayedPasses(*seeded(), seed=3)
    resumed.load_state_dict({"epoch": 2})
    assert [list(resumed) for _ in range(2)] == own[2:]


def test_a_pass_counts_once_drawn_to_its_end():
    """A checkpoint inside a pass holds that pass (the trainer skips what it trained of it); one at its end, the
    next."""
    replayed = ReplayedPasses(*seeded(), seed=3)
    order = iter(replayed)
    [next(order) for _ in range(10)]
    assert replayed.state_dict() == {"epoch": 0}
    assert next(order, None) is None and replayed.state_dict() == {"epoch": 1}
