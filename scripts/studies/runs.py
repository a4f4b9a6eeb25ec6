"""Runs of the main job (scripts/train_grpo.py defaults) for the studies in scripts/studies/: one arm, learning rate
and seed per run, several at a time, each cached as JSON (a run already written is not run again).

A record (``run_one``) holds ``arm``, ``learning_rate``, ``seed``, ``host``, the evaluations (``eval``: ``[step,
reward]``; ``eval_bands``) and lists with one entry per optimizer step: the logged metrics of ``RECORDED``,
``generation_s``, the cumulative ``generated_tokens``, ``completion_tokens`` and ``prompt_once_tokens``, and which
prompts each step generated and skipped (records from before them, and the peer's, lack these two, so a reader of
them reads them with ``.get``; the readers here read neither):

- ``prompt_draws``: ``{prompt: completions}``, the completions generated of each prompt at that step, refills
  included (``{}`` for a step that generated nothing: the later steps of a generation batch under num_iterations > 1);
- ``prompt_skips``: ``[prompt, ...]``, the prompts prompt skipping passed over on its stream at that step, in the
  stream's order (``[]`` where nothing is skipped: base TRL, every arm without skipping). Under skipping the
  dataloader's rows only pace the steps, so what a step offered is its draws' prompts and its skips;
- ``prompt_rewards``: ``{prompt: [reward, ...]}``, the weighted reward of each completion generated of each prompt at
  that step (NaN: unscorable), as the skip history reads them.

With ``--eval_train_groups`` (``revisited_prompts.py``) a record also holds ``train_groups``: ``[[step, {prompt:
[reward, ...]}], ...]``, at each evaluation one group of every train prompt sampled and not trained on: whether a
prompt skipped then would have split.

A run whose flags save checkpoints (``--save_steps``) and that is killed goes on from its last checkpoint the next
time, with what it had counted (``STUDY_STATE``), to the record an unbroken run writes but for its wall times:
``resumed_at`` lists the steps it resumed at (``[]``: never killed; absent in older records). The checkpoints go once
the record is written.

A prompt is named by its text (``prompt_text``: a conversation's last user message), so rows with the same text, as a
split drawn with replacement can hold, count together. The peer's trainer (``cgrpo`` arms, counted where it
generates, ``_base_generate``) records neither.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import platform
import shutil
import statistics
import time
from collections import Counter, defaultdict
from pathlib import Path

FINAL_WINDOW = 20  # steps averaged for a run's final reward
RECORDED = {  # record key -> logged metric (absent metrics give None); a tuple: the first one logged
    "reward": "reward",
    "grad_norm": "grad_norm",
    "step_time": "step_time",
    "num_tokens": "num_tokens",
    "masked_group_frac": "zero_std/masked_group_frac",
    "all_low_group_frac": "zero_std/all_low_group_frac",
    "untrained_step_frac": "zero_std/untrained_step_frac",
    "generated_groups": "dynamic_sampling/generated_groups",
    "generated_reward": "dynamic_sampling/generated_reward_mean",  # dynamic sampling: over every group generated
    "frac_reward_zero_std": "frac_reward_zero_std",
    "informative_group_frac": "dynamic_sampling/informative_group_frac",
    "skipped_frac": "prompt_skip/skipped_frac",
    "completions_per_prompt": "cgrpo/mean_k",  # the peer's (scripts/studies/peer_cgrpo.py) conformal budgets
    # tied_group_entropy_scale: the share of groups that train on their tie; mean |advantage| per loss token of their
    # rows (all, all-right, all-wrong) and of the informative rows (per row in the records of the retired calibrated
    # arms)
    "tied_trained_group_frac": "zero_std/tied_trained_group_frac",
    "tied_adv_abs": "zero_std/tied_adv_abs_mean",
    "tied_high_adv_abs": "zero_std/tied_high_adv_abs_mean",
    "tied_low_adv_abs": "zero_std/tied_low_adv_abs_mean",
    "informative_adv_abs": "zero_std/informative_adv_abs_mean",
    "entropy": "entropy",  # TRL's: the policy's mean token entropy over the loss tokens
    # --task spread / chat_arith: of the groups that train
    "all_wrong_group_frac": ("spread/all_wrong_group_frac", "level/all_wrong_group_frac"),
    "all_right_group_frac": ("spread/all_right_group_frac", "level/all_right_group_frac"),
}


def timing_generation(trainer_cls):
    """``trainer_cls`` whose training generation is timed and counted: ``generation_s[step]`` seconds of each
    optimizer step (TRL's ``_generate_single_turn``, the model's own ``generate``; refill rounds included, evaluation
    excluded) and ``generated_tokens[step]``, the prompt and completion tokens of every sequence generated; also
    ``completion_tokens[step]`` (completions alone) and ``prompt_once_tokens[step]`` (completions, and each prompt once
    per run of rows that share it in a call: what an engine that caches prefixes prefills). The peer
    ``CGRPOTrainer`` is counted where it generates (its ``_base_generate``: calibration included, its padding rows
    not), every other trainer at ``_generate_single_turn``."""
    from trl_zerostd.sampling.passes import ReplayedPasses
    from trl_zerostd.trainer.trl_layout import seeded_sampler_randomness

    counted_at = "_base_generate" if hasattr(trainer_cls, "_base_generate") else "_generate_single_turn"

    class GenerationTimed(trainer_cls):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.generation_s = defaultdict(float)
            self.generated_tokens = defaultdict(int)
            self.completion_tokens = defaultdict(int)
            self.prompt_once_tokens = defaultdict(int)
            self.decodes = 0  # training calls of _generate_single_turn
            if counted_at == "_generate_single_turn":
                self.prompt_tally = PromptTally()
                self.prompt_tally.watch_skips(self)
            self.resumed_at: list[int] = []  # the steps a run killed mid-way resumed at
            self.resumed_pass = 0  # the pass over the train set a resumed run goes on in
            self.add_callback(study_state_saver(self))

        def _get_train_sampler(self, *args, **kwargs):
            # TRL's own trainer: its sampler's passes replayed as the package's trainers replay theirs (an unbroken
            # run draws TRL's order), so that a resumed run of base TRL trains what an unbroken one would
            sampler = super()._get_train_sampler(*args, **kwargs)
            randomness = seeded_sampler_randomness(sampler)
            if hasattr(self, "zero_std") or randomness is None:
                return sampler
            passes = ReplayedPasses(sampler, *randomness)
            passes.resume_at(self.resumed_pass)
            return passes

        def train(self, resume_from_checkpoint=None, **kwargs):
            if resume_from_checkpoint is True:  # as TRL's own: the newest checkpoint in output_dir
                resume_from_checkpoint = last_checkpoint(Path(self.args.output_dir))
                if resume_from_checkpoint is None:
                    raise ValueError(f"resume_from_checkpoint=True: no finished checkpoint in {self.args.output_dir}")
            if resume_from_checkpoint:
                load_study_state(self, Path(resume_from_checkpoint))
            return super().train(resume_from_checkpoint=resume_from_checkpoint, **kwargs)

        def _generate_single_turn(self, *args, **kwargs):
            start = time.perf_counter()
            result = super()._generate_single_turn(*args, **kwargs)
            if self.model.training:
                self.generation_s[self.state.global_step] += time.perf_counter() - start
                self.decodes += 1
                if counted_at == "_generate_single_turn":
                    self._count(args[0], result)
            return result

        def _generate(self, prompts):
            # one prompt per row; a call that decodes nothing (the package's pass over rows a refill generated before)
            # is not a draw. Read before the call: a refill's last round rewrites the list in place; counted when the
            # call raises too: a refill round that more rounds follow ends TRL's method there (RoundGenerated)
            texts, decodes = [prompt_text(prompt) for prompt in prompts], self.decodes
            try:
                return super()._generate(prompts)
            finally:
                if self.model.training and self.decodes > decodes:
                    self.prompt_tally.draws[self.state.global_step].update(texts)

        def _score_generation(self, rows, prompts, generated):  # the package's trainers: every round's scoring
            rewards_per_func, truncated = super()._score_generation(rows, prompts, generated)
            self._tally_rewards(prompts, rewards_per_func)
            return rewards_per_func, truncated

        def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):  # TRL's own trainer
            rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
            self._tally_rewards(prompts, rewards_per_func)
            return rewards_per_func

        def _tally_rewards(self, prompts: list, rewards_per_func) -> None:
            """Each generated row's weighted reward (NaN where every function returned None), under its prompt."""
            if self.model.training and hasattr(self, "prompt_tally"):
                weighted = rewards_per_func * self.reward_weights.to(rewards_per_func.device)
                total = weighted.nansum(dim=1).masked_fill(rewards_per_func.isnan().all(dim=1), float("nan"))
                own = total.view(-1, len(prompts))[self.accelerator.process_index]  # gathered: this rank's rows
                for prompt, reward in zip(prompts, own.tolist(), strict=True):
                    self.prompt_tally.rewards[self.state.global_step][prompt_text(prompt)].append(reward)

        def _base_generate(self, *args, **kwargs):  # the peer's only
            result = super()._base_generate(*args, **kwargs)
            if self.model.training:
                self._count(args[0], result)
            return result

        def _count(self, prompt_ids, result) -> None:
            completion_ids = result[0] if isinstance(result, tuple) else result  # RLOO returns the ids alone
            completions = sum(len(ids) for ids in completion_ids)
            step = self.state.global_step
            self.generated_tokens[step] += sum(len(ids) for ids in prompt_ids) + completions
            self.completion_tokens[step] += completions
            prompts_once = sum(
                len(ids) for i, ids in enumerate(prompt_ids) if i == 0 or list(ids) != list(prompt_ids[i - 1])
            )
            self.prompt_once_tokens[step] += prompts_once + completions

    if counted_at == "_generate_single_turn":
        del GenerationTimed._base_generate
    else:
        del GenerationTimed._generate
    if hasattr(trainer_cls, "_score_generation"):  # the package scores once, where TRL's own call reads it back
        del GenerationTimed._calculate_rewards
    else:
        del GenerationTimed._score_generation
    GenerationTimed.__name__ = trainer_cls.__name__
    return GenerationTimed


