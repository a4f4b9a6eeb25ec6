"""The PyPI peer ``trl-cgrpo`` (0.2.0: ``CGRPOTrainer``, conformal per-prompt budgets) as an arm of the
time-to-accuracy studies, on the same task, data, seeds and starting weights as base TRL.

It is not a dependency of this package: install it beside TRL without its pin (it pins ``trl<1.15`` and runs on
1.16) before running its arms::

    pip install --no-deps trl-cgrpo==0.2.0

What the arm adds to a run of the main job: the calibration set the peer needs, ``CALIBRATION_PROMPTS`` rows taken
off the end of the train split (never trained on; the held-out split is untouched), and its answer extractor, the
task's own parse (the spread task's first number, chat arithmetic's last). Its config is ``CGRPOConfig``
(``--budget_grid`` sets the grid; ``num_generations`` is the grid's largest budget).
"""

from __future__ import annotations

from demo.addition_task import FIRST_NUMBER
from demo.chat_arith_task import final_answer

CALIBRATION_PROMPTS = 32  # the size the first trial used


def first_number(text) -> int | None:
    text = text if isinstance(text, str) else text[-1]["content"]
    found = FIRST_NUMBER.search(text)
    return int(found.group()) if found else None


def last_number(text) -> int | None:
    return final_answer(text if isinstance(text, str) else text[-1]["content"])


def cgrpo_classes(wrap):
    """``(trainer_cls, config_cls)``: ``CGRPOTrainer`` given its calibration set and extractor from the train split
    it is handed, wrapped by ``wrap`` (the study's timing and token count), and ``CGRPOConfig``."""
    try:
        from trl_cgrpo import CGRPOConfig, CGRPOTrainer
    except ImportError as error:
        raise ImportError("The cgrpo arms need the peer: pip install --no-deps trl-cgrpo==0.2.0") from error

    class TaskCGRPOTrainer(CGRPOTrainer):
        def __init__(self, *args, train_dataset, **kwargs):
            rows = len(train_dataset)
            calibration = train_dataset.select(range(rows - CALIBRATION_PROMPTS, rows))
            extractor = last_number if "level" in train_dataset.column_names else first_number
            super().__init__(
                *args, train_dataset=train_dataset.select(range(rows - CALIBRATION_PROMPTS)),
                calibration_dataset=calibration, answer_extractor=extractor, **kwargs,
            )  # fmt: skip

    return wrap(TaskCGRPOTrainer), CGRPOConfig
