"""TRL 1.16's internals that the package reads or writes, in one place: a TRL upgrade touches this module and the
tests that pin it (docs/flow.md, "relies on"). Everything else reaches TRL through these names or through the
methods the adapters override.

- what ``GRPOTrainer._generate`` and ``RLOOTrainer._generate`` return (``GRPOGenerated``, ``RLOOGenerated``), per row
  and back (``split_grpo``/``join_grpo``, ``split_rloo``/``join_rloo``);
- TRL's metric store and logs (``_metrics``, ``_logs``, ``_pending_extra_logs``);
- ``PreparedPrompts``, which carries TRL's prepared prompts out of its method, and TRL's extra-field merge;
- the prompt rows TRL puts in a dataset when an environment owns the data;
- the sleep flag of TRL's ``VLLMGeneration``.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

ENVIRONMENT_PLACEHOLDER = [{"role": "user", "content": ""}]  # TRL's prompt rows when an environment owns the data


class GRPOGenerated(NamedTuple):
    """``GRPOTrainer._generate`` (TRL 1.16): per-row lists for this rank's rows."""

    prompt_ids: list
    completion_ids: list
    tool_mask: list | None
    completions: list
    sampling_per_token_logps: list | None
    extra_fields: dict
    images: list | None
    tool_images: list


class RLOOGenerated(NamedTuple):
    """``RLOOTrainer._generate`` (TRL 1.16)."""

    prompt_ids: list
    completion_ids: list
    completions: list


def split_grpo(generated: tuple) -> list[tuple]:
    """``GRPOTrainer._generate``'s result as one record per row (a refill regroups rows); a row's ``images`` are its
    dataset images and those its tools returned, which the training forward reads."""
    out = GRPOGenerated(*generated)
    rows = len(out.completion_ids)
    extras = [{key: value[i] if isinstance(value, list) else value for key, value in out.extra_fields.items()}
              for i in range(rows)]  # fmt: skip
    return list(
        zip(out.prompt_ids, out.completion_ids, per_row(out.tool_mask, rows), out.completions,
            per_row(out.sampling_per_token_logps, rows), extras, per_row(out.images, rows),
            per_row(out.tool_images, rows), strict=True)
    )  # fmt: skip


def join_grpo(records: list[tuple]) -> GRPOGenerated:
    """The inverse of ``split_grpo``."""
    columns = [list(column) for column in zip(*records)]
    prompt_ids, completion_ids, tool_mask, completions, logprobs, extras, images, tool_images = columns
    keys = dict.fromkeys(key for extra in extras for key in extra)
    extra_fields = {key: [extra.get(key) for extra in extras] for key in keys}
    tool_images = tool_images if any(row is not None for row in tool_images) else []
    return GRPOGenerated(prompt_ids, completion_ids, all_or_none(tool_mask), completions, all_or_none(logprobs),
                         extra_fields, all_or_none(images), tool_images)  # fmt: skip


def split_rloo(generated: tuple) -> list[tuple]:
    return list(zip(*RLOOGenerated(*generated), strict=True))


def join_rloo(records: list[tuple]) -> RLOOGenerated:
    return RLOOGenerated(*map(list, zip(*records)))


def per_row(values: list | None, rows: int) -> list:
    """A per-row list as it is; None (or TRL's empty ``tool_images``) as one None per row."""
    return values if values is not None and len(values) == rows else [None] * rows


def all_or_none(values: list) -> list | None:
    return None if all(value is None for value in values) else values


class PreparedPrompts(Exception):  # noqa: N818 - not an error: carries TRL's prepared prompts out of its method
    """Raised by ``_generate`` while TRL's ``_generate_and_score_completions`` runs only to prepare prompts."""

    def __init__(self, prompts: list):
        super().__init__()
        self.prompts = prompts


def merge_extra_fields(inputs: list[dict], extra_fields: dict) -> None:
    """Merge a rollout_func's ``extra_fields`` into ``inputs`` in place, as GRPOTrainer does (TRL 1.16) just before
    ``_calculate_rewards``: a list gives row ``i`` its ``i``-th value, anything else goes to every row."""
    for i, example in enumerate(inputs):
        for key, values in extra_fields.items():
            if not isinstance(values, list):
                example[key] = values
            elif i < len(values):
                example[key] = values[i]


def log_metrics(trainer, metrics: dict[str, float]) -> None:
    """Into TRL's train metric store, so that every tracker TRL reports to gets them."""
    for name, value in metrics.items():
        trainer._metrics["train"][name].append(value)


def replace_logged_advantages(trainer, advantages: torch.Tensor) -> None:
    """The completions table shows the advantages that train: TRL logged its own for the last ``N`` rows."""
    logged = trainer._logs["advantages"]
    for _ in range(len(advantages)):
        logged.pop()
    logged.extend(advantages.tolist())


def take_logged_columns(trainer, rows: int) -> list[dict]:
    """Per row of the ``rows`` just scored, the columns reward functions logged for it (``log_extra``, waiting in
    TRL's ``_pending_extra_logs``), taken out of TRL's pending logs."""
    logged: list[dict] = [{} for _ in range(rows)]
    for column, values in trainer._pending_extra_logs.items():
        for row, value in zip(logged, values):
            row[column] = value
    trainer._pending_extra_logs.clear()
    return logged


def restore_logged_columns(trainer, logged: list[dict]) -> None:
    """Put the columns of the rows that train back into TRL's pending logs, which TRL flushes beside those rows."""
    for column in dict.fromkeys(column for row in logged for column in row):
        trainer._pending_extra_logs[column] = [row.get(column) for row in logged]


def set_weights_sleeping(vllm_generation, sleeping: bool) -> None:
    """TRL's ``VLLMGeneration`` sends every weight again before its next generate call while this is set."""
    vllm_generation._llm_weights_sleeping = sleeping
