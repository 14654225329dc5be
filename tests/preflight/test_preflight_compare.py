"""torchmem.preflight.compare: a real GPU's snapshot against preflight's, event by event, on made-up traces.

The expected block sizes follow PyTorch's CUDACachingAllocator: requests
round up to 512 bytes; a small-pool block (up to 1 MiB) splits when at
least 512 bytes remain, a large-pool block only when more than 1 MiB
remains (shouldSplit).
"""
from __future__ import annotations

import pytest

from torchmem.preflight.compare import compare, events_and_peaks, rounded

MiB = 1 << 20


def frames(line: int) -> list[dict]:
    return [{"filename": "/x/torch/nn/modules/linear.py", "line": 125, "name": "forward"},
            {"filename": "train.py", "line": line, "name": "main"},
            {"filename": "??", "line": 0, "name": "c10::foo"}]


def run(base: int, program: list[tuple], segment_sizes: dict[str, int] | None = None) -> dict:
    """A snapshot of `program`: ("seg", name, size), ("alloc", name, segment, offset, size), ("free", name),
    ("segfree", segment), at addresses counted from `base`, so that two runs differ in addresses only."""
    trace: list[dict] = []
    segs: dict[str, tuple[int, int]] = {}
    blocks: dict[str, tuple[int, int]] = {}
    cursor = base
    for i, step in enumerate(program):
        kind = step[0]
        if kind == "seg":
            _, name, size = step
            segs[name] = (cursor, size)
            trace.append({"action": "segment_alloc", "addr": cursor, "size": size, "frames": frames(i)})
            cursor += size + 64 * MiB
        elif kind == "alloc":
            _, name, seg, offset, size = step
            addr = segs[seg][0] + offset
            blocks[name] = (addr, size)
            trace.append({"action": "alloc", "addr": addr, "size": size, "frames": frames(i)})
        elif kind == "free":
            addr, size = blocks.pop(step[1])
            trace.append({"action": "free_requested", "addr": addr, "size": size, "frames": frames(i)})
            trace.append({"action": "free_completed", "addr": addr, "size": size, "frames": frames(i)})
        elif kind == "segfree":
            addr, size = segs.pop(step[1])
            trace.append({"action": "segment_free", "addr": addr, "size": size, "frames": frames(i)})
    segments = []
    for addr, size in segs.values():
        live = [{"address": a, "size": rounded(s), "requested_size": s, "state": "active_allocated"}
                for a, s in blocks.values() if addr <= a < addr + size]
        segments.append({"device": 0, "address": addr, "total_size": size, "blocks": live})
    return {"segments": segments, "device_traces": [trace]}


PROGRAM = [
    ("seg", "L", 20 * MiB),
    ("alloc", "w", "L", 0, 4 * MiB),
    ("seg", "S", 2 * MiB),
    ("alloc", "b", "S", 0, 1000),
    ("alloc", "c", "S", 1024, 3000),
    ("free", "b"),
    ("alloc", "x", "L", 4 * MiB, 8 * MiB),
    ("free", "x"),
]


def test_equal_programs_at_other_addresses_agree():
    c = compare(run(1 << 32, PROGRAM), run(7 << 32, PROGRAM))
    assert c.agrees and c.first is None and c.first_request is None and c.first_segment is None
    assert c.matching == c.events_real == c.events_other == 10
    assert c.peak_difference("allocated") == 0.0 and c.peak_difference("reserved") == 0.0


def test_a_changed_size_is_found_at_its_event_with_both_stacks():
    other = [*PROGRAM]
    other[4] = ("alloc", "c", "S", 1024, 3584)
    c = compare(run(1 << 32, PROGRAM), run(7 << 32, other))
    assert c.first is not None and c.first.field == "size" and c.first.position == 4 == c.matching
    assert (c.first.real.size, c.first.other.size) == (3000, 3584)
    assert c.first.real.frames == ("/x/torch/nn/modules/linear.py:125 (forward)", "train.py:4 (main)")
    assert c.first_segment is None  # same segments: only the event differs


def test_a_changed_offset_is_found_at_its_event():
    other = [*PROGRAM]
    other[6] = ("alloc", "x", "L", 6 * MiB, 8 * MiB)
    c = compare(run(1 << 32, PROGRAM), run(7 << 32, other))
    assert c.first.field == "offset" and c.first.position == 7
    assert (c.first.real.offset, c.first.other.offset) == (4 * MiB, 6 * MiB)
    assert c.first_request is None  # the same requests, placed elsewhere


def test_the_first_request_difference_looks_past_offsets():
    other = [*PROGRAM]
    other[4] = ("alloc", "c", "S", 1536, 3000)
    other[6] = ("alloc", "x", "L", 4 * MiB, 9 * MiB)
    c = compare(run(1 << 32, PROGRAM), run(7 << 32, other))
    assert c.first.field == "offset" and c.first.position == 4
    assert c.first_request.field == "size" and c.first_request.position == 7


def test_segments_made_in_another_order_are_found_in_both_lists():
    other = [PROGRAM[2], PROGRAM[0], *PROGRAM[1:2], *PROGRAM[3:]]
    c = compare(run(1 << 32, PROGRAM), run(7 << 32, other))
    assert c.segments_real == [20 * MiB, 2 * MiB] and c.segments_other == [2 * MiB, 20 * MiB]
    assert c.first_segment == 0
    assert c.first.position == 0 and c.first.field == "size"


