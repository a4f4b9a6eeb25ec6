"""A stand-in for vLLM at vLLM's own boundary, so that TRL's ``VLLMGeneration`` runs unmodified above it on a CPU.

vLLM cannot be installed here. TRL 1.16 reaches vLLM through three names of ``trl.generation.vllm_generation``:
``LLM`` and ``SamplingParams`` (colocate) and ``VLLMClient`` (server: a client of ``trl vllm-serve``).
``install(monkeypatch, engine)`` replaces those three and ``is_vllm_available`` with fakes that share one
``Engine``, and nothing else: TRL's gathering, slicing by rank, weight sync, sleep mode and logprob extraction run as
they do on a GPU.

The engine writes completions that encode their prompt: ``Engine.complete(prompt_text, i) -> text`` picks the
completion of the ``i``-th sequence of that prompt in one generate call (its reward), and the engine appends
``"?" + prompt`` so that a reward function can tell each row's origin (``origin``). Weights are held as the copies
TRL sent (``load_weights`` in colocate, ``update_named_params`` in server mode); every generate call records whether
they equal the policy's at that moment, how many sequences it asked for and whether the engine was awake.
"""

from __future__ import annotations

import atexit
from collections import defaultdict
from dataclasses import dataclass, field
from types import SimpleNamespace

import torch

ORIGIN_MARK = "?"


@dataclass
class GenerateCall:
    """One generate request: its unique prompts, ``n`` copies each, and what the engine held then."""

    prompts: int
    n: int
    weights_current: bool
    weights_loaded: bool


@dataclass
class Engine:
    """What both fakes share. ``complete(prompt_text, i) -> completion text`` for the ``i``-th sequence of a prompt
    in one call; ``policy``: the model whose weights the engine should hold (set after the trainer is built);
    ``logprob``: the sampling log-prob the engine reports for every token."""

    tokenizer: object
    complete: object
    policy: torch.nn.Module | None = None
    logprob: float = -0.5
    weights: dict[str, torch.Tensor] = field(default_factory=dict)
    weights_loaded: bool = False  # False after a level-2 sleep until the weights are loaded again
    kv_awake: bool = True
    syncs: int = 0  # a sync ends with TRL's reset_prefix_cache call
    calls: list[GenerateCall] = field(default_factory=list)
    llm_kwargs: dict = field(default_factory=dict)
    sleeps: list[int] = field(default_factory=list)
    announce_shutdown: bool = False  # print when the external-launcher teardown ran (tests/launch/test_exit.py)
    mark_origin: bool = True  # False: completions exactly as ``complete`` writes them (tool calls the loop parses)

    def load(self, name: str, tensor: torch.Tensor) -> None:
        self.weights[name] = tensor.detach().clone()
        self.weights_loaded = True

    def holds_policy(self) -> bool:
        if self.policy is None:
            return True
        params = dict(self.policy.named_parameters())
        return bool(self.weights) and all(torch.equal(self.weights[n], params[n].detach()) for n in self.weights)

    def sequences(self, prompt_ids: list[list[int]], n: int, max_tokens: int) -> list[list[int]]:
        """``n`` completions of each prompt, prompt-major, each ending in EOS unless cut at ``max_tokens``."""
        self.calls.append(GenerateCall(len(prompt_ids), n, self.holds_policy(), self.weights_loaded))
        out, seen = [], defaultdict(int)
        for ids in prompt_ids:
            prompt = self.tokenizer.decode(ids, skip_special_tokens=True)
            for _ in range(n):
                text = self.complete(prompt, seen[prompt])
                text = marked(text, prompt) if self.mark_origin else text
                seen[prompt] += 1
                tokens = self.tokenizer(text, add_special_tokens=False).input_ids + [self.tokenizer.eos_token_id]
                out.append(tokens[:max_tokens])
        return out


def marked(text: str, prompt: str) -> str:
    """A completion ``text`` that says it was generated for ``prompt``."""
    return f"{text}{ORIGIN_MARK}{prompt}"


def origin(completion: str) -> str:
    """The prompt a fake completion was generated for."""
    return completion.rpartition(ORIGIN_MARK)[2]


def answer(completion: str) -> str:
    """The completion without its origin mark: what a reward reads."""
    return completion.rpartition(ORIGIN_MARK)[0]


class FakeSamplingParams(SimpleNamespace):
    """``vllm.SamplingParams``: the keyword arguments TRL passes."""


@dataclass
class FakeLogprob:
    logprob: float
    rank: int = 1


