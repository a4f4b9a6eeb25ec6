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
    assert len({tuple(order) for order in own}) == 4 and replayed.epoch == 4


def test_a_sampler_built_afresh_at_a_pass_draws_that_pass_and_the_ones_after():
    plain, _ = seeded()
    own = [list(plain) for _ in range(4)]
    resumed = ReplayedPasses(*seeded(), seed=3)
    resumed.resume_at(2)
    assert [list(resumed) for _ in range(2)] == own[2:]


def test_a_pass_counts_once_begun_and_a_resume_sets_the_pass_from_the_trainer_s_count():
    """The count moves when a pass begins, however far it is read (a loader's workers read ahead); a resume inside a
    pass sets it back to that pass, and its order is drawn again from the start (the trainer skips what it trained)."""
    plain, _ = seeded()
    own = [list(plain) for _ in range(3)]
    replayed = ReplayedPasses(*seeded(), seed=3)
    list(replayed)
    order = iter(replayed)
    next(order)
    assert replayed.epoch == 2
    replayed.resume_at(1)
    assert list(replayed) == own[1] and replayed.epoch == 2
