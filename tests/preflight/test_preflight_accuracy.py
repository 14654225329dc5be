"""benchmarks/preflight_accuracy.py's comparison of two snapshots (gpu_check.sh's preflight stage), on made-up traces."""
from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("preflight_accuracy", ROOT / "benchmarks" / "preflight_accuracy.py")
accuracy = importlib.util.module_from_spec(spec)
spec.loader.exec_module(accuracy)

MiB = 1 << 20


def snapshot(segment: int, allocs: list[int], before: list[tuple[int, int]] = ()) -> dict:
    trace = [{"action": "segment_alloc", "addr": segment, "size": 20 * MiB}]
    trace += [{"action": "alloc", "addr": a, "size": 512} for a in allocs]
    return {"segments": [{"device": 0, "address": s, "total_size": n} for s, n in before],
            "device_traces": [trace]}


def test_offsets_are_taken_in_the_segment_that_holds_each_allocation():
    snap = snapshot(100 * MiB, [100 * MiB, 101 * MiB, 7 * MiB + 512], before=[(7 * MiB, 2 * MiB)])
    assert accuracy.offsets(snap) == [0, MiB, 512]


def test_the_share_compares_the_ith_allocation_of_each_run():
    real = snapshot(100 * MiB, [100 * MiB, 101 * MiB, 102 * MiB, 103 * MiB])
    fake = snapshot(300 * MiB, [300 * MiB, 301 * MiB, 305 * MiB])  # other addresses, same offsets but one; one fewer
    share, n_real, n_fake = accuracy.same_offset_share(real, fake)
    assert (n_real, n_fake) == (4, 3) and share == 2 / 4
