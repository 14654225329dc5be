"""PyTorch's allocator rules live in the core (csrc/core/base/alloc_config.h, ReplayOp); Python reads them from
torchmem._core.rules and keeps no copy of its own."""
from __future__ import annotations

import re
from pathlib import Path

from torchmem import _core

MiB = 1 << 20
ROOT = Path(__file__).resolve().parents[2]


def test_allocation_size_is_pytorchs_get_allocation_size():
    """CUDACachingAllocator.cpp's get_allocation_size: a small-pool segment for requests up to 1 MiB, a large
    segment below 10 MiB, else the request rounded up to 2 MiB."""
    size = _core.rules.allocation_size
    assert [size(512), size(MiB), size(MiB + 512), size(10 * MiB - 512)] == [2 * MiB, 2 * MiB, 20 * MiB, 20 * MiB]
    assert [size(10 * MiB), size(10 * MiB + 512), size(100 * MiB + 1)] == [10 * MiB, 12 * MiB, 102 * MiB]
    assert size(MiB + 512, 64 * MiB) == 64 * MiB  # large_segment_size_mb


def test_round_sizes_is_pytorchs_round_size():
    """CUDACachingAllocator.cpp's round_size: at least 512 B, a multiple of 512 B, or under
    roundup_power2_divisions the next of that many divisions of the power-of-two interval (above 1 MiB here)."""
    assert _core.rules.round_sizes([1, 512, 513, 5 * MiB + 1]) == [512, 512, 1024, 5 * MiB + 512]
    # 5 MiB + 1 lies in [4, 8) MiB: four divisions of 1 MiB round it to 6 MiB; 8 MiB is a power of two.
    assert _core.rules.round_sizes([5 * MiB + 1, 8 * MiB], "roundup_power2_divisions:4") == [6 * MiB, 8 * MiB]
    assert _core.rules.round_sizes([], "") == []


def test_an_expandable_range_is_nine_eighths_of_the_card_in_whole_pages():
    """find_expandable_space: 9/8 of the device, rounded up to the pool's page."""
    assert _core.rules.expandable_range_size(80 << 30, 20 * MiB) == -(-(90 << 30) // (20 * MiB)) * (20 * MiB)
    assert _core.rules.expandable_range_size(24 * 10**9, 2 * MiB) == -(-(27 * 10**9) // (2 * MiB)) * (2 * MiB)


def test_the_op_codes_are_the_replayers():
    from torchmem.formats import trace_types

    ops = _core.rules.REPLAY_OPS
    assert sorted(ops.values()) == list(range(_core.replay_op_count))
    assert all(getattr(trace_types, name) == code for name, code in ops.items())


def test_the_python_replay_holds_no_copy_of_a_size_rule_or_op_code():
    """No MiB literal of the allocator's sizes and no op-code numbers in the replay's Python."""
    files = [*sorted((ROOT / "torchmem" / "replay").glob("*.py")), ROOT / "torchmem" / "formats" / "trace_types.py"]
    copies = []
    for path in files:
        for n, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#")[0]
            if re.search(r"\b(1|2|10|20)\s*<<\s*20\b|\b(1048576|2097152|10485760|20971520)\b", code) or \
                    re.search(r"^\s*[A-Z_]+(, [A-Z_]+)+ = \d+(, \d+)+", code):
                copies.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert not copies, "\n".join(copies)