def prompt_text(prompt) -> str:
    """A prompt's name in the records: the text of a conversation's last user message (its content as JSON where it is
    not text), or the prompt itself."""
    if isinstance(prompt, str):
        return prompt
    messages = [message for message in prompt if message.get("role") == "user"] or list(prompt)
    content = messages[-1]["content"]
    return content if isinstance(content, str) else json.dumps(content)


def by_text(texts: list[str], groups: list[list[float]]) -> dict[str, list[float]]:
    """Each train row's group of rewards under its prompt's text (the rows of one text together)."""
    named: defaultdict[str, list[float]] = defaultdict(list)
    for text, group in zip(texts, groups, strict=True):
        named[text] += group
    return dict(named)


def passed_over(consumed: list[int], drawn: list[int]) -> list[int]:
    """The places of ``consumed`` (row indices, in order) that are not among ``drawn``, counted as a multiset."""
    left, passed = Counter(drawn), []
    for index in consumed:
        if left[index]:
            left[index] -= 1
        else:
            passed.append(index)
    return passed


class PromptTally:
    """Per optimizer step (by ``global_step`` while generating): ``draws[step]``, completions generated per prompt
    text (``timing_generation`` counts them); ``skips[step]``, the prompt texts prompt skipping passed over;
    ``rewards[step]``, each prompt text's generated rewards."""

    def __init__(self):
        self.draws: defaultdict[int, Counter] = defaultdict(Counter)
        self.skips: defaultdict[int, list[str]] = defaultdict(list)
        self.rewards: defaultdict[int, defaultdict[str, list[float]]] = defaultdict(lambda: defaultdict(list))

    def watch_skips(self, trainer) -> None:
        """Note the prompts the package's prompt stream passes over (where ``trainer`` has one over a map-style
        dataset: dynamic sampling or prompt skipping): each draw's places consumed, read again from the stream's
        state before it, less those it drew. Draws the same as unwatched (the stream's own seeded passes)."""
        from trl_zerostd.sampling.streams import PromptStream

        refiller = getattr(getattr(trainer, "zero_std", None), "refiller", None)
        stream = getattr(refiller, "stream", None)
        if not isinstance(stream, PromptStream):
            return
        draw = stream.draw

        def noted(count, draw_prob=None):
            before = PromptStream(stream.num_rows, stream.seed, stream.epoch, stream.position)
            drawn, skipped = draw(count, draw_prob)
            if skipped:
                for index in passed_over(before.take(len(drawn) + skipped), drawn):
                    self.skips[trainer.state.global_step].append(prompt_text(refiller.dataset[index]["prompt"]))
            return drawn, skipped

        stream.draw = noted


