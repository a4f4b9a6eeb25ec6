"""The prompts-come-back study (scripts/studies/revisited_prompts.py): its split (40 train prompts in today's level
shares, the 250 held-out prompts apart), its jobs seed by seed, and the prompts a record says skipping passed over."""

import collections
from types import SimpleNamespace

import torch

from demo.chat_arith_task import chat_arith_splits
from studies.revisited_prompts import ARMS_REVISITED, NUM_PROMPTS, RevisitedPromptsArguments
from studies.runs import PromptTally, passed_over, prompt_text
from studies.time_to_accuracy import jobs
from trl_zerostd.sampling.streams import PromptStream


def texts(split) -> list[str]:
    return [prompt_text(prompt) for prompt in split["prompt"]]


def test_the_split_has_40_train_prompts_in_todays_level_shares_and_the_held_out_split_apart():
    train, held_out = chat_arith_splits(NUM_PROMPTS, 250, seed=0)
    assert collections.Counter(train["level"]) == {"1": 6, "2": 6, "3": 8, "4": 8, "5": 6, "6": 6}
    assert len(held_out) == len(set(texts(held_out))) == 250
    assert not set(texts(train)) & set(texts(held_out))


def test_the_jobs_run_seed_by_seed_each_with_40_prompts():
    study = RevisitedPromptsArguments(seeds=[0, 1], runs_dir="/nowhere")
    planned = jobs(study)
    assert [(job[0], job[3]) for job in planned] == [(arm, seed) for seed in (0, 1) for arm in ARMS_REVISITED]
    for arm, flags, *_ in planned:
        assert flags[flags.index("--num_prompts") + 1] == "40"
        assert ("--zero_std_kl" in flags) == (arm != "trl")
        assert ("--skip_prior_key" in flags) == (arm == "skip-rate-prior-kf")


def test_passed_over_counts_a_row_taken_in_one_pass_and_skipped_in_another():
    assert passed_over([3, 1, 4, 1, 5], [1, 5]) == [3, 4, 1]


def test_the_skips_noted_are_the_rows_the_stream_consumed_and_did_not_draw():
    """A stream that draws odd rows only: the watched stream draws what an unwatched one does, and notes the even
    rows it passed over, at the step that drew them, as many as it counts."""
    rows = [{"prompt": [{"role": "user", "content": f"row {i}"}]} for i in range(10)]
    stream, unwatched = PromptStream(10, seed=3), PromptStream(10, seed=3)
    trainer = SimpleNamespace(
        zero_std=SimpleNamespace(refiller=SimpleNamespace(stream=stream, dataset=rows)),
        state=SimpleNamespace(global_step=0),
    )
    tally = PromptTally()
    tally.watch_skips(trainer)

    def odd(indices: torch.Tensor) -> torch.Tensor:
        return (indices % 2).double()

    for step in range(3):
        trainer.state.global_step = step
        drawn, skipped = stream.draw(4, odd)
        assert (drawn, skipped) == unwatched.draw(4, odd)
        assert len(tally.skips[step]) == skipped
        assert all(int(text.split()[1]) % 2 == 0 for text in tally.skips[step])
    assert sum(len(tally.skips[step]) for step in range(3)) > 0