class FakeLLM:
    """``vllm.LLM`` as TRL's colocate mode uses it: generate, sleep / wake_up, reset_prefix_cache and
    ``llm_engine.model_executor.driver_worker.model_runner.model.load_weights``."""

    engine: Engine  # set by install()

    def __init__(self, **kwargs):
        self.engine.llm_kwargs = kwargs
        if kwargs.get("distributed_executor_backend") == "external_launcher" and torch.distributed.is_initialized():
            # vLLM's external launcher builds its own groups over the trainer's and tears them down at exit
            self.group = torch.distributed.new_group(list(range(torch.distributed.get_world_size())))
            atexit.register(self._shutdown)
        model = SimpleNamespace(load_weights=self._load_weights)
        self.llm_engine = SimpleNamespace(
            model_executor=SimpleNamespace(driver_worker=SimpleNamespace(model_runner=SimpleNamespace(model=model))),
            model_config=SimpleNamespace(max_model_len=kwargs.get("max_model_len") or 128),
        )

    def _shutdown(self):
        torch.distributed.barrier(group=self.group)  # fails if the trainer's group is gone
        torch.distributed.destroy_process_group(self.group)
        if self.engine.announce_shutdown:
            print("engine shut down", flush=True)

    def _load_weights(self, weights):
        for name, tensor in weights:
            self.engine.load(name, tensor)

    def generate(self, prompts, sampling_params, use_tqdm=False):
        engine = self.engine
        if not engine.kv_awake:
            raise RuntimeError("generate on a sleeping engine (its KV cache was released)")
        ids = [prompt["prompt_token_ids"] for prompt in prompts]
        sequences = engine.sequences(ids, sampling_params.n, sampling_params.max_tokens)
        n = sampling_params.n
        return [
            SimpleNamespace(
                prompt_token_ids=prompt,
                outputs=[
                    SimpleNamespace(token_ids=seq, logprobs=[{t: FakeLogprob(engine.logprob)} for t in seq])
                    for seq in sequences[i * n : (i + 1) * n]
                ],
            )
            for i, prompt in enumerate(ids)
        ]

    def sleep(self, level=1):
        self.engine.sleeps.append(level)
        self.engine.kv_awake = False
        if level == 2:
            self.engine.weights_loaded = False

    def wake_up(self, tags=None):
        if tags is None or "kv_cache" in tags:
            self.engine.kv_awake = True

    def reset_prefix_cache(self):
        self.engine.syncs += 1


class FakeVLLMClient:
    """TRL's ``VLLMClient`` (a ``trl vllm-serve`` server) as ``VLLMGeneration`` uses it."""

    engine: Engine  # set by install()

    def __init__(self, base_url=None, group_port=51216, connection_timeout=0.0, **kwargs):
        self.base_url = base_url

    def init_communicator(self, device=0):
        pass

    def close_communicator(self):
        pass

    def get_server_info(self):
        return {"model_config": {"logprobs_mode": "processed_logprobs"}}

    def update_named_params(self, metadata, named_params):
        for name, tensor in named_params:
            self.engine.load(name, tensor)

    def update_named_param(self, name, weights):
        self.engine.load(name, weights)

    def reset_prefix_cache(self):
        self.engine.syncs += 1

    def generate(self, prompts, features=None, n=1, max_tokens=16, logprobs=0, **kwargs):
        sequences = self.engine.sequences(prompts, n, max_tokens)
        return {
            "prompt_ids": list(prompts),
            "completion_ids": sequences,
            "logprobs": [[[self.engine.logprob] for _ in seq] for seq in sequences],
            "logprob_token_ids": [[[t] for t in seq] for seq in sequences],
        }


def install(monkeypatch, engine: Engine) -> Engine:
    """Put the fakes where TRL 1.16 imports vLLM's objects; returns ``engine``."""
    from trl.generation import vllm_generation

    fakes = {"LLM": type("LLM", (FakeLLM,), {"engine": engine}), "SamplingParams": FakeSamplingParams}
    fakes["VLLMClient"] = type("VLLMClient", (FakeVLLMClient,), {"engine": engine})
    for name, fake in fakes.items():
        monkeypatch.setattr(vllm_generation, name, fake, raising=False)
    monkeypatch.setattr(vllm_generation, "is_vllm_available", lambda *args, **kwargs: True)
    return engine


def completions_by_index(texts: dict[str, list[str]]):
    """``(prompt, i) -> text``: a prompt's texts in turn over its sequences in one call (a group split evenly over
    calls or ranks gets the same completions)."""
    return lambda prompt, i: texts[prompt][i % len(texts[prompt])]


def per_call(complete):
    """``complete`` as TRL's ``_generate_single_turn`` stub source (``trainers.stub_generation``): ``prompts ->
    marked completions``, the ``i``-th row of a prompt in the call getting ``complete(prompt, i)``."""

    def source(prompts):
        seen, texts = defaultdict(int), []
        for prompt in prompts:
            texts.append(marked(complete(prompt, seen[prompt]), prompt))
            seen[prompt] += 1
        return texts

    return source
