"""Where the fake GPU's cudaMalloc puts segments (Note [Falling device addresses] in fakegpu/cudart/address_space.c).

PyTorch's best fit breaks ties between equal free blocks by address, so the
order of segment addresses decides placements. Each check runs PyTorch's own
allocator in a fresh interpreter on a fake card.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.fakegpu.helpers import MiB, run_json

FIXTURE = Path(__file__).resolve().parents[1] / "data" / "address_order" / "nesta_large_segments.json"

# Makes one tensor per size (each above 10 MiB and a multiple of 2 MiB: one segment of exactly that size),
# frees the positions in FREE, calls empty_cache(), makes the sizes in AGAIN, and prints every address.
PROGRAM = """
    import json, torch
    sizes, free, again = {sizes}, {free}, {again}
    kept = [torch.empty(n, dtype=torch.uint8, device="cuda") for n in sizes]
    first = [t.data_ptr() for t in kept]
    for i in free:
        kept[i] = None
    torch.cuda.empty_cache()
    later = [torch.empty(n, dtype=torch.uint8, device="cuda") for n in again]
    print(json.dumps({{"first": first, "later": [t.data_ptr() for t in later]}}))
"""


FALLING = {"TORCHMEM_FAKEGPU_ADDRESSES": "falling"}


def addresses(sizes: list[int], free: list[int] = [], again: list[int] = [],
              env: dict[str, str] | None = None) -> dict[str, Any]:
    return run_json(PROGRAM.format(sizes=sizes, free=free, again=again), env=env)


def test_segments_lie_where_a_real_recording_put_them() -> None:
    recorded = json.loads(FIXTURE.read_text())["segments"]
    sizes = [size for _, size, _ in recorded]
    got = addresses(sizes, env=FALLING)["first"]
    assert [a - got[0] for a in got] == [offset for _, _, offset in recorded]


def test_a_released_range_is_taken_again_from_its_top() -> None:
    got = addresses([100 * MiB, 40 * MiB, 100 * MiB], free=[1], again=[20 * MiB, 20 * MiB, 60 * MiB],
                    env=FALLING)
    a, b, c = got["first"]
    assert b == a - 40 * MiB and c == b - 100 * MiB  # each new segment directly below the last
    # The 40 MiB hole is the highest free range: two 20 MiB segments fill it from its top down; 60 MiB fits
    # only below everything.
    assert got["later"] == [b + 20 * MiB, b, c - 60 * MiB]


def test_rising_addresses_are_the_default() -> None:
    got = addresses([30 * MiB, 40 * MiB, 30 * MiB], free=[1], again=[20 * MiB],
                    env={"TORCHMEM_FAKEGPU_ADDRESSES": ""})
    a, b, c = got["first"]
    assert b == a + 30 * MiB and c == b + 40 * MiB
    assert got["later"] == [b]  # the lowest free range that fits, from its bottom
