"""The fuzzer: damaged snapshots and traces end cleanly (tests/support/fuzz_cases.py; more cases and the figures in
docs/reliability.md: benchmarks/fuzz_snapshots.py).

Each case takes one of the four real snapshots kept as figures in
tests/data/native (or JSON lines of events), damages it once (truncation, a
wrong type in a field, a missing key, a negative, zero or huge size, an
overlapping or unaligned address, a free of an unknown address, a double
free, an oom with no request, thousands of devices, deeply nested frames),
writes it as a pickle, a JSON snapshot or JSON lines, and runs every reader
on it: replay, stats, ranks, plot's timeline, viz and `torchmem replay`.
Each must complete or raise a TraceError that names the file on one line,
and, for damage to one entry, the entry (or segment, block, line).
"""
from __future__ import annotations

import re

from hypothesis import HealthCheck, given, settings, strategies as st

from tests.support import fuzz_cases

# Where the damage is: an entry, segment, block or line by number, a byte of the file, or (for a contradiction
# the rebuilt start state meets, which no single entry makes) the segment by its address.
LOCATED = re.compile(r"(entry|event|segment|block|line) \d|\(byte [\d,]+\)|device_traces|(segment|block) at 0x[0-9a-f]+")


@settings(max_examples=200, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**32 - 1), kind=st.sampled_from(fuzz_cases.KINDS),
       fmt=st.sampled_from(["pickle", "json", "jsonl"]))
def test_damaged_files_end_cleanly(tmp_path, seed, kind, fmt):
    path = str(tmp_path / f"case-{seed}")
    fuzz_cases.write_case(path, seed, kind, fmt)
    outcome = fuzz_cases.check_case(path, time_limit=30)
    assert set(outcome) == {"replay", "stats/ranks/plot", "viz", "cli"}
    # The command line agrees with the Python reader it runs.
    assert outcome["cli"] == outcome["replay"]


@settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**32 - 1),
       kind=st.sampled_from(["wrong_type", "missing_key", "size", "address", "double_free", "oom_no_request"]))
def test_damage_to_an_entry_is_named_where_it_is(tmp_path, seed, kind):
    from torchmem import replay as sim
    from torchmem.formats.trace_types import TraceError

    path = str(tmp_path / f"case-{seed}")
    fuzz_cases.write_case(path, seed, kind, "pickle")
    try:
        sim.replay(path)
    except TraceError as exc:
        assert LOCATED.search(str(exc)), str(exc)


def test_every_kind_of_damage_is_refused_somewhere(tmp_path):
    """A fuzzer whose damage never trips a check tests nothing: each kind is refused in some of 8 seeds."""
    from torchmem import replay as sim
    from torchmem.formats.trace_types import TraceError

    for kind in fuzz_cases.KINDS:
        refused = 0
        for seed in range(8):
            path = str(tmp_path / f"{kind}-{seed}")
            fuzz_cases.write_case(path, seed, kind, "pickle" if kind != "deep_frames" else "json")
            try:
                sim.replay(path)
            except TraceError:
                refused += 1
        assert refused, kind
