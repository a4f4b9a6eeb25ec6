"""``trl_zerostd/trainer/trl_layout.py``, TRL's internals the package reads or writes, on stand-ins of TRL's values:
a refill's rows joined back into what ``_generate`` returns, the environment instances each round may draw, and when
a trainer hands the rows that train to the last round's pass."""

from __future__ import annotations

import pytest
from torch.utils.data import SequentialSampler
from trl.trainer.utils import RepeatSampler

from trl_zerostd.trainer import trl_layout
from trl_zerostd.trainer.grpo import ZeroStdGRPOTrainer
from trl_zerostd.trainer.rloo import ZeroStdRLOOTrainer

pytestmark = pytest.mark.every_trl  # the layout of TRL's values, which a release may change


def grpo_record(images):
    """One row's ``split_grpo`` record: prompt ids, completion ids, tool mask, completion, logprobs, extras, images,
    tool images."""
    return ([1], [2], None, "c", None, {}, images, None)


def test_joined_images_are_a_list_per_row_where_any_row_has_one():
    image = object()
    joined = trl_layout.join_grpo([grpo_record([image]), grpo_record(None), grpo_record([])])
    assert joined.images == [[image], [], []]  # a row without images holds [] (TRL's dataset form), never None
    assert trl_layout.join_grpo([grpo_record(None), grpo_record([])]).images is None  # none at all: TRL reads none


def test_a_rollout_funcs_rows_keep_their_dataset_images():
    image = object()
    generated = ([[1]], [[2]], None, ["c"], None, {}, None, [])  # a rollout_func's _generate returns no images
    (record,) = trl_layout.split_grpo(generated, [{"prompt": "p", "images": [image]}])
    assert record[6] == [image]


class TRLDraws:
    """What TRL 1.16's ``_generate_and_score_completions`` does with its pool for ``rows`` (one environment name):
    hand out instances from the start, making one where the pool runs short."""

    def __init__(self):
        self.environment_factories = {None: dict}  # any factory: its instances are distinct objects
        self._environment_pool = {None: [{}]}
        self.environments = None

    def prepare(self, rows: int) -> None:
        pool = self._environment_pool[None]
        while len(pool) < rows:
            pool.append(self.environment_factories[None]())
        self.environments = pool[:rows]


def test_a_later_round_never_draws_an_instance_an_earlier_round_of_the_batch_holds():
    trainer = TRLDraws()
    first_instance = trainer._environment_pool[None][0]
    draws = trl_layout.EnvironmentDraws(trainer)
    rounds = []
    for rows in (3, 2, 4):
        with draws.round():
            trainer.prepare(rows)
            rounds.append(list(trainer.environments))
    held = [id(env) for environments in rounds for env in environments]
    assert len(held) == len(set(held)) == 9  # every rollout of the batch its own instance
    pool = trainer._environment_pool[None]
    assert pool[0] is first_instance and len(pool) == 9 and {id(env) for env in pool} == set(held)
    with trl_layout.EnvironmentDraws(trainer).round():  # the next batch starts from the pool's first instance
        trainer.prepare(2)
    assert trainer.environments == pool[:2] and trainer.environments[0] is first_instance


def test_the_rows_that_train_are_handed_over_in_place_unless_images_were_read_before_generate():
    text, image = {"prompt": "p"}, {"prompt": "p", "images": ["i"]}
    for rows_before, rows_after in (([text], [text]), ([image], [image]), ([text], [image]), ([image], [text])):
        grpo = ZeroStdGRPOTrainer._hands_over_in_place(None, rows_before, rows_after)
        rloo = ZeroStdRLOOTrainer._hands_over_in_place(None, rows_before, rows_after)
        assert grpo == (rows_before == [text] or rows_after == [image])  # GRPO reads images _generate returns
        assert rloo == (rows_before == [text] and rows_after == [text])  # RLOO reads them before _generate


def test_the_seeded_sampler_s_randomness_is_trl_s_repeat_sampler_s_generator_and_seed():
    """A shuffling ``RepeatSampler`` with a seed gives its generator and seed; one that does not shuffle, or has no
    seed, and any other sampler give None (their passes are left as TRL draws them)."""
    dataset = list(range(6))
    sampler = RepeatSampler(dataset, mini_repeat_count=2, batch_size=3, seed=5)
    assert trl_layout.seeded_sampler_randomness(sampler) == (sampler.generator, 5)
    assert trl_layout.seeded_sampler_randomness(RepeatSampler(dataset, 2, 3, shuffle=False, seed=5)) is None
    assert trl_layout.seeded_sampler_randomness(RepeatSampler(dataset, 2, 3)) is None
    assert trl_layout.seeded_sampler_randomness(SequentialSampler(dataset)) is None


def test_the_trainer_state_file_passes_reads_is_transformers():
    """``sampling.passes.pass_in_progress`` reads the file transformers writes into each checkpoint (pure: it names it
    without importing transformers)."""
    from transformers.trainer import TRAINER_STATE_NAME

    from trl_zerostd.sampling.passes import TRAINER_STATE

    assert TRAINER_STATE == TRAINER_STATE_NAME
