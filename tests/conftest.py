import os

import pytest

from torchmem import _core

from tests.support.sim import sim_allocator

@pytest.fixture
def sim():
    return sim_allocator


@pytest.fixture(autouse=True)
def no_unimplemented_fake_gpu_calls():
    """On the fake GPU (the fake-GPU tier sets TORCHMEM_FAKEGPU_LOG): a test fails
    when it, or any process it started, called a CUDA entry point that the fake
    GPU does not implement (a torch release that calls something new)."""
    log = os.environ.get("TORCHMEM_FAKEGPU_LOG")
    if not log:
        yield
        return
    before = os.path.getsize(log) if os.path.exists(log) else 0
    yield
    if os.path.exists(log) and os.path.getsize(log) > before:
        with open(log) as f:
            f.seek(before)
            calls = sorted(set(line.split(" (pid")[0] for line in f.read().splitlines()
                            if "fake GPU: unimplemented " in line))
        if calls:  # the log's "failed" lines are calls the fake answered with an error, as a GPU may
            pytest.fail("the fake GPU was asked for what it does not implement:\n  " + "\n  ".join(calls))


def _measured_slow() -> set[str]:
    """Test ids and files listed in tests/slow_tests.txt (scripts/slow_tests.py measures them)."""
    path = os.path.join(os.path.dirname(__file__), "slow_tests.txt")
    if not os.path.exists(path):
        return set()
    with open(path) as f:
        return {line.strip() for line in f if line.strip() and not line.startswith("#")}


def pytest_collection_modifyitems(config, items):
    """Marks `slow` each test that tests/slow_tests.txt lists, alone or by its file: `make test-fast` leaves them out."""
    listed = _measured_slow()
    for item in items:
        if item.nodeid in listed or item.nodeid.split("::")[0] in listed:
            item.add_marker(pytest.mark.slow)
