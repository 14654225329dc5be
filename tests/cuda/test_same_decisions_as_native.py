"""torchmem.install() makes the decisions PyTorch's own allocator makes.

One workload runs twice, each time in a fresh interpreter: under torchmem's
caching allocator (installed through CUDAPluggableAllocator) and under
PyTorch's native CUDACachingAllocator, with the same settings
(TORCHMEM_ALLOC_CONF / PYTORCH_CUDA_ALLOC_CONF). Both record their history
with `torch.cuda.memory._record_memory_history`, and the test compares:

- every segment (segment_alloc, or segment_map with expandable segments) in
  order, by size, and every segment release (segment_free, segment_unmap);
- every allocation's place: the segment it lands in (by creation order) and
  its offset there, and every free;
- allocated, reserved and their peaks at checkpoints, and the whole of
  `torch.cuda.memory_stats()` at the end, key by key.

Addresses differ between two processes, so each is written as (segment
ordinal, offset); streams as their order of first use. The workload mixes
sizes across the size classes on two streams and frees blocks used on the
side stream (`record_stream`) while that stream's work is held, so deferred
frees stay pending across later allocations; it also calls `empty_cache()`.

This is the installed allocator's counterpart of the replay oracle (native
snapshots replayed by `torchmem replay`). It needs a GPU or the fake GPU
(`make test-fakegpu`), where it runs on PyTorch's real CUDA build and its
real caching allocator; on a real GPU the side stream is kept busy with a
sleep kernel instead of being held, which makes its timing a GPU's.
"""
import pytest

from tests.cuda.cuda_helpers import FAKE_GPU, requires_gpu, run_noted

pytestmark = [requires_gpu, pytest.mark.skipif(not FAKE_GPU, reason=(
    "compares two runs event by event: needs the fake GPU's held streams, so that deferred frees complete "
    "at the same point in both runs (a GPU's sleep kernel ends when it ends)"))]

WORKLOAD_CHILD = """
import random
MiB = 1 << 20
torch.cuda.memory._record_memory_history(max_entries=1_000_000, stacks="python")
rng = random.Random(int(os.environ.get("TORCHMEM_TEST_SEED", "0")))
side = torch.cuda.Stream()
sizes = [512, 4096, 100_000, MiB - 512, MiB + 1, 3 * MiB, 9 * MiB, 10 * MiB + 1, 33 * MiB, 120 * MiB]
live, pending_side, checkpoints = [], [], []

def size():
    base = rng.choice(sizes)
    return max(1, int(base * rng.uniform(0.5, 1.5)))

for i in range(1500):
    r = rng.random()
    if live and (len(live) >= 120 or r < 0.40):
        live.pop(rng.randrange(len(live)))
    elif r < 0.50:
        # Used on the side stream while its work is held: the free stays pending.
        t = torch.empty(size(), dtype=torch.uint8, device="cuda")
        hold(side)
        with torch.cuda.stream(side):
            t.record_stream(side)
        del t
        pending_side.append(i)
    elif r < 0.60:
        with torch.cuda.stream(side):
            live.append(torch.empty(size(), dtype=torch.uint8, device="cuda"))
    else:
        live.append(torch.empty(size(), dtype=torch.uint8, device="cuda"))
    if pending_side and i - pending_side[0] > 40:
        release(side)                                # the side stream's work completes
        pending_side.clear()
    if i % 100 == 99:
        stats = torch.cuda.memory_stats()
        checkpoints.append([i, torch.cuda.memory_allocated(), torch.cuda.memory_reserved(),
                            torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved(),
                            stats["active_bytes.all.current"], stats["inactive_split_bytes.all.current"]])
    if i % 500 == 499:
        release(side)
        pending_side.clear()
        torch.cuda.empty_cache()
release(side)
del live
torch.cuda.synchronize()
torch.empty(16, device="cuda")                       # processes the completed events
snapshot = torch.cuda.memory._snapshot()
torch.cuda.memory._record_memory_history(enabled=None)

total = torch.cuda.get_device_properties(0).total_memory
streams, bases, events = {}, [], []

def stream(s):
    return streams.setdefault(s, len(streams))

def place(addr):
    # (segment ordinal, offset): the segment made last at or below addr within its extent
    best = None
    for k, (base, extent) in enumerate(bases):
        if base <= addr < base + extent and (best is None or base > bases[best][0]):
            best = k
    return [best, addr - bases[best][0]] if best is not None else [None, None]

for e in snapshot["device_traces"][0]:
    action, addr, n = e["action"], e["addr"], e["size"]
    if action == "segment_alloc":
        bases.append((addr, n))
        events.append([action, len(bases) - 1, n, stream(e["stream"])])
    elif action == "segment_map":
        k, offset = place(addr)
        if k is None:                                # a new expandable range: it grows from its start
            bases.append((addr, total))
            k, offset = len(bases) - 1, 0
        events.append([action, k, offset, n, stream(e["stream"])])
    elif action in ("segment_free", "segment_unmap"):
        events.append([action, *place(addr), n])
    elif action in ("alloc", "free_requested", "free_completed"):
        events.append([action, *place(addr), n, stream(e["stream"])])
    else:
        events.append([action, n])
note("events", events)
note("checkpoints", checkpoints)
note("stats", torch.cuda.memory_stats())
note("final", [torch.cuda.memory_allocated(), torch.cuda.memory_reserved(),
               torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved()])
"""