STUDY_STATE = "study_state.json"  # in each checkpoint: what a run counts outside TRL's state, to resume it by
COUNTERS = ("generation_s", "generated_tokens", "completion_tokens", "prompt_once_tokens")


def train_probe(trainer):
    """The trainer's held-out evaluation that also samples the train prompts (``--eval_train_groups``), or None."""
    return next((c for c in trainer.callback_handler.callbacks if getattr(c, "train_rows", None) is not None), None)


def study_state(trainer) -> dict:
    """What ``timing_generation``'s trainer has counted so far, by optimizer step, as JSON (a checkpoint's
    ``STUDY_STATE``): its ``COUNTERS``, its ``prompt_tally``, its probes' ``train_groups``, ``resumed_at`` and how far
    into a generation batch it is (``generation_phase``)."""
    from trl_zerostd.trainer.trl_layout import generation_phase

    state = {name: dict(getattr(trainer, name)) for name in COUNTERS}
    state["resumed_at"] = trainer.resumed_at
    state["generation_phase"] = generation_phase(trainer)  # micro-batches into the generation batch in progress
    if hasattr(trainer, "prompt_tally"):
        tally = trainer.prompt_tally
        state["prompt_draws"] = {step: dict(counts) for step, counts in tally.draws.items()}
        state["prompt_skips"] = dict(tally.skips)
        state["prompt_rewards"] = {step: dict(rewards) for step, rewards in tally.rewards.items()}
    probe = train_probe(trainer)
    if probe is not None:
        state["train_groups"] = probe.train_groups
    return state


