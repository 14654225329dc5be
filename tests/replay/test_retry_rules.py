"""Retries and limit refusals read from runs of releases (retries.py, memory_limit.refused_retries).

Hand-made runs; the native cases are tests/fakegpu/fixed/ (fraction-retry-unmap.json,
fraction-map-request.json), run under PyTorch's allocator on the fake GPU.
"""
from __future__ import annotations

from torchmem.replay.memory_limit import bounds, refused_retries
from torchmem.replay.release_runs import ALLOCATOR, PROGRAM, ReleaseRun
from torchmem.replay.retries import recorded_retries

MiB, GiB = 1 << 20, 1 << 30
CONF = "expandable_segments:True,max_split_size_mb:100"


def _run(sizes: list[int], unmapped: bool, origin: str | None = ALLOCATOR, before: int = GiB,
         new: int = 300 * MiB) -> ReleaseRun:
    return ReleaseRun(before, new, sizes, [7] * len(sizes), 7, False, origin, 0, unmapped)


def test_a_run_that_unmaps_is_a_retry_even_of_oversize_pages():
    """max_split_size_mb's second step releases whole fixed segments only: an unmap is the full release's."""
    run = _run([320 * MiB], unmapped=True)
    assert recorded_retries([run], CONF, 0, 4 * GiB) == [run]


def test_a_run_of_oversize_fixed_segments_under_expandable_settings_is_the_second_step():
    """A private pool's fixed segments, released by the second step, which counts no retry."""
    assert recorded_retries([_run([320 * MiB], unmapped=False)], CONF, 0, 4 * GiB) == []


def test_a_retry_where_the_card_had_room_bounds_the_limit():
    runs = [_run([320 * MiB], True, before=GiB, new=300 * MiB),
            _run([320 * MiB], True, before=GiB, new=4 * GiB),            # no room on the card: it refused
            _run([320 * MiB], True, PROGRAM, before=GiB // 2, new=MiB)]  # the program's empty_cache()
    refusals = refused_retries(runs, 100 * MiB, 3 * GiB, collects=False)
    assert refusals == [(GiB + 100 * MiB, 300 * MiB)]
    assert bounds([(0, GiB)], [], 20 * MiB, refusals).hi == GiB + 400 * MiB
    # The garbage collector releases before a refusal; with no OOM the card is unknown: no bound.
    assert refused_retries(runs, 100 * MiB, 3 * GiB, collects=True) == []
    assert refused_retries(runs, 100 * MiB, None, collects=False) == []


def test_without_stacks_a_run_that_unmaps_oversize_pages_is_taken_as_no_retry():
    """The program's empty_cache() leaves the same unmaps: the guess the oracle finds right more often."""
    assert recorded_retries([_run([320 * MiB], unmapped=True, origin=None)], CONF, 0, 1 * GiB) == []
    # Pages under max_split_size among them: not the second step's, so a retry where no room was left.
    small = _run([320 * MiB, 20 * MiB], unmapped=True, origin=None)
    assert recorded_retries([small], CONF, 0, 1 * GiB) == [small]


def _framed(entry: dict, line: int) -> dict:
    return dict(entry, frames=[{"filename": "train.py", "line": line, "name": "step"}])


def _retry_runs(trace: list[dict]) -> list[ReleaseRun]:
    from torchmem.replay.trace_pass import BadEntries, run_pass

    return list(run_pass(trace, BadEntries("trace", 0, skip=False)).retry_releases)


def test_a_run_under_the_next_allocations_own_stack_is_its_retry_even_without_a_new_segment():
    """With expandable segments a retry may map nothing: its full release completed a free that left a
    block before unmapped space of its range (find_expandable_block). Under another stack it is the program's."""
    base = 0x7F0000000000
    start = [_framed({"action": "segment_map", "addr": base, "size": 100 * MiB, "stream": 0}, 1),
             _framed({"action": "alloc", "addr": base, "size": 60 * MiB, "stream": 0}, 1),
             _framed({"action": "alloc", "addr": base + 60 * MiB, "size": 30 * MiB, "stream": 0}, 1),
             _framed({"action": "free_completed", "addr": base + 60 * MiB, "size": 30 * MiB, "stream": 0}, 2)]

    def then(release_line: int) -> list[dict]:
        return start + [_framed({"action": "segment_unmap", "addr": base + 80 * MiB, "size": 20 * MiB, "stream": 0},
                                release_line),
                        _framed({"action": "alloc", "addr": base + 60 * MiB, "size": 20 * MiB, "stream": 0}, 3)]

    runs = _retry_runs(then(3))
    assert [(run.origin, run.new_segment, run.position) for run in runs] == [(ALLOCATOR, -1, 5)]
    assert recorded_retries(_asking_nothing(runs), CONF, 0, GiB) == _asking_nothing(runs)
    assert _retry_runs(then(9)) == []  # the program's empty_cache(): no retry


def _asking_nothing(runs: list[ReleaseRun]) -> list[ReleaseRun]:
    """As snapshot_trace._asking gives such a run: it asked nothing of the device."""
    return [run._replace(new_segment=0) for run in runs]
