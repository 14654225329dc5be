"""Property tests: every method's plan is valid and never below the bound."""
from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from torchmem.plan import Buffer, lower_bound, solve


@st.composite
def instances(draw, max_buffers: int = 40):
    n = draw(st.integers(0, max_buffers))
    out = []
    for i in range(n):
        lo = draw(st.integers(0, 30))
        length = draw(st.integers(1, 12))
        size = draw(st.one_of(st.integers(0, 64), st.sampled_from([128, 1024, 4096])))
        out.append(Buffer(i, lo, lo + length, size))
    return out


def brute_lb(bs: list[Buffer]) -> int:
    times = {b.lower for b in bs}
    return max((sum(b.size for b in bs if b.lower <= t < b.upper) for t in times), default=0)


@settings(max_examples=60, deadline=None)
@given(instances(), st.sampled_from(["naive", "greedy", "sweep", "bottom_up", "portfolio", "auto"]),
       st.sampled_from([1, 8]))
def test_plans_are_valid_and_not_below_the_bound(bs, method: str, alignment: int) -> None:
    plan = solve(bs, method=method, alignment=alignment, time_limit=0.5)
    assert plan.validate(), plan.validation_error()
    assert plan.height >= plan.lower_bound
    if alignment == 1:
        assert plan.lower_bound == lower_bound(bs) == brute_lb(bs)
    if plan.optimal and alignment == 1:
        assert plan.height == plan.lower_bound or method in ("auto", "search")


@settings(max_examples=30, deadline=None)
@given(instances(max_buffers=12))
def test_search_never_worse_than_the_fast_methods(bs) -> None:
    searched = solve(bs, method="search", time_limit=1)
    assert searched.validate()
    for method in ("greedy", "sweep", "bottom_up", "portfolio"):
        assert searched.height <= solve(bs, method=method).height
