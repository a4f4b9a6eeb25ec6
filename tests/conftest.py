"""The fixtures every test can ask for: the tiny model (a local Qwen2 of ~85k parameters, a character tokenizer) and
the trainers built on it. Each wraps a helper of ``tests/support/`` (a test or a launch worker that needs the helper
itself imports it from there)."""

from __future__ import annotations

import functools

import pytest
from transformers import AutoModelForCausalLM
from trl import GRPOTrainer, RLOOTrainer

from demo.tiny_model import build_tokenizer, save_tiny_model
from tests.support.models import TinyVLM, save_tiny_moe_model, save_tiny_tool_model, tiny_llava, tiny_qwen2vl
from tests.support.trainers import build_trainer
from trl_zerostd import ZeroStdGRPOTrainer, ZeroStdRLOOTrainer


@pytest.fixture(scope="session")
def tokenizer():
    return build_tokenizer()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    return save_tiny_model(str(tmp_path_factory.mktemp("tiny") / "model"))


@pytest.fixture(scope="session")
def base_model(tiny_model_dir):
    return AutoModelForCausalLM.from_pretrained(tiny_model_dir)


@pytest.fixture(autouse=True)
def trls_trainer_only_where_every_trl(request, monkeypatch):
    """A test that builds TRL's own trainer compares against it, so it runs on every release of the range: building
    one (``GRPOTrainer`` or ``RLOOTrainer``, or a subclass other than ours) fails a test not marked ``every_trl``. It
    sees this process only: a launch test whose worker builds TRL's trainer is marked by hand."""
    if request.node.get_closest_marker("every_trl") is not None:
        return
    for trl_class in (GRPOTrainer, RLOOTrainer):

        def init(self, *args, _trl_class=trl_class, _init=trl_class.__init__, **kwargs):
            if not isinstance(self, (ZeroStdGRPOTrainer, ZeroStdRLOOTrainer)):
                pytest.fail(f"{request.node.name} builds TRL's own {_trl_class.__name__}: mark it every_trl")
            _init(self, *args, **kwargs)

        monkeypatch.setattr(trl_class, "__init__", init)


@pytest.fixture
def make_trainer(tokenizer, base_model, tmp_path):
    """``make_trainer(kind, ours=True, reward_funcs=..., **config)`` -> a trainer on a fresh copy of the model
    (``tests.support.trainers.build_trainer``; ``streaming``: the train set as an ``IterableDataset``)."""
    return functools.partial(build_trainer, tokenizer, base_model, tmp_path)


@pytest.fixture(scope="session", params=["llava", "qwen2vl"])
def tiny_vlm(request, tmp_path_factory) -> TinyVLM:
    build = {"llava": tiny_llava, "qwen2vl": tiny_qwen2vl}[request.param]
    return build(str(tmp_path_factory.mktemp(request.param) / "model"))


@pytest.fixture(scope="session")
def tiny_moe_model(tokenizer, tmp_path_factory):
    """A tiny Qwen2-MoE whose load-balancing auxiliary loss TRL adds to the loss, loaded from where it was saved."""
    return AutoModelForCausalLM.from_pretrained(
        save_tiny_moe_model(tokenizer, str(tmp_path_factory.mktemp("moe") / "model"))
    )


@pytest.fixture(scope="session")
def tiny_tool_model_dir(tmp_path_factory):
    """A tiny model for environment_factory and tools (Qwen3's chat template and special tokens)."""
    return save_tiny_tool_model(str(tmp_path_factory.mktemp("tools") / "model"))
