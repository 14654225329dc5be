"""Random operation sequences against the caching allocator, checked against
a simple reference model and the allocator's own invariants after every step."""
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.sim import MiB, sim_allocator

CONFS = ["", "expandable_segments:True", "max_split_size_mb:24", "roundup_power2_divisions:4", "garbage_collection_threshold:0.7,per_process_memory_fraction:0.9"]

sizes = st.one_of(st.integers(1, 4096), st.integers(1, 2 * MiB), st.integers(MiB, 40 * MiB))
ops = st.lists(
    st.one_of(
        st.tuples(st.just("malloc"), sizes, st.integers(0, 1)),
        st.tuples(st.just("free"), st.integers(0, 10**6), st.just(0)),
        st.tuples(st.just("empty_cache"), st.just(0), st.just(0)),
    ),
    max_size=80,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=ops, conf=st.sampled_from(CONFS), capacity_mb=st.sampled_from([64, 256, 4096]))
def test_random_sequences_keep_invariants(ops, conf, capacity_mb):
    a = sim_allocator(capacity=capacity_mb * MiB, conf=conf)
    live = {}  # address -> requested size: the reference model
    for op, value, stream in ops:
        if op == "malloc":
            try:
                p = a.allocate(value, stream)
            except torch.OutOfMemoryError:
                a.check_invariants()
                continue
            assert p not in live
            for q, size in live.items():  # no live block overlaps another
                assert p + value <= q or q + size <= p
            live[p] = value
        elif op == "free" and live:
            p = sorted(live)[value % len(live)]
            a.deallocate(p)
            del live[p]
        elif op == "empty_cache":
            a.empty_cache()
        a.check_invariants()
        stats = a.stats()
        assert stats["allocation"]["all"]["current"] == len(live)
        assert stats["requested_bytes"]["all"]["current"] == sum(live.values())
        assert stats["reserved_bytes"]["all"]["current"] >= stats["allocated_bytes"]["all"]["current"]
        assert stats["reserved_bytes"]["all"]["current"] <= capacity_mb * MiB
    for p in list(live):
        a.deallocate(p)
    a.empty_cache()
    a.check_invariants()
    assert a.stats()["reserved_bytes"]["all"]["current"] == 0
    assert a.segments() == []
