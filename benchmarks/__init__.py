"""Studies and benchmarks; run from the repository root as modules (``python -m benchmarks.skip_compute``)."""
