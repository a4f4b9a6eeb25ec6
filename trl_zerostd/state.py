"""The package's state in a trainer, in one typed home: ``ZeroStdState`` holds the settings, the task-reward range,
the stall monitor and, when dynamic sampling, prompt skipping or per-prompt budgets are on, the ``BatchRefiller``
(prompt stream and skipper). ``build_state`` is the one place that turns settings into objects: the refill is on
exactly when ``state.refiller`` exists (dynamic sampling, prompt skipping, budgets), prompt skipping exactly when
``state.skipper`` exists, and no code reads those switches again; the refill reads its own mode (dynamic sampling,
its screen, budgets) from the settings it holds.

A checkpoint carries ``trl_zerostd.json``: the settings and the running state (reward range, stall monitor, the
stream's place, the refill's decayed group counts), and with prompt skipping ``trl_zerostd_prompt_skip.pt``: the
skipper's tensors (two bytes a dataset row and the predictor's, too large for JSON). On resume, a setting that
configures an object with state (``config.STATEFUL_FIELDS``) must be the checkpoint's, or the state would not fit the
object; one that decides only how each batch trains (``config.PER_BATCH_FIELDS``) may change, and the change is
reported. A checkpoint without the file (TRL's own) leaves the state as built: the stream and skipper start fresh.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from functools import partial

import torch
from datasets import IterableDataset

from . import core
from ._trl import ENVIRONMENT_PLACEHOLDER
from .config import PER_BATCH_FIELDS, ZeroStdArguments, check_compatible
from .monitor import StallMonitor, stall_advice
from .refill import BatchRefiller
from .sampling import STREAM_SEED_OFFSET, PromptStream, RowStream
from .skipping import PromptSkipper, history_key

STATE_FILE = "trl_zerostd.json"
SKIP_STATE_FILE = "trl_zerostd_prompt_skip.pt"


@dataclass
class ZeroStdState:
    """Everything the package keeps across a run (a trainer holds it as ``zero_std``). ``reward_range``: the lowest
    and highest valid task reward seen in training (``zero_std_kl="keep_failed"`` and the skip outcomes read it);
    ``rows_trained_this_step``: rows with a policy or KL term in the optimizer step so far, all micro-batches;
    ``decisive_funcs``: ``(K,)`` bool, the reward functions whose sum decides a tie (``zero_std_reward_funcs``; None:
    all)."""

    settings: ZeroStdArguments
    stall_monitor: StallMonitor
    refiller: BatchRefiller | None = None
    decisive_funcs: torch.Tensor | None = None
    reward_range: tuple[float, float] | None = None
    rows_trained_this_step: int = 0

    @property
    def skipper(self) -> PromptSkipper | None:
        return self.refiller.skipper if self.refiller is not None else None

    def decide_plan(
        self,
        task_rewards: torch.Tensor,
        rewards_per_func: torch.Tensor,
        truncated: torch.Tensor,
        rejected: torch.Tensor,
        num_generations: int,
        empty: torch.Tensor | None = None,
    ) -> core.RowPlan:
        """The gathered batch's ``RowPlan`` under the settings, after widening ``reward_range`` by its valid rows
        (``(N,)`` task rewards, ``(N, K)`` rewards per function, ``(N,)`` truncated, rejected and empty slots)."""
        settings = self.settings
        self.reward_range = core.widen_reward_range(self.reward_range, task_rewards, ~(truncated | rejected))
        return core.decide_row_plan(
            task_rewards,
            num_generations,
            truncated=truncated,
            unscorable=core.unscorable_rows(rewards_per_func),
            rejected=rejected,
            mask_zero_std_groups=settings.mask_zero_std_groups,
            zero_std_atol=settings.zero_std_atol,
            exclude_masked_from_baseline=settings.exclude_masked_from_baseline,
            zero_std_kl=settings.zero_std_kl,
            reward_range=self.reward_range,
            empty=empty,
        )

    def state_dict(self) -> dict:
        """JSON: the settings and the running state."""
        refill = self.refiller.state_dict() if self.refiller is not None else {"prompt_stream": None}
        return {
            "settings": asdict(self.settings),
            "reward_range": self.reward_range,
            "stall_monitor": self.stall_monitor.state_dict(),
            "informative_history": [0.0, 0.0],
            **refill,
        }

    def load_state_dict(self, state: dict) -> str | None:
        """Restore ``state`` (``state_dict``'s); returns a notice naming the per-batch settings that changed, if any.
        A changed setting of an object with state is refused, naming each: that object was built from this run's
        settings and the checkpoint's state would not fit it."""
        saved = asdict(ZeroStdArguments(**state["settings"]))
        changed = {k: (getattr(self.settings, k), v) for k, v in saved.items() if getattr(self.settings, k) != v}
        refused = [f"{k}: this run {now!r}, the checkpoint {then!r}"
                   for k, (now, then) in changed.items() if k not in PER_BATCH_FIELDS]  # fmt: skip
        if refused:
            raise ValueError(
                "Resuming from a checkpoint made with other trl_zerostd settings of objects that carry state across "
                "steps (the prompt stream, dynamic sampling's refill, prompt skipping's histories): "
                + "; ".join(refused)
                + ". Resume with the checkpoint's values of these, or start a new run. Only "
                f"the settings that decide how each batch trains may change on resume: {', '.join(PER_BATCH_FIELDS)}."
            )
        self.reward_range = tuple(state["reward_range"]) if state["reward_range"] is not None else None
        self.stall_monitor.load_state_dict(state["stall_monitor"])
        if self.refiller is not None and state.get("prompt_stream") is not None:
            self.refiller.load_state_dict(state)
        if not changed:
            return None
        changes = "; ".join(f"{k}: the checkpoint {then!r}, this run {now!r}" for k, (now, then) in changed.items())
        return f"trl_zerostd: resuming with settings that decide only how each batch trains changed: {changes}."

    def save(self, folder: str) -> None:
        with open(os.path.join(folder, STATE_FILE), "w") as f:
            json.dump(self.state_dict(), f, indent=2)
        if self.skipper is not None:
            torch.save(self.skipper.state_dict(), os.path.join(folder, SKIP_STATE_FILE))

    def load(self, folder: str) -> list[str]:
        """Restore what ``save`` wrote into ``folder``; returns the notices to log once: the per-batch settings that
        changed, or, for a checkpoint without the state (TRL's own) with dynamic sampling or prompt skipping on, that
        their state starts fresh."""
        path = os.path.join(folder, STATE_FILE)
        if not os.path.exists(path):
            if self.refiller is None:
                return []
            on = {
                "dynamic_sampling": self.settings.dynamic_sampling,
                "skip_zero_std_prompts": self.settings.skip_zero_std_prompts,
                "per_prompt_budgets": self.settings.per_prompt_budgets,
            }
            features = " and ".join(name for name, is_on in on.items() if is_on)
            return [
                f"trl_zerostd: the checkpoint {folder} has no {STATE_FILE} (a checkpoint of TRL's own trainer): "
                f"{features} start fresh (a new prompt stream, no skip history), and so do the reward "
                "range and the stall monitor."
            ]
        with open(path) as f:
            notice = self.load_state_dict(json.load(f))
        skip_state = os.path.join(folder, SKIP_STATE_FILE)
        if self.skipper is not None and os.path.exists(skip_state):
            self.skipper.load_state_dict(torch.load(skip_state))
        return [notice] if notice else []


def build_state(
    settings: ZeroStdArguments,
    trl_args,
    trainer_kind: str,
    train_dataset,
    num_generations: int,
    world_size: int,
    rank: int,
    shuffle_dataset: bool | None = True,
    has_environments: bool = False,
    has_rollout_func: bool = False,
    reward_func_names: list[str] | None = None,
) -> ZeroStdState:
    """The state of a run, checked against TRL's config (``trl_args``, ``trainer_kind``: "grpo" or "rloo"); with
    dynamic sampling, prompt skipping or budgets, the refill over ``train_dataset``, whose dataset-dependent settings
    are checked here (a ValueError names the setting at fault)."""
    check_compatible(settings, trl_args, trainer_kind)
    advice = partial(
        stall_advice, zero_std_kl=settings.zero_std_kl, dynamic_sampling=settings.dynamic_sampling,
        beta=getattr(trl_args, "beta", 0.0), kind=trainer_kind,
    )  # fmt: skip
    monitor = StallMonitor(advice=advice)
    refiller = None
    if settings.dynamic_sampling or settings.skip_zero_std_prompts or settings.per_prompt_budgets:
        check_rollout_alignment(trl_args, has_rollout_func)
        stream, skipper = prompt_source(
            settings, train_dataset, trl_args.seed, num_generations, shuffle_dataset, has_environments
        )
        dataset = None if isinstance(stream, RowStream) else train_dataset
        refiller = BatchRefiller(settings, stream, dataset, num_generations, world_size, rank, skipper)
    decisive = core.decisive_functions(reward_func_names or [], settings.zero_std_reward_funcs)
    return ZeroStdState(settings, monitor, refiller, decisive)


def check_rollout_alignment(trl_args, has_rollout_func: bool) -> None:
    """A refill round hands a rollout_func rows that are not aligned groups of num_generations copies (a screen's few
    rows a prompt, a round's share on a rank), and TRL's server path needs them aligned: a rollout that asks the server
    for num_generations completions of every num_generations-th prompt would train on another prompt's."""
    if has_rollout_func and getattr(trl_args, "use_vllm", False) and getattr(trl_args, "vllm_mode", "") == "server":
        raise ValueError(
            "dynamic_sampling, skip_zero_std_prompts and per_prompt_budgets with a rollout_func under use_vllm=True, "
            "vllm_mode='server': "
            "a refill round's rows are not aligned groups of num_generations copies, which TRL's server path "
            "assumes, so a completion could be trained against another prompt. Use vllm_mode='colocate', or turn "
            "dynamic_sampling, skip_zero_std_prompts and per_prompt_budgets off."
        )


def prompt_source(
    settings: ZeroStdArguments,
    dataset,
    seed: int,
    num_generations: int,
    shuffle_dataset: bool | None,
    has_environments: bool,
) -> tuple[PromptStream | RowStream, PromptSkipper | None]:
    """The seeded prompt stream over ``dataset`` and, with prompt skipping or budgets, the skipper that keeps the
    prompt histories (budgets read its success rates; only prompt skipping draws by them)."""
    key, prior_key = settings.skip_history_key, settings.skip_prior_key
    skipping = settings.skip_zero_std_prompts or settings.per_prompt_budgets  # the histories serve both
    predictor, group_size = settings.skip_predictor, num_generations
    if isinstance(dataset, IterableDataset):
        if prior_key is not None:
            raise ValueError(
                f"skip_prior_key={prior_key!r} needs a map-style train_dataset (its groups are read from the "
                "column up front); this train_dataset is streaming (IterableDataset). Leave skip_prior_key unset, "
                "or pass a datasets.Dataset."
            )
        stream: PromptStream | RowStream = row_stream(
            dataset, (key or "prompt") if skipping else None, seed, shuffle_dataset
        )
        if not skipping:
            return stream, None
        target, floor = settings.skip_target_zero_std_frac, settings.skip_min_draw_prob
        return stream, PromptSkipper.streaming(target, floor, predictor=predictor, group_size=group_size)
    stream = PromptStream(len(dataset), seed)
    if not skipping:
        return stream, None
    if (
        has_environments
        and dataset.column_names == ["prompt"]
        and all(prompt == ENVIRONMENT_PLACEHOLDER for prompt in dataset["prompt"])
    ):
        raise ValueError(
            "skip_zero_std_prompts needs a train_dataset that names its prompts: with none, the environment's "
            "reset() makes every prompt, and no prompt has a history to skip by. Pass a train_dataset (one row "
            "per task), or use dynamic_sampling alone."
        )
    for name, column in (("skip_history_key", key), ("skip_prior_key", prior_key)):
        if column is not None and column not in dataset.column_names:
            columns = dataset.column_names
            raise ValueError(f"{name}={column!r} is not a column of the train_dataset (columns: {columns}).")
    return stream, PromptSkipper.new(
        len(dataset),
        settings.skip_target_zero_std_frac,
        settings.skip_min_draw_prob,
        keys=None if key is None else [repr(value) for value in dataset[key]],
        prior_groups=None if prior_key is None else [repr(value) for value in dataset[prior_key]],
        predictor=predictor,
        group_size=group_size,
    )


def row_stream(dataset: IterableDataset, key_column: str | None, seed: int, shuffle_dataset: bool | None) -> RowStream:
    """A seeded stream over a streaming train_dataset: a buffered shuffle as TRL's, with another seed; each row keyed
    by ``history_key`` of its ``key_column`` (None: no skipping, key 0)."""
    if shuffle_dataset:
        dataset = dataset.shuffle(seed=seed + STREAM_SEED_OFFSET)

    def open_pass(epoch: int):
        dataset.set_epoch(epoch)
        return iter(dataset)

    def key(row: dict) -> int:
        if key_column is None:
            return 0
        if key_column not in row:
            raise ValueError(
                f"Prompt skipping keys its history by the {key_column!r} field of each streamed row, which this "
                f"row lacks (fields: {sorted(row)}): set skip_history_key to a field every row has."
            )
        return history_key(row[key_column])

    return RowStream(open_pass, key, seed)
