"""Prompts that come back (issue 70): the real-model study of ``time_to_accuracy_real.py`` on a train split so small
that every prompt is drawn again and again, so that prompt skipping has each prompt's own history to go by.

    python scripts/studies/revisited_prompts.py --jobs 1          # 4 arms x 10 seeds, seed by seed; cached, resumable
    python scripts/studies/revisited_prompts.py --report_only true     # the arms with runs: tables and figure
    python scripts/studies/revisited_prompts.py --arms trl skip-rate-kf --seeds 0 --max_steps 10

The same task, model, settings, held-out evaluation and report as ``time_to_accuracy_real.py``, with ``--num_prompts
40``: 40 train prompts (``chat_arith_splits(40, 250, seed)``, fixed per seed; levels 1 to 6: 6, 6, 8, 8, 6, 6 rows,
today's 15/15/20/20/15/15% exactly). 40 steps of 4 prompts draw 160 prompts: base TRL's sampler draws every prompt once
a pass, so each exactly 4 times; under prompt skipping the stream of prompts offers each as many times (a skipped
prompt uses up its place in the pass). The levels 1 to 4 draw their train rows with replacement, so a seed's split can
hold one text twice (seeds 2, 3, 4 and 9 do: 39 distinct texts); prompt skipping keeps one history per row. The held-
out split has 250 prompts (38, 38, 50, 50, 38, 36 a level), none of them in the train split; past level 1 they are
other prompts than the sibling's of the same seed (one seeded generator draws both splits), so accuracies compare with
it by level, not prompt by prompt.

The arms: base TRL, ``keep_failed``, and prompt skipping over ``keep_failed`` without a prior column
(``skip-rate-kf``, the headline) and with the prior by level (``skip-rate-prior-kf``); ``skip-fade-prior-kf`` and
``skip-fade-kf`` are the same on the predictor whose evidence faded, which did not pay (their records are read;
``time_to_accuracy_arms.FADE_COMMIT`` trains them).
Every record (``runs.run_one``) also holds, per optimizer step, the completions generated of each prompt
(``prompt_draws``), their rewards (``prompt_rewards``) and the prompts skipping passed over (``prompt_skips``), and, at
each evaluation, a group of every train prompt sampled and not trained on (``train_groups``, ``--eval_train_groups``):
whether a skipped prompt would have split. Records go to ``--runs_dir``; run one run at a time (``--jobs 1``: a run
peaks near 9 GB).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

if __package__ in (None, ""):  # run by path (python scripts/studies/<name>.py): scripts/ holds demo/ and studies/
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from studies.time_to_accuracy_real import RealTimeToAccuracyArguments, run_real_study

NUM_PROMPTS = 40  # today's level shares exactly; 10 steps a pass of 4 prompts: 4 passes in 40 steps
ARMS_REVISITED = ["trl", "keep_failed", "skip-rate-kf", "skip-rate-prior-kf"]  # the headline: skip-rate-kf
ARMS_RETIRED = ["skip-fade-prior-kf", "skip-fade-kf"]  # the predictor whose evidence faded: their records are read


@dataclass
class RevisitedPromptsArguments(RealTimeToAccuracyArguments):
    """``RealTimeToAccuracyArguments`` with ``NUM_PROMPTS`` train prompts, its arms, 10 seeds and its own outputs."""

    arms: list[str] = field(
        default_factory=lambda: list(ARMS_REVISITED),
        metadata={"help": "Arms of time_to_accuracy.py's ARMS (its --help says what each suffix sets)."},
    )
    report_arms: list[str] = field(
        default_factory=lambda: [*ARMS_REVISITED, *ARMS_RETIRED],
        metadata={"help": "With --report_only: the arms reported, those with runs."},
    )
    seeds: list[int] = field(default_factory=lambda: list(range(10)))
    plot_arms: list[str] = field(
        default_factory=lambda: list(ARMS_REVISITED), metadata={"help": "Arms in the figure."}
    )
    task_flags: list[str] = field(
        default_factory=lambda: [
            *RealTimeToAccuracyArguments().task_flags,
            "--num_prompts",
            str(NUM_PROMPTS),
            "--eval_train_groups",
            "true",
            "--save_steps",
            "5",
        ]  # a checkpoint every 5 steps: every arm here generates at each step
    )
    title: str = field(default=f"SmolLM2-135M-Instruct, LoRA, chat arithmetic, {NUM_PROMPTS} train prompts")
    runs_dir: str = field(default="docs/results/revisited/runs")
    table: str = field(default="docs/results/revisited/table.md")
    plot: str = field(default="docs/results/revisited/curves.png")


if __name__ == "__main__":
    run_real_study(RevisitedPromptsArguments)
