"""The earlier name of torchmem.replay, kept for old imports: it warns and re-exports the same names.

    from torchmem.replay import replay
    result = replay("snapshot.pickle")
    print(result.explain())
"""
import warnings

from torchmem.replay import *  # noqa: F401,F403
from torchmem.replay import __all__  # noqa: F401

warnings.warn("torchmem.sim is the earlier name of torchmem.replay: import torchmem.replay instead",
              DeprecationWarning, stacklevel=2)
