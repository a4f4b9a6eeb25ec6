"""The demo tasks, the tiny and the real model, the held-out evaluation and the main job's CLI, shared by the scripts
of ``scripts/`` (``python scripts/train_grpo.py`` puts ``scripts/`` first on ``sys.path``, so ``demo`` imports)."""
