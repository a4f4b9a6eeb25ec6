"""The studies and benchmarks, each run by path (``python scripts/studies/skip_compute.py``; it puts ``scripts/`` on
``sys.path`` so that ``demo`` and ``studies`` import), with their shared helpers (``runs``, ``time_to_accuracy_*``)."""
