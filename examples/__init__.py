"""The demo tasks, the tiny and the real model, and the main job's CLI; run from the repository root as modules
(``python -m examples.train_grpo``), so that ``examples`` is importable."""