def test_one_trace_ending_early_is_a_length_difference():
    c = compare(run(1 << 32, PROGRAM), run(7 << 32, PROGRAM[:-1]))
    assert c.first.field == "length" and c.first.position == 8 and c.first.other is None
    assert c.first.real.action == "free_requested"


def test_peaks_count_blocks_as_the_allocator_sizes_them():
    # 19.5 MiB in a 20 MiB segment leaves 0.5 MiB: a large block is not split, so 20 MiB are allocated.
    whole = [("seg", "L", 20 * MiB), ("alloc", "a", "L", 0, 19 * MiB + MiB // 2)]
    _, segs, peaks = events_and_peaks(run(1 << 32, whole))
    assert segs == [20 * MiB] and peaks.allocated == 20 * MiB and peaks.reserved == 20 * MiB
    # 1000 B in the small pool rounds to 1024 B and splits (2 MiB - 1 KiB remain).
    small = [("seg", "S", 2 * MiB), ("alloc", "a", "S", 0, 1000), ("alloc", "b", "S", 1024, 100)]
    _, _, peaks = events_and_peaks(run(1 << 32, small))
    assert peaks.allocated == 1024 + 512 and peaks.approximate == 0


def test_a_higher_peak_is_reported_with_its_relative_difference():
    other = [*PROGRAM]
    other[6] = ("alloc", "x", "L", 4 * MiB, 12 * MiB)
    c = compare(run(1 << 32, PROGRAM), run(7 << 32, other))
    # real: 4 MiB + 1024 (c) + 8 MiB at the peak; preflight: 12 MiB instead of 8 MiB
    assert c.peaks_real.allocated == 12 * MiB + 3072
    assert c.peaks_other.allocated == 16 * MiB + 3072
    assert c.peak_difference("allocated") == pytest.approx(4 * MiB / (12 * MiB + 3072))
    assert c.peaks_real.reserved == c.peaks_other.reserved == 22 * MiB


def test_reserved_peak_differs_when_a_segment_is_released_and_made_again():
    real = [("seg", "A", 20 * MiB), ("segfree", "A"), ("seg", "B", 20 * MiB)]
    other = [("seg", "A", 20 * MiB), ("seg", "B", 20 * MiB), ("segfree", "A")]
    c = compare(run(1 << 32, real), run(7 << 32, other))
    assert (c.peaks_real.reserved, c.peaks_other.reserved) == (20 * MiB, 40 * MiB)
    assert c.peak_difference("reserved") == 1.0
    assert c.first.position == 1 and c.first.field == "action"


def test_a_window_that_starts_mid_run_counts_from_the_final_state():
    program = [("seg", "L", 20 * MiB), ("alloc", "w", "L", 0, 4 * MiB),
               ("alloc", "x", "L", 4 * MiB, 2 * MiB), ("free", "x")]
    snap = run(1 << 32, program)
    # the preflight run recorded the model's creation too: its window starts after the first two entries
    c = compare({**snap, "device_traces": [snap["device_traces"][0][2:]]}, snap, other_start=2)
    assert c.agrees and c.events_real == 3
    assert c.peaks_real.allocated == c.peaks_other.allocated == 6 * MiB
    assert c.peaks_real.reserved == c.peaks_other.reserved == 20 * MiB
    # the real side's x lies in a segment made before its recording and is freed: its block size is inferred
    assert (c.peaks_real.approximate, c.peaks_other.approximate) == (1, 0)


def test_snapshot_marks_and_other_devices_are_not_compared():
    a = run(1 << 32, PROGRAM)
    b = run(7 << 32, PROGRAM)
    b["device_traces"][0].insert(3, {"action": "snapshot", "addr": 0, "size": 0})
    b["device_traces"].append([{"action": "segment_alloc", "addr": 1, "size": 2 * MiB}])
    assert compare(a, b).agrees


def test_a_block_from_before_the_window_freed_in_it_counts_at_its_rounded_size():
    program = [("seg", "L", 20 * MiB), ("alloc", "w", "L", 0, 4 * MiB - 100), ("free", "w"),
               ("alloc", "x", "L", 0, MiB)]
    snap = run(1 << 32, program)
    c = compare({**snap, "device_traces": [snap["device_traces"][0][2:]]}, snap, other_start=2)
    # at the window's start 4 MiB are allocated (w's block); then 1 MiB
    assert c.peaks_real.allocated == c.peaks_other.allocated == 4 * MiB
    assert (c.peaks_real.approximate, c.peaks_other.approximate) == (1, 0)


def test_windows_that_end_together_are_aligned_by_their_shift():
    program = [("seg", "L", 20 * MiB), *[("alloc", f"a{i}", "L", i * MiB, MiB + i) for i in range(8)]]
    full = run(1 << 32, program)
    trace = full["device_traces"][0]
    real = {**full, "device_traces": [trace[3:]]}     # a ring that kept one entry fewer than preflight's
    other = {**full, "device_traces": [trace[2:]]}
    assert compare(real, other).first.position == 0
    c = compare(real, other, shift=None)
    assert c.first is None and c.notes[0].startswith("windows aligned by dropping the first 1 preflight")
