"""TRL's internals that the package reads or writes, in one place: a TRL upgrade touches this module, and
``tests/trl_contract`` pins each reliance (docs/flow.md, "Which TRL"). Everything else reaches TRL through these names
or through the methods the adapters override: what ``_generate`` returns, per row and back; TRL's metric store, logs
and pending user logs; its extra-field merge and the dataset images it reads; its environment rows and pool;
``VLLMGeneration``'s engine, mode and sleep flag; the tokens its truncation check reads; RLOO's per-call
``num_generations``; its pixel-value split; the checkpoint folder; its train sampler's generator. Where releases of the
supported range differ, the difference is decided here by what the trainer offers (an attribute), never by a version
number.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import NamedTuple

import torch
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR
from trl.trainer.utils import RepeatSampler
from trl.trainer.utils import split_pixel_values_by_grid as split_pixel_values_by_grid  # TRL's, for loss.py
from trl.trainer.utils import unsplit_pixel_values_by_grid as unsplit_pixel_values_by_grid

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


def split_grpo(generated: tuple, dataset_rows: list[dict]) -> list[tuple]:
    """``GRPOTrainer._generate``'s result for ``dataset_rows`` as one record per row (a refill regroups rows); a row's
    ``images`` are those the training forward reads: its dataset images and those its tools returned (TRL's method
    reads the dataset's where ``_generate`` returns none, as a rollout_func's does)."""
    out = GRPOGenerated(*generated)
    if out.images is None:
        out = out._replace(images=dataset_images(dataset_rows))
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
                         extra_fields, image_lists(images), tool_images)  # fmt: skip


def split_rloo(generated: tuple) -> list[tuple]:
    return list(zip(*RLOOGenerated(*generated), strict=True))


def join_rloo(records: list[tuple]) -> RLOOGenerated:
    return RLOOGenerated(*map(list, zip(*records)))


def per_row(values: list | None, rows: int) -> list:
    """A per-row list as it is; None (or TRL's empty ``tool_images``) as one None per row."""
    return values if values is not None and len(values) == rows else [None] * rows


def image_lists(images: list) -> list | None:
    """Per-row images as TRL's method holds them: a list per row (``[]`` for a row without) where any row has one, else
    None (TRL then reads none)."""
    return [row or [] for row in images] if any(images) else None


def all_or_none(values: list) -> list | None:
    return None if all(value is None for value in values) else values


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


def stop_token_ids(trainer) -> list[int]:
    """The token ids that end a completion, as TRL's truncation check reads them: every eos id the model declares
    (``eos_token_ids``, TRL 1.15 on), or the tokenizer's one eos id (TRL 1.14)."""
    declared = getattr(trainer, "eos_token_ids", None)
    return list(declared) if declared is not None else [trainer._tokenizer.eos_token_id]


def end_token_ids(trainer) -> list[int]:
    """A completion whose last token is none of these was cut by the length limit (TRL's ``eos_and_pad``)."""
    return [*stop_token_ids(trainer), trainer._tokenizer.pad_token_id]


@contextmanager
def copies_per_prompt(trainer, copies: int) -> Iterator[None]:
    """RLOO's ``_generate_single_turn`` asks the engine for ``num_generations`` completions of each prompt it keeps:
    within the block, ``copies``."""
    group_size, trainer.num_generations = trainer.num_generations, copies
    try:
        yield
    finally:
        trainer.num_generations = group_size


def checkpoint_dir(trainer, trial) -> str:
    """The folder transformers' ``Trainer._save_checkpoint`` just wrote for this step."""
    return os.path.join(trainer._get_output_dir(trial=trial), f"{PREFIX_CHECKPOINT_DIR}-{trainer.state.global_step}")


def seeded_sampler_randomness(sampler) -> tuple[torch.Generator, int] | None:
    """The generator and seed of TRL's ``RepeatSampler`` where it shuffles with a seed (every draw of its order comes
    from that generator); None for any other sampler, or one without a seed, whose order cannot be replayed."""
    if isinstance(sampler, RepeatSampler) and sampler.shuffle and sampler.seed is not None:
        return sampler.generator, sampler.seed
    return None


def generation_phase(trainer) -> int:
    """Micro-batches trained of the generation batch in progress: TRL's count ``_step`` modulo the micro-batches one
    generation trains (``steps_per_generation`` x ``num_iterations``); 0 where a generation batch has just ended."""
    return trainer._step % (trainer.args.steps_per_generation * trainer.num_iterations)


def vllm_generation(trainer):
    """TRL's ``VLLMGeneration`` of a trainer (its ``vllm_generation``), None under HF generate."""
    return getattr(trainer, "vllm_generation", None) if trainer.use_vllm else None


def sleeps_after_each_call(vllm_generation) -> bool:
    """A colocated engine under sleep mode: TRL puts it to sleep (weights discarded) after every generate call."""
    return vllm_generation.mode == "colocate" and vllm_generation.enable_sleep_mode


def engine(vllm_generation):
    """The engine TRL's ``VLLMGeneration`` calls (its ``llm``: vLLM's ``LLM`` when colocated; None in server mode)."""
    return getattr(vllm_generation, "llm", None)


def set_engine(vllm_generation, llm) -> None:
    vllm_generation.llm = llm


def set_weights_sleeping(vllm_generation, sleeping: bool) -> None:
    """TRL's ``VLLMGeneration`` sends every weight again before its next generate call while this is set."""
    vllm_generation._llm_weights_sleeping = sleeping


def dataset_images(rows: list[dict]) -> list | None:
    """The images TRL 1.16's ``_generate_and_score_completions`` reads from its rows (an ``images`` list or one
    ``image``; None when there are none), which it uses where ``_generate`` returns no images (a rollout_func)."""
    if "images" in rows[0]:
        images = [row.get("images") for row in rows]
    elif "image" in rows[0]:
        images = [[row.get("image")] if row.get("image") is not None else None for row in rows]
    else:
        return None
    return None if all(image_list == [] for image_list in images) else images


def take_pending_metrics(trainer) -> dict[str, list]:
    """The scalars reward functions logged (``log_metric``) while the rows just generated were scored, taken out of
    TRL's ``_pending_metrics`` (TRL's method averages what is pending when it flushes)."""
    pending = {name: list(values) for name, values in trainer._pending_metrics.items()}
    trainer._pending_metrics.clear()
    return pending


def restore_pending_metrics(trainer, pending: dict[str, list]) -> None:
    for name, values in pending.items():
        trainer._pending_metrics[name].extend(values)


class EnvironmentDraws:
    """TRL 1.16 hands out a batch's environment instances from the start of its pool at every call of
    ``_generate_and_score_completions`` (``pool_cursor = {}``; an instance per rollout, more made when the pool runs
    short). Over a refill's rounds, each a call of TRL's method, ``round()`` shows TRL only the instances no earlier
    round of the batch drew, so no rollout's instance is reset again before the batch ends; instances TRL makes join
    its pool, which so grows to the most rollouts one batch generates (a refill's rounds together). None of this runs
    without ``environment_factory``."""

    def __init__(self, trainer) -> None:
        self._trainer = trainer
        self._drawn: set[int] = set()

    @contextmanager
    def round(self) -> Iterator[None]:
        trainer = self._trainer
        if getattr(trainer, "environment_factories", None) is None:
            yield
            return
        pools = trainer._environment_pool
        shown = {name: [env for env in pool if id(env) not in self._drawn] for name, pool in pools.items()}
        trainer._environment_pool = shown
        try:
            yield
        finally:
            made = {name: [env for env in shown[name] if all(env is not known for known in pool)]
                    for name, pool in pools.items()}  # fmt: skip
            trainer._environment_pool = {name: pool + made[name] for name, pool in pools.items()}
            self._drawn.update(id(env) for env in trainer.environments or [])


def set_batch_environments(trainer, rows: list[dict]) -> None:
    """Each row's environment name as TRL 1.16 records it (``_batch_environments``, read where it renders a prompt's
    tools), for ``rows`` that TRL's method did not prepare itself."""
    if getattr(trainer, "environment_factories", None) is not None:
        multi = trainer._multi_environment
        trainer._batch_environments = [row.get("environment") if multi else None for row in rows]


def generation_batch_rows(args) -> int:
    """This rank's rows in one of TRL's generation batches: what TRL sizes vLLM's ``max_num_seqs`` (colocate) and HF
    generate's memory for (``per_device_train_batch_size * steps_per_generation``; TRL's config sets the latter)."""
    assert args.steps_per_generation is not None, "TRL's config sets steps_per_generation (default: accumulation)"
    return args.per_device_train_batch_size * args.steps_per_generation