def load_study_state(trainer, checkpoint: Path) -> None:
    """Restore ``study_state`` from ``checkpoint`` (JSON's keys are strings: steps back to ints) and note the step the
    run resumes at, so that a record's wall times are read knowing the run restarted there. A checkpoint inside a
    generation batch is refused: TRL does not checkpoint the batch's completions (nor its count of micro-batches), so
    a run resumed there would train other completions than an unbroken one (a run's last step is exempt: nothing is
    left to train)."""
    from trl_zerostd.sampling.passes import TRAINER_STATE, pass_in_progress

    path = checkpoint / STUDY_STATE
    if not path.exists():
        raise FileNotFoundError(
            f"{checkpoint} has no {STUDY_STATE}, so the run's counts before it are lost: delete {checkpoint.parent} "
            "and run again"
        )
    state = json.loads(path.read_text())
    global_step = json.loads((checkpoint / TRAINER_STATE).read_text())["global_step"]
    phase = state.get("generation_phase", 0)  # absent: saved by a run that generated every step (the first ones)
    if phase and global_step < trainer.args.max_steps:
        raise ValueError(
            f"{checkpoint} falls inside a generation batch ({phase} micro-batches into it), "
            "whose completions TRL does not checkpoint: resumed there, it would train other completions than an "
            "unbroken run. Delete it (an earlier checkpoint resumes) and save at steps that end a generation batch "
            "(--save_steps)."
        )
    for name in COUNTERS:
        getattr(trainer, name).update({int(step): value for step, value in state[name].items()})
    if hasattr(trainer, "prompt_tally"):
        tally = trainer.prompt_tally
        tally.draws.update({int(step): Counter(counts) for step, counts in state["prompt_draws"].items()})
        tally.skips.update({int(step): texts for step, texts in state["prompt_skips"].items()})
        rewards = state["prompt_rewards"].items()
        tally.rewards.update({int(step): defaultdict(list, by_text) for step, by_text in rewards})
    probe = train_probe(trainer)
    if probe is not None:
        probe.train_groups.update({int(step): groups for step, groups in state["train_groups"].items()})
    trainer.resumed_at = [*state["resumed_at"], global_step]
    trainer.resumed_pass = pass_in_progress(str(checkpoint))  # read where the dataloader is built


