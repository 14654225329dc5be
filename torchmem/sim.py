"""Replay an allocation trace on a simulated GPU: the earlier name of torchmem.replay.

    from torchmem import sim
    result = sim.replay("snapshot.pickle")
    print(result.explain())
"""
from torchmem.replay import *  # noqa: F401,F403
from torchmem.replay import __all__  # noqa: F401
