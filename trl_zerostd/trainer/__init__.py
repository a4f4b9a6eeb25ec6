"""The adapter over TRL's ``GRPOTrainer`` and ``RLOOTrainer``: the overrides (``adapter``, with the refill's
passes through TRL in ``refill_passes``), TRL's internals that the package reads or writes (``trl_layout``), the
configs and the run's state. Importing it checks TRL's version: any release outside the supported range is refused.
"""

from .compat import check_trl_version

check_trl_version()
