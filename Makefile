# Two entry points that do all the set-up on a fresh machine (see README).
# torch is installed first and pinned: the CPU wheel; an unpinned torch would pull the CUDA build.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
TORCH  ?= torch==2.13.0

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(TORCH)
	$(PY) -m pip install -q -e ".[test,examples]"
	touch $@

.PHONY: install train test
install: $(VENV)/.installed

train: install  ## fine-tune the embedded default (tiny local model, synthetic task)
	$(PY) examples/train_grpo.py $(ARGS)

test: install
	$(PY) -m pytest -q $(ARGS)
