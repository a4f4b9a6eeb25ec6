"""Environments of the ``environment_factory`` tests, as users write them, and the stubbed model's tool calls for
them: ``SubmitEnvironment`` (one task a rollout) and ``EpisodeEnvironment`` (stateful: an episode drawn at every
reset, which the reward reads)."""

from __future__ import annotations

import re

TASKS = ["win", "lose", "coin", "coin2"]  # "win": always solved, "lose": never (tied groups); "coin*": half the rows


class SubmitEnvironment:
    """One episode per rollout: the prompt gets the task as an observation; the model calls ``submit``; the reward is
    whether the answer (always 5) was right. Which rows submit what is set by the stubbed generation, per task."""

    def reset(self, **row) -> str:
        self.task, self.solved = row["task"], False
        return f" [{row['task']}]"

    def submit(self, answer: int) -> str:
        """Submit the final answer.

        Args:
            answer: The answer to the task.
        """
        self.solved = answer == 5
        return "ok"

    def get_reward(self) -> float:
        return float(self.solved)


def submit_calls(prompts: list[str]) -> list[str]:
    """The stubbed model: a tool call whose answer is right on "win" rows, wrong on "lose" rows, right on every
    other "coin" row; after the tool's response, "done". A prompt without an observation has no task: an error."""
    return [submit_call(prompt, i) for i, prompt in enumerate(prompts)]


def submit_call(prompt: str, i: int) -> str:
    """``submit_calls`` for the ``i``-th row of a call."""
    if '"arguments": {"answer"' in prompt:  # the tool loop's continuation after the tool's response
        return "done"
    task = next(task for task in ("coin2", "coin", "win", "lose") if f"[{task}]" in prompt)
    answer = 5 if task == "win" or (task.startswith("coin") and i % 2) else 4
    return f'<tool_call>\n{{"name": "submit", "arguments": {{"answer": {answer}}}}}\n</tool_call>'


class EpisodeEnvironment:
    """A stateful environment as users write them: ``reset()`` draws a new episode (an id from a run-wide counter) and
    shows it in the observation; ``submit`` records the answer and the episode the model named; ``get_reward`` reads
    that state. ``resets`` counts every reset of every instance; ``reset_twice_in_a_batch`` the resets of an instance
    whose rollout of the same generation batch had not yet been logged."""

    resets = 0
    first_episode = 1  # a launch's rank numbers its episodes from its own base, so ids are unique across ranks
    rewarded: list[tuple[int, int]] = []  # (episode drawn at reset, episode the rollout's tool call named)
    reset_in_batch: set[int] = set()  # the instances reset in the generation batch running (the test clears it)
    reset_twice_in_a_batch = 0  # resets of an instance that still held a rollout of the same batch

    def reset(self, **row) -> str:
        if id(self) in EpisodeEnvironment.reset_in_batch:
            EpisodeEnvironment.reset_twice_in_a_batch += 1
        EpisodeEnvironment.reset_in_batch.add(id(self))
        self.task, self.episode, self.named = row["task"], EpisodeEnvironment.first_episode + self.resets, None
        EpisodeEnvironment.resets += 1
        return f" [{row['task']}] episode {self.episode}."

    def submit(self, answer: int, episode: int) -> str:
        """Submit the final answer.

        Args:
            answer: The answer to the task.
            episode: The episode the answer is for.
        """
        self.solved, self.named = answer == 5, episode
        return "ok"

    def get_reward(self) -> float:
        EpisodeEnvironment.rewarded.append((self.episode, self.named))
        return float(self.solved)


def episode_calls(prompts: list[str]) -> list[str]:
    """``submit_calls`` that also name the episode their prompt shows."""
    return [episode_call(prompt, i) for i, prompt in enumerate(prompts)]


def episode_call(prompt: str, i: int) -> str:
    """``episode_calls`` for the ``i``-th row of a call (the stand-in vLLM engine's ``complete``)."""
    call = submit_call(prompt, i)
    return call if call == "done" else call.replace("}}", f', "episode": {episode_of(prompt)}}}}}')


def episode_of(prompt) -> int:
    """The episode a prompt's observation shows: a prompt's text, or the last message of a logged conversation
    (TRL 1.15 on logs the messages, 1.14 the decoded text)."""
    text = prompt if isinstance(prompt, str) else prompt[-1]["content"]
    return int(text.rsplit("episode ", 1)[1].split(".")[0])


def named_episode(completion) -> int | None:
    """The episode a logged completion's tool call named: from the parsed messages TRL 1.15 on logs, or from the
    call's arguments in the decoded text TRL 1.14 logs."""
    if isinstance(completion, str):
        found = re.search(r'"episode":\s*(\d+)', completion)
        return int(found.group(1)) if found else None
    for message in completion:
        for call in message.get("tool_calls") or []:
            return int(call["function"]["arguments"]["episode"])
    return None
