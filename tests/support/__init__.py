"""Helpers of the tests and the launch workers: tiny models, trainers and their stubs, launch commands, the
vLLM stand-in and hypothesis strategies. Plain modules, no fixtures (those are in ``tests/conftest.py``)."""
