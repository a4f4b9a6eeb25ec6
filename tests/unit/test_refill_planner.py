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


def budgeted(world_size: int = 1, rank: int = 0, skipper=None, **settings) -> BatchRefiller:
    args = ZeroStdArguments(per_prompt_budgets=True, **settings)
    stream = PromptStream(len(PROMPTS), seed=0)
    return BatchRefiller(args, stream, PROMPTS, G, world_size=world_size, rank=rank, skipper=skipper)


def test_budgets_complete_the_prompts_that_differ_and_stop_a_tie_unlikely_to_break():
    """G = 4, steps of 2: every prompt gets 2 first; the informative ones get their other 2; a tie of 2 goes on under
    a uniform prior (P(break in 2 more) = 2/5 < 0.5 stops it at 0.5; 0.3 lets it go on). The batch is each prompt's
    rows then its empty slots, NaN rewards, never truncated."""
    refilled, log = run(budgeted(), [PROMPTS[0]] * 2 * G)
    first, second = log
    assert [copies for _, copies in first] == [2, 2]
    assert second == [(p, 2) for p, _ in first if p not in TIED]
    prompts = [p for p, _ in first]
    tied = [i for i, p in enumerate(prompts) if p in TIED]
    empty = refilled.empty.view(2, G)
    for i in range(2):
        assert empty[i].tolist() == ([False, False, True, True] if i in tied else [False] * G)
    assert torch.isnan(refilled.rewards_per_func[refilled.empty]).all()
    assert not refilled.truncated[refilled.empty].any()
    assert [row["prompt"] for row in refilled.rows] == [p for p in prompts for _ in range(G)]
    assert refilled.metrics["budget/completions_per_prompt"] == (4 * (2 - len(tied)) + 2 * len(tied)) / 2

    refilled, log = run(budgeted(budget_continue_prob=0.3), [PROMPTS[0]] * 2 * G)
    assert not refilled.empty.any() and len(log) == 2  # the tie went on to 4 rows with the others' completion


def test_budgets_stop_a_tie_at_once_under_a_prior_of_failure_and_go_on_under_an_uncertain_one():
    """The prior is the skipper's success rate: a prompt believed solved 19 times in 20 stops after a tie of 2 right
    completions (rewards seen so far in [0, 1]: a tie at 1 is a tie at success, P(a failure) is what counts); one
    with a uniform prior goes on."""

    class Prior:
        def __init__(self, a, b):
            self.a, self.b = a, b

        def success_prior(self, keys):
            return torch.full((len(keys),), self.a), torch.full((len(keys),), self.b)

        draw_prob = None

    every_prompt = {row["prompt"] for row in PROMPTS}
    sure = budgeted(skipper=Prior(19.0, 1.0), budget_continue_prob=0.3)  # P(break) 0.09: a tie it expects
    unsure = budgeted(skipper=Prior(1.0, 1.0), budget_continue_prob=0.3)  # P(break) 0.4
    for planner, rounds in ((sure, 1), (unsure, 2)):
        planner._record_outcomes = lambda pool, reward_range: {}
        refilled, log = run(planner, [PROMPTS[0]] * 2 * G, tied=every_prompt, reward_range=(0.0, 1.0))
        assert len(log) == rounds


@pytest.mark.parametrize("rule", ["chance", "yield"])
@pytest.mark.parametrize(("world_size", "rows_per_rank"), [(2, 4), (3, 4), (4, 2), (8, 1)])
def test_budgets_on_any_number_of_ranks_ask_for_even_rounds_and_complete_every_informative_group(
    world_size, rows_per_rank, rule
):
    """A round's rows split evenly over the ranks (the rows that takes go to ties), an informative prompt is
    completed whatever the world size, and every rank ends with its share of the same batch."""
    needed = rows_per_rank * world_size // G
    batches = []
    for rank in range(world_size):
        planner = budgeted(world_size=world_size, rank=rank, budget_stop_rule=rule)
        planner.informative_history = (1.0, 1.0)  # under "yield": a tie of 2 stops (threshold 0.5 > 0.4)
        refilled, log = run(planner, [PROMPTS[0]] * rows_per_rank)
        assert all(sum(copies for _, copies in part) % world_size == 0 for part in log)
        batches.append(refilled)
    prompts = [row["prompt"] for batch in batches for row in batch.rows]
    empty = batches[0].empty.view(needed, G)
    for group in range(needed):
        if prompts[group * G] not in TIED:
            assert not empty[group].any()
    assert len(prompts) == needed * G and all(torch.equal(batch.empty, batches[0].empty) for batch in batches)


def test_budgets_over_two_ranks_ask_for_rows_that_split_evenly_and_match_one_process():
    """A round's rows are a multiple of the world size; rank 1's rows of the batch are the second half of one
    process's, rank 0's the first."""
    one, _ = run(budgeted(), [PROMPTS[0]] * 2 * G)
    halves = [run(budgeted(world_size=2, rank=rank), [PROMPTS[0]] * G)[0] for rank in (0, 1)]
    assert [row["prompt"] for half in halves for row in half.rows] == [row["prompt"] for row in one.rows]
    assert torch.equal(halves[0].empty, one.empty) and torch.equal(halves[1].empty, one.empty)


def test_the_yield_rule_completes_a_tie_in_one_round_while_its_yield_beats_the_rate_seen():
    """G = 8, 2 completions first, a uniform prior, every prompt tied: a tie of 2 breaks in its 6 more with chance
    1 - 3/9 = 0.667. With no informative group seen (rate 0) every tie gets its 6 in one second round. Once earlier
    batches made one informative group per 8 completions, the threshold is 6 * 1 / 8 = 0.75 and the ties stop (the
    history then counts 4 completions, half a group); at half a group per 8, 0.375, and they go on."""
    every_prompt = {row["prompt"] for row in PROMPTS}

    def planner(seen):
        refiller = BatchRefiller(ZeroStdArguments(per_prompt_budgets=True, budget_stop_rule="yield"),
                                 PromptStream(len(PROMPTS), seed=0), PROMPTS, 8, world_size=1, rank=0)  # fmt: skip
        refiller.informative_history = seen
        return refiller

    for seen, ties_go_on, history in (
        ((0.0, 0.0), True, (0.0, 0.9 * 2.0)),
        ((1.0, 1.0), False, (0.9, 0.9 * (1.0 + 4 / 8))),
        ((0.5, 1.0), True, (0.45, 0.9 * (1.0 + 2.0))),
    ):
        refiller = planner(seen)
        refilled, log = run(refiller, [PROMPTS[0]] * 16, tied=every_prompt)
        assert [copies for _, copies in log[0]] == [2, 2]
        assert log[1:] == ([[(p, 6) for p, _ in log[0]]] if ties_go_on else [])
        assert refilled.empty.any() != ties_go_on
        assert refiller.informative_history == pytest.approx(history)
        assert refilled.metrics["budget/seen_informative_rate"] == (seen[0] / seen[1] if seen[1] else 0.0)
    refiller = planner((0.0, 0.0))
    run(refiller, [PROMPTS[0]] * 16)  # the stream's first two prompts differ: two informative groups of 8
    assert refiller.informative_history == pytest.approx((0.9 * 2, 0.9 * 2.0))
