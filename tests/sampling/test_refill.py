"""The refill planner alone (``trl_zerostd/sampling/refill.py``): what each round asks for and what the batch keeps,
driven by scored rows made up here, with no model and no trainer."""

from __future__ import annotations

import pytest
import torch

from trl_zerostd.core.settings import ZeroStdArguments
from trl_zerostd.sampling.refill import BatchRefiller
from trl_zerostd.sampling.rounds import GatheredRows, RoundRequest
from trl_zerostd.sampling.skipping import PromptSkipper
from trl_zerostd.sampling.streams import PromptStream

G = 4
PROMPTS = [{"prompt": p} for p in ["1+1=", "2+3=", "4+4=", "3+5=", "2+2=", "1+6="]]
TIED = {"1+1=", "2+2="}  # every completion right: a zero-variance group


def refiller(**settings) -> BatchRefiller:
    args = ZeroStdArguments(**settings)
    return BatchRefiller(args, PromptStream(len(PROMPTS), seed=0), PROMPTS, G, world_size=1, rank=0)


def scored(request: RoundRequest, log: list, tied: set[str]) -> list[GatheredRows]:
    """Each part's rows as the adapter would return them in one process: a tied prompt all right, another right and
    wrong in turn."""
    parts = []
    for part in request.parts:
        rows = part.local_rows(1, 0)
        log.append([(row["prompt"], copies) for row, copies in zip(part.prompts, part.copies)] or len(rows))
        rewards = torch.tensor([[1.0 if r["prompt"] in tied else float(i % 2)] for i, r in enumerate(rows)])
        records = [(r["prompt"], i) for i, r in enumerate(rows)]
        parts.append(
            GatheredRows(rows, records, rewards, torch.zeros(len(rows), dtype=torch.bool), rewards[:, 0],
                         [{} for _ in rows])
        )  # fmt: skip
    return parts


def run(planner: BatchRefiller, inputs: list[dict], tied: set[str] = TIED, reward_range=None):
    rounds, log = planner.plan(inputs, reward_range=reward_range), []
    while (request := rounds.next_round()) is not None:
        rounds.add(scored(request, log, tied))
    return rounds.finish(), log


def test_dynamic_sampling_asks_for_more_prompts_until_the_batch_is_informative():
    """The dataloader's two groups (one tied) come first; the planner then asks for whole groups of the stream's next
    prompts until two informative groups are in, and keeps those alone."""
    inputs = [PROMPTS[0]] * G + [PROMPTS[1]] * G
    refilled, log = run(refiller(dynamic_sampling=True), inputs)
    assert log[0] == 2 * G  # round 1: TRL's own rows
    assert len(log) >= 2 and all(copies == G for part in log[1:] for _, copies in part)
    trained = [row["prompt"] for row in refilled.rows]
    assert len(trained) == 2 * G and not set(trained) & TIED
    assert refilled.metrics["dynamic_sampling/rounds"] == len(log)
    assert refilled.records == [record for record in refilled.records if record[0] not in TIED]


def test_at_the_cap_the_batch_is_completed_with_tied_groups():
    every_prompt = {row["prompt"] for row in PROMPTS}
    planner = refiller(dynamic_sampling=True, dynamic_sampling_max_rounds=2)
    refilled, log = run(planner, [PROMPTS[0]] * 2 * G, tied=every_prompt)
    assert len(log) == 2 and refilled.metrics["dynamic_sampling/cap_reached"] == 1.0
    assert len(refilled.rows) == 2 * G and planner.cap_warned


def test_the_rounds_refuse_misuse():
    rounds = refiller(dynamic_sampling=True).plan([PROMPTS[1]] * 2 * G, reward_range=None)
    with pytest.raises(RuntimeError, match="still has rounds"):
        rounds.finish()
    with pytest.raises(ValueError, match="parts"):
        rounds.add([])


def test_prompt_skipping_draws_the_batch_from_the_stream_and_records_every_group():
    """One round of the stream's prompts (not the dataloader's), each group's outcome in the skipper's history; a
    tied prompt is then drawn less than one never drawn."""
    skipper = PromptSkipper.new(len(PROMPTS), 0.05, G)
    stream = PromptStream(len(PROMPTS), seed=0)
    planner = BatchRefiller(ZeroStdArguments(skip_zero_std_prompts=True), stream, PROMPTS, G, 1, 0, skipper)
    tied = {"1+6="}  # the stream's first prompt: tied, its second informative
    refilled, log = run(planner, [PROMPTS[0]] * 2 * G, tied=tied, reward_range=(0.0, 1.0))
    (first,) = log
    drawn = [prompt for prompt, _ in first]
    assert [copies for _, copies in first] == [G, G] and [row["prompt"] for row in refilled.rows][::G] == drawn
    assert drawn == [PROMPTS[i]["prompt"] for i in PromptStream(len(PROMPTS), seed=0).take(2)]
    indices = [next(i for i, row in enumerate(PROMPTS) if row["prompt"] == prompt) for prompt in drawn]
    assert skipper.rates.rows[indices].tolist() == [G, G] and refilled.metrics["prompt_skip/prompts_drawn"] == 2
    assert skipper.draw_prob(torch.tensor(indices)).tolist()[0] < 1.0 == skipper.draw_prob(torch.tensor(indices))[1]
    assert drawn[0] in tied and drawn[1] not in tied
