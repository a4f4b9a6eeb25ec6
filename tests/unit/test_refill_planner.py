"""The refill planner alone (``trl_zerostd/refill.py``): what each round asks for and what the batch keeps, driven
by scored rows made up here, with no model and no trainer."""

from __future__ import annotations

import pytest
import torch

from trl_zerostd.config import ZeroStdArguments
from trl_zerostd.refill import BatchRefiller
from trl_zerostd.rounds import GatheredRows, RoundRequest
from trl_zerostd.sampling import PromptStream

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


def run(planner: BatchRefiller, inputs: list[dict], tied: set[str] = TIED):
    rounds, log = planner.plan(inputs, reward_range=None), []
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


def test_a_screen_asks_for_few_rows_first_then_the_rest_of_the_groups_that_differ():
    refilled, log = run(refiller(dynamic_sampling=True, dynamic_sampling_screen=2), [PROMPTS[0]] * 2 * G)
    first = log[0]
    assert {copies for _, copies in first} == {2}  # screens
    rest = [part for part in log[1:] if all(copies == G - 2 for _, copies in part)]
    assert rest and {p for part in rest for p, _ in part} <= {p for p, _ in first} - TIED
    assert len(refilled.rows) == 2 * G and not {row["prompt"] for row in refilled.rows} & TIED


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