def study_state_saver(trainer):
    """A callback that writes ``study_state(trainer)`` into each checkpoint the trainer saves (main process)."""
    from transformers import TrainerCallback

    class StudyStateSaver(TrainerCallback):
        def on_save(self, args, state, control, **kwargs):
            if state.is_world_process_zero:
                checkpoint = Path(args.output_dir) / f"checkpoint-{state.global_step}"
                (checkpoint / STUDY_STATE).write_text(json.dumps(study_state(trainer)))

    return StudyStateSaver()


def last_checkpoint(output_dir: Path) -> str | None:
    """The newest ``checkpoint-<step>`` folder in ``output_dir`` that a save finished (``STUDY_STATE`` is written
    last: a run killed while saving leaves one without it, and ``--save_total_limit 2`` keeps the one before), or
    None."""
    saved = [path for path in output_dir.glob("checkpoint-*") if (path / STUDY_STATE).exists()]
    return str(max(saved, key=lambda path: int(path.name.split("-")[1]))) if saved else None


def check_same_job(output_dir: Path, job: list) -> None:
    """Note ``job`` (arm, flags, learning rate, seed, max_steps) in ``output_dir``; refuse, naming what to delete,
    where the checkpoints there are of another job (a changed flag would resume a run it did not start)."""
    output_dir.mkdir(parents=True, exist_ok=True)
    noted = output_dir / "study_job.json"
    if last_checkpoint(output_dir) is not None and (not noted.exists() or json.loads(noted.read_text()) != job):
        raise ValueError(
            f"the checkpoints in {output_dir} are of another job than {job}: delete {output_dir} to run it from the "
            "start"
        )
    noted.write_text(json.dumps(job))


def train_job(job: tuple[str, list[str], float, int, int, str], wrap=timing_generation):
    """Train the run of ``job`` (see ``run_one``) with the trainer class ``wrap(trainer_cls)``; return the trainer.

    ``flags`` are the arm's extra CLI flags; the arm "trl" (and "trl-<variant>") trains TRL's own GRPOTrainer (package
    flags dropped)."""
    arm, flags, lr, seed, max_steps, path = job
    from studies.time_to_accuracy_arms import check_runnable

    check_runnable(arm)
    from trl import GRPOConfig, GRPOTrainer

    from demo.train_cli import run, without_package_flags
    from trl_zerostd import ZeroStdGRPOConfig, ZeroStdGRPOTrainer

    output_dir = Path(path).with_suffix("")
    argv = [
        "--learning_rate", str(lr), "--seed", str(seed), "--max_steps", str(max_steps), "--plot", "false",
        "--print_every", "100000", "--disable_tqdm", "true", "--output_dir", str(output_dir), *flags,
    ]  # fmt: skip
    check_same_job(output_dir, [arm, flags, lr, seed, max_steps])
    checkpoint = last_checkpoint(output_dir)  # a run killed after a checkpoint (flags with --save_steps) goes on
    if checkpoint is not None and not arm.startswith("cgrpo"):  # the peer's calibration state is not checkpointed
        argv += ["--resume_from_checkpoint", checkpoint]
    else:  # a fresh start keeps nothing of an earlier one (a save killed half-way, the peer's)
        for stale in output_dir.glob("checkpoint-*"):
            shutil.rmtree(stale)
    if arm == "trl" or arm.startswith("trl-"):
        return run(wrap(GRPOTrainer), GRPOConfig, without_package_flags(argv))
    if arm.startswith("cgrpo"):
        from studies.peer_cgrpo import cgrpo_classes

        return run(*cgrpo_classes(wrap), without_package_flags(argv))
    return run(wrap(ZeroStdGRPOTrainer), ZeroStdGRPOConfig, argv)


