"""The package's state in a trainer, in one typed home: ``ZeroStdState`` holds the settings, the task-reward range,
the stall monitor and, with dynamic sampling or prompt skipping, the ``BatchRefiller`` (prompt stream and skipper).
``build_state`` alone turns settings into objects: the refill is on exactly when ``state.refiller`` exists, skipping
exactly when ``state.skipper`` does. A checkpoint carries ``trl_zerostd.json`` (the settings, the running state) and,
with skipping, ``trl_zerostd_prompt_skip.pt`` (the skipper's tensors). On resume a setting that decides only how each
batch trains (``config.PER_BATCH_FIELDS``) may change, with a notice; any other must be the checkpoint's. A checkpoint
without the file (TRL's own) leaves the state as built.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass
from functools import partial

import torch
from datasets import IterableDataset

from .. import core
from ..core.monitor import StallMonitor, stall_advice
from ..core.settings import PER_BATCH_FIELDS, ZeroStdArguments, checkpoint_settings, tied_groups_train
from ..sampling.passes import ReplayedPasses, pass_in_progress
from ..sampling.refill import BatchRefiller
from ..sampling.skipping import PromptSkipper, history_key
from ..sampling.streams import STREAM_SEED_OFFSET, PromptStream, RowStream
from .config import check_compatible
from .trl_layout import ENVIRONMENT_PLACEHOLDER, seeded_sampler_randomness

STATE_FILE = "trl_zerostd.json"
SKIP_STATE_FILE = "trl_zerostd_prompt_skip.pt"


@dataclass
class ZeroStdState:
    """Everything the package keeps across a run (a trainer holds it as ``zero_std``). ``reward_range``: the lowest
    and highest valid task reward seen in training (``zero_std_kl="keep_failed"`` and the skip outcomes read it);
    ``rows_trained_this_step``: rows with a policy or KL term in the optimizer step so far, all micro-batches;
    ``decisive_funcs``: ``(K,)`` bool, the reward functions whose sum decides a tie (``zero_std_reward_funcs``; None:
    all); ``train_passes``: TRL's train sampler, each pass replayed as an unbroken run draws it (set where the trainer
    builds its dataloader; a resume sets its pass from the checkpoint's trainer state)."""

    settings: ZeroStdArguments
    stall_monitor: StallMonitor
    refiller: BatchRefiller | None = None
    decisive_funcs: torch.Tensor | None = None
    reward_range: tuple[float, float] | None = None
    rows_trained_this_step: int = 0
    train_passes: ReplayedPasses | None = None

    @property
    def skipper(self) -> PromptSkipper | None:
        return self.refiller.skipper if self.refiller is not None else None

    def observe_plan(self, plan: core.RowPlan, row_tokens: torch.Tensor) -> tuple[dict[str, float], str | None]:
        """A gathered batch's plan (``(N,)`` loss tokens per row): its train metrics and the stall monitor's notice."""
        tied_train = tied_groups_train(self.settings)
        metrics = core.plan_metrics(plan, row_tokens, self.settings.zero_std_kl, tied_train)
        untrained = ~plan.tied_training_groups  # a tied group that trains on its tie has not stalled
        low, high = (
            (groups & untrained).float().mean().item() for groups in (plan.low_tied_groups, plan.high_tied_groups)
        )
        return metrics, self.stall_monitor.observe_batch(low, high, metrics["masked/row_frac/truncated"])

    def observe_trained_rows(
        self, rows: int, step_ends: bool, total: Callable[[int], int]
    ) -> tuple[dict[str, float], str | None]:
        """Count the ``rows`` a micro-batch trained (policy or KL term); where the optimizer step ``step_ends``, the
        step's metric (whether it trained no row, over every rank: ``total(count)``) and the stall monitor's notice."""
        self.rows_trained_this_step += rows
        if not step_ends:
            return {}, None
        trained, self.rows_trained_this_step = total(self.rows_trained_this_step), 0
        return {"zero_std/untrained_step_frac": float(trained == 0)}, self.stall_monitor.observe_step(trained)

    def decide_plan(
        self,
        task_rewards: torch.Tensor,
        rewards_per_func: torch.Tensor,
        truncated: torch.Tensor,
        rejected: torch.Tensor,
        num_generations: int,
    ) -> core.RowPlan:
        """The gathered batch's ``RowPlan`` under the settings, after widening ``reward_range`` by its valid rows
        (``(N,)`` task rewards, ``(N, K)`` rewards per function, ``(N,)`` truncated and rejected)."""
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
            zero_std_kl=settings.zero_std_kl,
            reward_range=self.reward_range,
            tied_groups_train=tied_groups_train(settings),
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
        saved = asdict(ZeroStdArguments(**checkpoint_settings(state["settings"])))
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

    def save(self, folder: str, generation_phase: int = 0) -> None:
        """The state into ``folder``, with the micro-batches trained of the generation batch in progress."""
        with open(os.path.join(folder, STATE_FILE), "w") as f:
            json.dump({**self.state_dict(), "generation_phase": generation_phase}, f, indent=2)
        if self.skipper is not None:
            torch.save(self.skipper.state_dict(), os.path.join(folder, SKIP_STATE_FILE))

    def load(self, folder: str) -> list[str]:
        """Restore what ``save`` wrote into ``folder``; returns the notices to log once: the per-batch settings that
        changed, a checkpoint saved inside a generation batch, or, for a checkpoint without the state (TRL's own)
        with dynamic sampling or prompt skipping on, that their state starts fresh."""
        if self.train_passes is not None:  # a checkpoint of TRL's own trainer too
            self.train_passes.resume_at(pass_in_progress(folder))
        path = os.path.join(folder, STATE_FILE)
        if not os.path.exists(path):
            if self.refiller is None:
                return []
            on = {
                "dynamic_sampling": self.settings.dynamic_sampling,
                "skip_zero_std_prompts": self.settings.skip_zero_std_prompts,
            }
            features = " and ".join(name for name, is_on in on.items() if is_on)
            return [
                f"trl_zerostd: the checkpoint {folder} has no {STATE_FILE} (a checkpoint of TRL's own trainer): "
                f"{features} start fresh (a new prompt stream, no skip history), and so do the reward "
                "range and the stall monitor."
            ]
        with open(path) as f:
            state = json.load(f)
        notices = [notice] if (notice := self.load_state_dict(state)) else []
        skip_state = os.path.join(folder, SKIP_STATE_FILE)
        if self.skipper is not None and os.path.exists(skip_state):
            self.skipper.load_state_dict(torch.load(skip_state))
        if phase := state.get("generation_phase", 0):  # TRL keeps a generation batch's completions in memory only
            notices.append(
                f"trl_zerostd: the checkpoint {folder} was saved {phase} micro-batch(es) into a generation batch, "
                "whose completions TRL does not save: this run trains new ones there. Save where one ends to resume "
                "bit for bit."
            )
        return notices


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
    dynamic sampling or prompt skipping, the refill over ``train_dataset``, whose dataset-dependent settings are
    checked here (a ValueError names the setting at fault)."""
    check_compatible(settings, trl_args, trainer_kind, has_rollout_func)
    advice = partial(
        stall_advice, zero_std_kl=settings.zero_std_kl, dynamic_sampling=settings.dynamic_sampling,
        beta=getattr(trl_args, "beta", 0.0), kind=trainer_kind,
    )  # fmt: skip
    monitor = StallMonitor(advice=advice)
    refiller = None
    if settings.dynamic_sampling or settings.skip_zero_std_prompts:
        stream, skipper = prompt_source(
            settings, train_dataset, trl_args.seed, num_generations, shuffle_dataset, has_environments
        )
        dataset = None if isinstance(stream, RowStream) else train_dataset
        refiller = BatchRefiller(settings, stream, dataset, num_generations, world_size, rank, skipper)
    decisive = core.decisive_functions(reward_func_names or [], settings.zero_std_reward_funcs)
    return ZeroStdState(settings, monitor, refiller, decisive)


def replayed_passes(state: ZeroStdState | None, sampler):
    """TRL's train ``sampler`` with each pass the one an unbroken run draws (``ReplayedPasses``, held in ``state``:
    TRL's own draws its first pass again in a resumed run) where it is seeded; as it is otherwise."""
    randomness = seeded_sampler_randomness(sampler)
    if state is None or randomness is None:
        return sampler
    state.train_passes = ReplayedPasses(sampler, *randomness)
    return state.train_passes


def prompt_source(
    settings: ZeroStdArguments,
    dataset,
    seed: int,
    num_generations: int,
    shuffle_dataset: bool | None,
    has_environments: bool,
) -> tuple[PromptStream | RowStream, PromptSkipper | None]:
    """The seeded prompt stream over ``dataset`` and, with prompt skipping, the skipper that keeps the prompt
    histories."""
    key, prior_key = settings.skip_history_key, settings.skip_prior_key
    skipping, floor = settings.skip_zero_std_prompts, settings.skip_min_draw_prob
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
        return stream, PromptSkipper.streaming(floor, num_generations)
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
        floor,
        num_generations,
        keys=None if key is None else [repr(value) for value in dataset[key]],
        prior_groups=None if prior_key is None else [repr(value) for value in dataset[prior_key]],
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
