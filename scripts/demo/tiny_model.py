"""A tiny causal LM and character tokenizer built locally: no hub download, seconds on a CPU.

Used by the tests, the default training run and the benchmark. The vocabulary covers digits, lowercase letters,
spaces and a little punctuation; every character is one token.
"""

from __future__ import annotations

import string

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

PAD, EOS = "<pad>", "<eos>"
CHARACTERS = string.digits + string.ascii_lowercase + " +-*=?:.,"


def build_tokenizer() -> PreTrainedTokenizerFast:
    """A character-level fast tokenizer with ``<pad>`` (id 0) and ``<eos>`` (id 1)."""
    vocab = {token: i for i, token in enumerate([PAD, EOS, *CHARACTERS])}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token=PAD))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    backend.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, pad_token=PAD, eos_token=EOS)
    tokenizer.padding_side = "left"
    return tokenizer


def build_model(
    tokenizer: PreTrainedTokenizerFast,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    seed: int = 0,
) -> Qwen2ForCausalLM:
    """A randomly initialised Qwen2 causal LM over ``tokenizer``'s vocabulary (85,632 parameters by default)."""
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_heads,
        max_position_embeddings=256,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model


def save_tiny_model(path: str, seed: int = 0, **model_kwargs) -> str:
    """Build the tiny model and tokenizer and save both to ``path``; returns ``path``.

    TRL loads the reference model from the policy's ``config._name_or_path``, so trainers need a saved model.
    """
    tokenizer = build_tokenizer()
    build_model(tokenizer, seed=seed, **model_kwargs).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path