def run_one(job: tuple[str, list[str], float, int, int, str]) -> dict:
    """``(arm, flags, learning_rate, seed, max_steps, path)``: train, write the per-step record to ``path``, return it
    (a run already written is read back, not run again)."""
    arm, _, lr, seed, _, path = job
    if Path(path).exists():
        return json.loads(Path(path).read_text())
    trainer = train_job(job)
    steps = optimizer_steps(trainer.state.log_history)
    record = {"arm": arm, "learning_rate": lr, "seed": seed}
    record.update({key: [logged(entry, metric) for entry in steps] for key, metric in RECORDED.items()})
    # step s generated while global_step was s - 1
    record["generation_s"] = [trainer.generation_s[entry["step"] - 1] for entry in steps]
    for key in ("generated_tokens", "completion_tokens", "prompt_once_tokens"):  # cumulative
        per_step = [getattr(trainer, key)[entry["step"] - 1] for entry in steps]
        record[key] = [sum(per_step[: i + 1]) for i in range(len(per_step))]
    if hasattr(trainer, "prompt_tally"):
        tally = trainer.prompt_tally
        record["prompt_draws"] = [dict(tally.draws[entry["step"] - 1]) for entry in steps]
        record["prompt_skips"] = [list(tally.skips[entry["step"] - 1]) for entry in steps]
        record["prompt_rewards"] = [dict(tally.rewards[entry["step"] - 1]) for entry in steps]
    probe = train_probe(trainer)
    if probe is not None:  # --eval_train_groups
        texts = [prompt_text(row["prompt"]) for row in probe.train_rows]
        probed = sorted(probe.train_groups.items())
        record["train_groups"] = [[step, by_text(texts, groups)] for step, groups in probed]
    evaluations = [e for e in trainer.state.log_history if "eval_reward" in e]
    record["eval"] = [[e["step"], e["eval_reward"]] for e in evaluations]
    record["eval_bands"] = [{k.split("/")[1]: v for k, v in e.items() if k.endswith("/accuracy")} for e in evaluations]
    record["host"] = host()
    record["resumed_at"] = trainer.resumed_at
    Path(path).write_text(json.dumps(record))
    for checkpoint in Path(path).with_suffix("").glob("checkpoint-*"):  # the record holds what the run taught
        shutil.rmtree(checkpoint)
    return record


def cached_records(runs_dir: str, arms: list[str], seeds: list[int]) -> list[dict]:
    """The records ``run_one`` wrote of ``arms`` x ``seeds`` under ``runs_dir`` (those that exist), arm by arm."""
    paths = [Path(runs_dir) / f"{arm}-seed{seed}.json" for arm in arms for seed in seeds]
    return [json.loads(path.read_text()) for path in paths if path.exists()]


def host() -> dict:
    """Where a run ran, to read its wall times by: the CPU model and the load averages over 1, 5 and 15 minutes at its
    end (runs on another CPU, or beside other work, took up to twice as long a step for the same work)."""
    cpuinfo = Path("/proc/cpuinfo")
    lines = cpuinfo.read_text().splitlines() if cpuinfo.exists() else []
    model = next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), None)
    return {"cpu": model or platform.processor(), "load_average": os.getloadavg()}


