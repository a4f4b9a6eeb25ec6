"""The TRL range this package follows. We override private TRL methods, so any other release is refused."""

import trl
from packaging.version import Version

SUPPORTED_TRL = (Version("1.14.1"), Version("1.17.0"))  # [low, high)
SUPPORTED_TRL_TEXT = f"trl>={SUPPORTED_TRL[0]},<{SUPPORTED_TRL[1]}"


def check_trl_version(version: str = trl.__version__) -> None:
    """Raise ImportError naming the supported range when ``version`` is outside it."""
    low, high = SUPPORTED_TRL
    if not (low <= Version(version) < high):
        raise ImportError(
            f"trl_zerostd supports {SUPPORTED_TRL_TEXT} (it overrides private TRL methods of those releases), "
            f"but trl=={version} is installed. Install a supported release: pip install '{SUPPORTED_TRL_TEXT}'."
        )
