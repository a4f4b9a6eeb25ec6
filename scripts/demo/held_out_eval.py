"""Held-out accuracy by sampling alone: the evaluation of an RL run that a CPU can afford on a real model.

TRL's evaluation runs a training batch's whole path on every held-out row: generation, the reference forward and
the loss forward. ``SampledEvaluation`` only samples ``num_generations_eval`` completions of each held-out
prompt with the model's own ``generate``, at the training temperature, scores them with the trainer's reward
functions, and logs through the trainer what TRL's evaluation logs for them: ``eval_reward`` (the weighted reward
summed over the functions, mean over samples) and every metric the reward functions log (``eval_<name>``). It runs
on TRL's own schedule (``eval_steps``, ``eval_on_start``), with TRL's own evaluation switched off.

Sampling runs under a forked RNG seeded with ``seed + global_step``: an evaluation neither consumes the training
RNG nor depends on it, so every arm of a study is evaluated on samples drawn alike. Made for one-process runs (the
examples' CPU runs): under data parallelism every process would evaluate every row. Sampling settings are TRL's
``temperature``, ``top_p`` and ``top_k``.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict

import torch
from tqdm.auto import tqdm
from transformers.trainer_callback import TrainerCallback
from trl.data_utils import is_conversational

from trl_zerostd.trainer.trl_layout import stop_token_ids

TRAIN_PROBE_SEED = 1_000_003  # added to seed + step: the train probe's samples are not the held-out ones' twins


class SampledEvaluation(TrainerCallback):
    """Evaluate ``trainer`` on ``eval_dataset`` (rows with a ``prompt`` and the reward functions' columns) at the start
    (``on_start``), every ``every`` optimizer steps and at the steps ``also_at``; batches of
    ``per_device_eval_batch_size`` rows. With ``train_dataset``, each evaluation also samples one group of every train
    prompt (``_probe_train_groups``): whether it would still teach, where a run revisits its prompts."""

    def __init__(
        self,
        trainer,
        eval_dataset,
        every: int,
        on_start: bool,
        also_at: list[int] | None = None,
        train_dataset=None,
    ):
        self.trainer, self.rows = trainer, list(eval_dataset)
        self.every, self.on_start, self.also_at = every, on_start, set(also_at or ())
        args = trainer.args
        self.samples = args.num_generations_eval or trainer.num_generations
        self.batch_size = max(args.per_device_eval_batch_size // self.samples, 1) * self.samples
        self.train_rows = list(train_dataset) if train_dataset is not None else None
        self.train_groups: dict[int, list[list[float]]] = {}  # step -> each train row's group of rewards

    def on_train_begin(self, args, state, control, **kwargs):
        if self.on_start and state.global_step == 0:
            self.evaluate(state.global_step)

    def on_step_end(self, args, state, control, **kwargs):
        if (self.every and state.global_step % self.every == 0) or state.global_step in self.also_at:
            should_log = control.should_log  # our log resets it (DefaultFlowCallback): the step's own log still runs
            self.evaluate(state.global_step)
            control.should_log = should_log

    @torch.no_grad()
    def evaluate(self, step: int) -> dict:
        trainer = self.trainer
        model = trainer.accelerator.unwrap_model(trainer.model)
        was_training = model.training
        model.eval()
        logged: defaultdict[str, list] = defaultdict(list)
        try:
            rewards = self._rewards(model, self.rows, self.samples, trainer.args.seed + step, logged)
            logs = {"eval_reward": statistics.fmean(rewards)}
            logs.update({f"eval_{name}": statistics.fmean(values) for name, values in logged.items()})
            if self.train_rows is not None:
                logs["eval_train_informative_frac"] = self._probe_train_groups(model, step)
            trainer.log(dict(logs))  # in eval mode: TRL's log then leaves the training metrics of the step alone
        finally:
            model.train(was_training)
        if trainer.accelerator.is_main_process:
            tqdm.write(f"step {step}: held-out reward {logs['eval_reward']:.3f} ({len(rewards)} samples)")
        return logs

    def _rewards(self, model, rows: list[dict], samples: int, seed: int, logged: dict) -> list[float]:
        """The weighted reward of each of ``samples`` completions of every row (a row's consecutive), sampled under a
        forked RNG seeded with ``seed``."""
        repeated = [row for row in rows for _ in range(samples)]
        batch_size = max(self.batch_size // samples, 1) * samples
        rewards: list[float] = []
        device = next(model.parameters()).device
        devices = [device] if device.type == "cuda" else []  # manual_seed reseeds CUDA's generator too
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(seed)
            for start in range(0, len(repeated), batch_size):
                batch = repeated[start : start + batch_size]
                rewards += self._score(batch, self._sample(model, batch), logged)
        return rewards

    def _probe_train_groups(self, model, step: int) -> float:
        """One group of ``num_generations`` completions of every train prompt, not trained on (a seed of its own):
        each train row's rewards into ``train_groups[step]`` (in the split's order); returns the share of train rows
        whose group splits, what is left to learn from."""
        assert self.train_rows is not None, "probed only with a train split"
        group_size = self.trainer.num_generations
        rewards = self._rewards(model, self.train_rows, group_size, TRAIN_PROBE_SEED + self.trainer.args.seed + step,
                                defaultdict(list))  # fmt: skip
        groups = [rewards[i * group_size : (i + 1) * group_size] for i in range(len(self.train_rows))]
        self.train_groups[step] = groups
        return sum(splits(group) for group in groups) / len(groups)

    def _sample(self, model, batch: list[dict]) -> list[list[int]]:
        """Each row's completion ids, up to and with its first stop token (all of them where it ran out)."""
        trainer, tokenizer = self.trainer, self.trainer.processing_class
        prompts = [row["prompt"] for row in batch]
        if is_conversational(batch[0]):
            template = trainer.chat_template_kwargs
            prompts = [tokenizer.apply_chat_template(p, tokenize=False, add_generation_prompt=True, **template)
                       for p in prompts]  # fmt: skip
        encoded = tokenizer(prompts, return_tensors="pt", padding=True, padding_side="left", add_special_tokens=False)
        encoded = encoded.to(trainer.accelerator.device)
        args = trainer.args
        output = model.generate(
            **encoded,
            max_new_tokens=args.max_completion_length,
            do_sample=True,
            temperature=args.temperature,
            top_p=args.top_p,
            top_k=args.top_k or 0,
            pad_token_id=tokenizer.pad_token_id,
        )
        return completion_ids(output[:, encoded["input_ids"].shape[1] :].tolist(), stop_token_ids(trainer))

    def _score(self, batch: list[dict], completion_ids: list[list[int]], logged: dict) -> list[float]:
        """Each row's weighted reward, summed over the trainer's reward functions; their metrics into ``logged``."""
        trainer = self.trainer
        texts = trainer.processing_class.batch_decode(completion_ids, skip_special_tokens=True)
        conversational = is_conversational(batch[0])
        completions = [[{"role": "assistant", "content": text}] for text in texts] if conversational else texts
        columns = {key: [row[key] for row in batch] for key in batch[0] if key != "prompt"}
        total = torch.zeros(len(batch))
        for weight, reward_func in zip(trainer.reward_weights.tolist(), trainer.reward_funcs, strict=True):
            if isinstance(reward_func, torch.nn.Module):
                raise ValueError("SampledEvaluation scores with reward functions; a reward model is not supported.")
            values = reward_func(
                prompts=[row["prompt"] for row in batch],
                completions=completions,
                completion_ids=completion_ids,
                log_metric=lambda name, value: logged[name].append(value),
                **columns,
            )
            total += weight * torch.tensor([float("nan") if v is None else v for v in values])
        return total.tolist()


def splits(rewards: list[float]) -> bool:
    """Whether a group would teach: two finite rewards that differ."""
    finite = [value for value in rewards if math.isfinite(value)]
    return len(finite) >= 2 and max(finite) > min(finite)


def completion_ids(generated: list[list[int]], stop_token_ids) -> list[list[int]]:
    """Each generated row up to and with its first stop token (all of it where none came: it ran out of tokens)."""
    stops, completions = set(stop_token_ids), []
    for row in generated:
        end = next((i for i, token in enumerate(row) if token in stops), None)
        completions.append(row if end is None else row[: end + 1])
    return completions