SETTINGS = [
    "",
    "expandable_segments:True",
    "max_split_size_mb:200",
    "roundup_power2_divisions:4",
    "max_split_size_mb:40,roundup_power2_divisions:[256:1,512:2,>:8],max_non_split_rounding_mb:64",
]


def first_difference(ours: list, native: list) -> str:
    for k, (a, b) in enumerate(zip(ours, native)):
        if a != b:
            return f"event {k}: torchmem {a}, native {b}; before it: {native[max(0, k - 3):k]}"
    return f"torchmem has {len(ours)} events, native {len(native)}"


@pytest.mark.parametrize("conf", SETTINGS, ids=[s or "default" for s in SETTINGS])
def test_torchmem_decides_as_the_native_allocator(conf):
    native = run_noted(WORKLOAD_CHILD, conf=conf, install=False, timeout=300)
    ours = run_noted(WORKLOAD_CHILD, conf=conf, install=True, timeout=300)
    assert native.returncode == 0 and "stats" in native, native.stderr[-3000:]
    assert ours.returncode == 0 and "stats" in ours, ours.stderr[-3000:]
    kinds = {e[0] for e in native["events"]}
    assert {"alloc", "free_requested", "free_completed"} <= kinds
    assert ("segment_map" if "expandable" in conf else "segment_alloc") in kinds
    # Deferred frees happened: some free_requested is not followed at once by its free_completed.
    events = native["events"]
    deferred = sum(1 for a, b in zip(events, events[1:]) if a[0] == "free_requested" and
                   (b[0] != "free_completed" or b[1:3] != a[1:3]))
    assert deferred >= 10, deferred

    def segments(events):
        return [e for e in events if e[0].startswith("segment")]

    same_segments = segments(ours["events"]) == segments(native["events"])
    assert ours["events"] == native["events"], ("segments the same, " if same_segments else "segments differ, ") + \
        "first difference at " + first_difference(ours["events"], native["events"])
    assert ours["checkpoints"] == native["checkpoints"]
    assert ours["final"] == native["final"]
    missing = sorted(set(native["stats"]) - set(ours["stats"]))
    assert not missing, f"memory_stats() keys native has and torchmem lacks: {missing}"
    differ = {k: (ours["stats"][k], v) for k, v in native["stats"].items() if ours["stats"][k] != v}
    assert not differ, f"memory_stats() values (torchmem, native): {differ}"