def logged(entry: dict, metric: str | tuple[str, ...]):
    """The value of ``metric`` (or of the first of several that ``entry`` has) in a log entry; None if absent."""
    names = (metric,) if isinstance(metric, str) else metric
    return next((entry[name] for name in names if name in entry), None)


def optimizer_steps(log_history: list[dict]) -> list[dict]:
    """One log entry per optimizer step (logging_steps=1). Under ``num_iterations`` > 1 a generation batch trains
    several steps and only its first logs the generation's metrics (reward, num_tokens, ...): the later ones carry
    them over from it, so lists indexed by step stay aligned and ``num_tokens`` stays cumulative."""
    steps, generation = [], {}
    for entry in log_history:
        if "reward" in entry:
            generation = entry
        if "step_time" in entry:
            steps.append({**generation, **entry})
    return steps


def seed_arm_jobs(args, arm_flags: dict[str, list[str]], common: list[str] = ()) -> list[tuple]:
    """One ``run_one`` job per seed and arm of ``args`` (its ``arms``, ``seeds``, ``learning_rate``, ``max_steps`` and
    ``runs_dir``), seed by seed, with the arm's flags then ``common``."""
    return [
        (arm, [*arm_flags[arm], *common], args.learning_rate, seed, args.max_steps,
         f"{args.runs_dir}/{arm}-seed{seed}.json")
        for seed in args.seeds
        for arm in args.arms
    ]  # fmt: skip


def run_all(jobs: list[tuple], processes: int, worker=None) -> list[dict]:
    """Run ``jobs`` (see ``run_one``) ``processes`` at a time, each in a fresh process, with a progress bar, through
    ``worker`` (a module-level function of one job; default ``run_one``). A worker killed from outside (the kernel's
    out-of-memory killer) stops the study at once with an error, instead of leaving it waiting for that job forever;
    an error raised inside a run surfaces once the runs already started have finished (and cached their records)."""
    from concurrent.futures import ProcessPoolExecutor
    from concurrent.futures.process import BrokenProcessPool

    from tqdm.auto import tqdm

    for job in jobs:
        Path(job[-1]).parent.mkdir(parents=True, exist_ok=True)
    spawn = multiprocessing.get_context("spawn")
    # max_tasks_per_child=1: a fresh process per run (on Python 3.11 a value above 1 can hang: CPython gh-115634)
    with ProcessPoolExecutor(processes, mp_context=spawn, max_tasks_per_child=1) as pool:
        try:
            return list(tqdm(pool.map(worker or run_one, jobs), total=len(jobs), desc="runs"))
        except BrokenProcessPool as error:
            raise RuntimeError(
                f"a run's process died without an error of its own (killed, often for memory; {processes} at a time "
                "here): lower --jobs and run the same command again (runs that finished keep their records)"
            ) from error


def report(records: list[dict], args, summarise, plot) -> None:
    """A study's output: the Markdown table (``summarise(records, args)``) to ``args.table`` and stdout, the figure
    (``plot(records, args)``) to ``args.plot``."""
    table = summarise(records, args)
    Path(args.table).write_text(table + "\n")
    plot(records, args)
    print(table)


def policy_reward(record: dict) -> list[float]:
    """The reward of the policy's samples: under dynamic sampling TRL's ``reward`` describes only the batch that
    trains (tied groups dropped), so the mean over every group generated is the comparable one."""
    generated = record.get("generated_reward") or [None]
    return record["reward"] if generated[0] is None else generated


def final_reward(record: dict) -> float:
    return statistics.fmean(policy_reward(record)[-FINAL_WINDOW:])


def moving(values: list[float], window: int = FINAL_WINDOW) -> list[float]:
    """Trailing moving average (shorter at the start)."""
    return [statistics.fmean(values[max(0, i - window + 1) : i + 1]) for i in range(len(values))]
