"""What PyTorch's CUDA features need from the allocator, checked by their values
under torchmem: CUDA graphs, torch.cuda.MemPool, record_stream, and the native
allocator's recorded history replayed exactly by `torchmem replay`.

Each check runs in a fresh interpreter (one allocator swap per process) that
notes what it sees as it goes (cuda_helpers.run_noted). When a check differs
under torchmem, the same code runs under PyTorch's own allocator too and the
failure says whether that passes: a check that fails natively is the test's
mistake. All skip without a GPU (real or fake); tests/cuda/test_gpu_checks_offline.py
checks the children's code on any machine. Values go to the GPU by copies and
are read on the host (real on the fake GPU too); what kernels compute (graph
replays' outputs) is checked only on a real GPU (cuda_helpers.computed).
"""
import json
import pickle

from tests.cuda.cuda_helpers import MiB, check_noted, computed, requires_gpu, run_noted, that
from tests.support.subprocess_runner import run_torchmem
from torchmem import replay as sim

pytestmark = requires_gpu

# --------------------------------------------------------------------- CUDA graphs

GRAPH_CHILD = """
x = filled(1 << 20, 1.0)                   # 4 MiB input: large pool
small = filled(1000, 1.0)                  # small pool

def step():
    h = x * 2                               # freed inside the capture: the pool reuses it
    y = h + 1
    z = (small * 3).sum() + y[:10].sum()
    return y, z

side = torch.cuda.Stream()                  # warm up on a side stream, as PyTorch's docs say
side.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(side):
    for _ in range(3):
        step()
torch.cuda.current_stream().wait_stream(side)
torch.cuda.synchronize()
torch.cuda.empty_cache()
before = segments()
g = torch.cuda.CUDAGraph()
with torch.cuda.graph(g):
    y, z = step()
pool_segments = {a: n for a, n in segments().items() if a not in before}
note("capture_violations", capture_violations())
note("pools_after_capture", pool_count())
note("pool_segments", len(pool_segments))
note("outputs_in_pool_segments", [within(y, pool_segments), within(z, pool_segments)])
default = tmcuda.caching_allocator(0) if INSTALLED else None
note("outputs_owned_by_default_pool", [default.owns(t.data_ptr()) for t in (y, z)] if INSTALLED else None)

# Allocations outside the graph, between replays, must never take the pool's memory.
sizes = (1, 100, 1000, 1 << 18, 1 << 20, 1 << 22)
outside = [filled(n, 7.0) for n in sizes for _ in range(4)]
note("outside_in_pool_segments", sum(within(t, pool_segments) for t in outside))
replays = []
for k in range(5):
    put(x, k)
    put(small, k)
    g.replay()
    torch.cuda.synchronize()
    replays.append([float(y[0]), float(y[-1]), float(z)])
    del outside[::2]                         # churn: free, allocate again, empty the cache
    outside += [filled(n, 7.0) for n in sizes]
    torch.cuda.empty_cache()
note("replays", replays)
note("outside_intact", all(bool((t.cpu() == 7).all()) for t in outside))
note("outside_in_pool_segments_after", sum(within(t, pool_segments) for t in outside))
note("pool_segments_kept", all(a in segments() for a in pool_segments))

# A second graph in the same pool, reading the first one's output.
g2 = torch.cuda.CUDAGraph()
with torch.cuda.graph(g2, pool=g.pool()):
    w = y * 10
note("pools_after_second_capture", pool_count())
put(x, 5)
put(small, 5)
g.replay()
g2.replay()
torch.cuda.synchronize()
note("chained", [float(y[0]), float(w[0]), float(w[-1])])

del g2, w, g
gc.collect()
torch.cuda.synchronize()
note("pools_while_outputs_live", pool_count())
note("outputs_after_graphs_deleted", [float(y[0]), float(z)])
del y, z
gc.collect()
note("pools_after_outputs_freed", pool_count())
torch.cuda.empty_cache()
note("pool_segments_left_after_release", sum(a in segments() for a in pool_segments))
after = filled(1 << 20, 1.0)
note("works_after", host_sum(after))
"""


def graph_replays_ok(replays):
    return replays == [[2 * k + 1, 2 * k + 1, 3000 * k + 10 * (2 * k + 1)] for k in range(5)]


def test_cuda_graph_capture_and_replays_keep_the_private_pool_valid():
    check_noted("graph", GRAPH_CHILD, {
        "capture_violations": that("0 on the fake GPU (None on a GPU)", lambda v: v in (0, None)),
        "pools_after_capture": that("1 (or None natively)", lambda v: v in (1, None)),
        "pool_segments": that("at least one segment made during the capture", lambda v: v >= 1),
        "outputs_in_pool_segments": [True, True],
        "outside_in_pool_segments": 0,
        "outside_intact": True,
        "outside_in_pool_segments_after": 0,
        "pool_segments_kept": True,
        "pools_after_second_capture": that("1: one pool shared (or None natively)", lambda v: v in (1, None)),
        **computed({
            "replays": that("y = 2k+1, z = 3000k + 10(2k+1) for k = 0..4", graph_replays_ok),
            "chained": [11.0, 110.0, 110.0],
            "outputs_after_graphs_deleted": [11.0, 15000.0 + 110.0],
        }),
        "pools_after_outputs_freed": that("0 (or None natively)", lambda v: v in (0, None)),
        "pool_segments_left_after_release": 0,
        "works_after": float(1 << 20),
        "outputs_owned_by_default_pool": that("[False, False] (or None natively)", lambda v: v in ([False, False], None)),
    })


# --------------------------------------------------------------------- MemPool

MEMPOOL_CHILD = """
pool = torch.cuda.MemPool()
with torch.cuda.use_mem_pool(pool):
    a = filled(1 << 20, 3.0)                     # 4 MiB: large
    s = filled(100, 4.0)                         # small
b = filled(1 << 20, 5.0)                         # outside the pool
default = tmcuda.caching_allocator(0) if INSTALLED else None
note("owned_by_default_pool", [default.owns(t.data_ptr()) for t in (a, s, b)] if INSTALLED else None)
pool_segs = {x["address"]: x["total_size"] for x in pool.snapshot()}  # MemPool.snapshot(): the pool's segments, a list
note("in_pool_snapshot", [within(t, pool_segs) for t in (a, s, b)])
note("pools", pool_count())
attempt("use_count", pool.use_count)

del a                                                # back to the pool, and taken again from it
with torch.cuda.use_mem_pool(pool):
    a2 = filled(1 << 20, 6.0)
pool_segs = {x["address"]: x["total_size"] for x in pool.snapshot()}
note("a2_in_pool_snapshot", within(a2, pool_segs))
note("values", [host_sum(a2), host_sum(s), host_sum(b)])

# The pool is destroyed while two of its tensors live, then they are freed.
del pool
gc.collect()
c = filled(1 << 20, 1.0)
note("values_after_pool_deleted", [host_sum(a2), host_sum(s), host_sum(c)])
del a2, s
gc.collect()
torch.cuda.synchronize()
note("pools_after_its_tensors_freed", pool_count())

# A pool destroyed empty, right after use_mem_pool.
pool2 = torch.cuda.MemPool()
with torch.cuda.use_mem_pool(pool2):
    t = filled(1000, 1.0)
del t
del pool2
gc.collect()
torch.cuda.empty_cache()
note("pools_at_end", pool_count())
d = filled(1 << 20, 1.0)
note("works_after", host_sum(d))
"""


def test_mem_pool_takes_the_allocations_inside_use_mem_pool_and_dies_cleanly():
    check_noted("mempool", MEMPOOL_CHILD, {
        "owned_by_default_pool": that("[False, False, True] (or None natively)",
                                      lambda v: v in ([False, False, True], None)),
        "in_pool_snapshot": [True, True, False],
        "pools": that("1 (or None natively)", lambda v: v in (1, None)),
        "a2_in_pool_snapshot": True,
        "values": [6.0 * (1 << 20), 400.0, 5.0 * (1 << 20)],
        "values_after_pool_deleted": [6.0 * (1 << 20), 400.0, float(1 << 20)],
        "pools_after_its_tensors_freed": that("0 (or None natively)", lambda v: v in (0, None)),
        "pools_at_end": that("0 (or None natively)", lambda v: v in (0, None)),
        "works_after": float(1 << 20),
    })


GRAPH_IN_MEMPOOL_CHILD = """
x = filled(1 << 20, 1.0)
torch.cuda.synchronize()

def capture(**kwargs):
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, **kwargs):
        y = x * 2 + 1
    put(x, 4)
    g.replay()
    torch.cuda.synchronize()
    return g, y

pool = torch.cuda.MemPool()
# A graph captured into a MemPool given as its pool.
g1, y1 = capture(pool=pool.id)
note("graph_with_pool_id", float(y1[0]))
pool_segs = {s["address"]: s["total_size"] for s in pool.snapshot()}
note("graph_output_in_mempool", within(y1, pool_segs))
put(x, 1)

# A graph captured inside use_mem_pool (torch.cuda.graph() empties the cache on entry).
def inside(mempool):
    with torch.cuda.use_mem_pool(mempool):
        g, y = capture()
    return g, y

def inside_value(mempool):
    g, y = inside(mempool)
    note("graph_inside_use_mem_pool_captured", True)
    return float(y[0])

attempt("graph_inside_use_mem_pool", lambda: inside_value(pool))
del g1, y1
gc.collect()
pool = None                                          # the MemPool dies here
gc.collect()
torch.cuda.synchronize()
torch.cuda.empty_cache()
note("works_after", host_sum(filled(1000, 1.0)))
note("pools_at_end", pool_count())
"""


def test_graphs_captured_into_a_mem_pool():
    check_noted("graph in MemPool", GRAPH_IN_MEMPOOL_CHILD, {
        "graph_output_in_mempool": True,
        **computed({"graph_with_pool_id": 9.0, "graph_inside_use_mem_pool": 9.0}),
        "graph_inside_use_mem_pool_captured": True,
        "works_after": 1000.0,
        "pools_at_end": that("0 (or None natively)", lambda v: v in (0, None)),
    })


# --------------------------------------------------------------------- record_stream

RECORD_STREAM_CHILD = """
side = torch.cuda.Stream()
main = torch.cuda.current_stream()
# Warm-up: on a GPU the first launch of a kernel loads its module, which can outlast the sleep
# that holds the side stream; the first run below would then find the write already done.
w = filled(256, 0.0)
hold(side)
with torch.cuda.stream(side):
    w.fill_(1.0)
release(side)
torch.cuda.synchronize()
del w
race = []
for n in (256, 1 << 18, 1 << 22):                    # 1 KiB (small pool), 1 MiB, 16 MiB of float32
    for _ in range(3):
        x = filled(n, 0.0)
        ptr = x.data_ptr()
        allocated_with_x = torch.cuda.memory_allocated()
        side.wait_stream(main)                       # the zeros are written before the side stream starts
        hold(side)                                   # still busy when x is freed below
        with torch.cuda.stream(side):
            x.fill_(1.0)                             # the side stream's write, pending
        x.record_stream(side)
        del x                                        # freed on the main stream, the write still pending
        allocated_after_free = torch.cuda.memory_allocated()
        pending = pending_frees()
        y = filled(n, 2.0)                           # main stream, at once: must not get x's block
        reused = y.data_ptr() == ptr
        release(side)
        torch.cuda.synchronize()
        race.append({"n": n, "reused": reused, "y_intact": bool((y.cpu() == 2).all()), "pending": pending,
                     "allocated_drop": allocated_with_x - allocated_after_free})
        del y
note("race", race)

# Once the side stream's work is done, every deferred block is free again:
# the cache then gives back all but y's 16 MiB segment.
torch.cuda.synchronize()
x = filled(1 << 22, 0.0)
with torch.cuda.stream(side):
    x.add_(1)
x.record_stream(side)
del x
torch.cuda.synchronize()
y = torch.empty(1 << 22, device="cuda")
note("pending_after_sync", pending_frees())
torch.cuda.empty_cache()
note("reserved_after_empty", torch.cuda.memory_reserved())
"""


def race_ok(race):
    return len(race) == 9 and all(not r["reused"] and r["y_intact"] for r in race)


def test_record_stream_race_a_side_stream_writes_into_a_freed_tensor():
    check_noted("record_stream", RECORD_STREAM_CHILD, {
        "race": that("9 runs, no block reused while the side stream's write was pending, y intact", race_ok),
        "pending_after_sync": that("0 (or None natively)", lambda v: v in (0, None)),
        "reserved_after_empty": 16 * MiB,
    })


def test_record_stream_allocated_bytes_drop_when_the_tensor_is_freed():
    """PyTorch lowers allocated bytes at the free, while the stream uses are pending (issue 14)."""
    check_noted("record_stream stats", RECORD_STREAM_CHILD, {
        "race": that("allocated bytes drop by the block's size at each free (4 * n rounded up to 512)",
                     lambda race: all(r["allocated_drop"] == max(512, -(-4 * r["n"] // 512) * 512) for r in race)),
    })


# --------------------------------------------------------------------- native history, replayed exactly

NATIVE_HISTORY_CHILD = """
import random
path = os.environ["TORCHMEM_TEST_SNAPSHOT"]
torch.cuda.memory._record_memory_history(max_entries=200_000, stacks="python")
rng = random.Random(0)
side = torch.cuda.Stream()
live = []
for i in range(4000):
    if live and (len(live) >= 200 or rng.random() < 0.45):
        live.pop(rng.randrange(len(live)))
    else:
        size = int(2 ** rng.uniform(9, 27))          # 512 B .. 128 MiB, log-uniform
        if i % 7 == 0:
            with torch.cuda.stream(side):            # some blocks of another stream's pools
                live.append(torch.empty(size, dtype=torch.uint8, device="cuda"))
        else:
            live.append(torch.empty(size, dtype=torch.uint8, device="cuda"))
    if i % 1500 == 1499:
        torch.cuda.empty_cache()
torch.cuda.synchronize()
stats = torch.cuda.memory_stats()
torch.cuda.memory._dump_snapshot(path)
torch.cuda.memory._record_memory_history(enabled=None)
note("total", torch.cuda.get_device_properties(0).total_memory)
note("peaks", [stats["allocated_bytes.all.peak"], stats["reserved_bytes.all.peak"]])
"""


def replay_problems(path, capacity: int, peaks: list | None = None, conf: str | None = None) -> list[str]:
    """What `torchmem replay` of the snapshot at `path` (under `conf` when given,
    else the snapshot's settings) does not reproduce: every allocation at its
    recorded address, the recorded peaks (allocated, reserved) when given, the
    final segments block by block. Empty when exact."""
    if conf is None:
        proc = run_torchmem("replay", str(path), "--capacity", f"{capacity}B", "--json", "--no-progress", timeout=300)
        if proc.returncode != 0:
            return [f"torchmem replay exited {proc.returncode}: {proc.stderr[-3000:]}"]
        result = json.loads(proc.stdout)
    else:  # the command line's --conf replays another setting; following the recording takes sim.replay
        r = sim.replay(str(path), capacity=capacity, conf=conf, follow_recording=True)
        result = {"exact": r.exact, "completed": r.completed, "fidelity": r.fidelity, "peak_allocated": r.peak_allocated,
                  "peak_reserved": r.peak_reserved, "skipped_events": r.skipped, "notes": list(r.notes)}
    fidelity = result["fidelity"] or {}
    problems = []
    if not (result["exact"] and result["completed"] and fidelity.get("placements_differed") == 0):
        problems.append("not exact")
    if peaks is not None and [result["peak_allocated"], result["peak_reserved"]] != list(peaks):
        problems.append(f"peaks (allocated, reserved): recorded {list(peaks)}, "
                        f"replay {[result['peak_allocated'], result['peak_reserved']]}")

    replayed = sim.replay(str(path), capacity=capacity,
                          **({"conf": conf, "follow_recording": True} if conf is not None else {}))
    with open(path, "rb") as f:
        snapshot = pickle.load(f)

    from torchmem.formats.snapshot_format import block_state

    def layout(segments):
        return sorted((s["address"], s["total_size"], tuple(
            (b["address"], b["size"], block_state(b)) for b in s["blocks"])) for s in segments)

    recorded_layout = layout([s for s in snapshot["segments"] if s.get("device", 0) == 0])
    if layout(replayed.segments) != recorded_layout:
        problems.append(f"final segments differ block by block ({len(recorded_layout)} recorded, "
                        f"{len(replayed.segments)} replayed)")
    if problems:
        summary = {k: result[k] for k in ("exact", "completed", "peak_allocated", "peak_reserved", "skipped_events", "notes")}
        problems.append(json.dumps(dict(summary, fidelity=fidelity))[:3000])
    return problems


def replay_native_history(tmp_path, conf: str) -> None:
    """Record NATIVE_HISTORY_CHILD under PyTorch's allocator (settings `conf`), then
    replay the dump with `torchmem replay`, told how this torch orders free
    blocks of one size (a snapshot does not say: torch 2.14.1 by segment age,
    then address; 2.11 by address, the replay's default)."""
    from torchmem.runtime.cuda import native_reuse_order

    path = tmp_path / "native.pickle"
    native = run_noted(NATIVE_HISTORY_CHILD, conf=conf, install=False, env={"TORCHMEM_TEST_SNAPSHOT": str(path)})
    assert native.returncode == 0 and path.exists(), native.stderr[-3000:]
    order = native_reuse_order()
    replay_conf = ",".join(c for c in (conf, f"reuse_order:{order}") if c) if order != "address" else None
    problems = replay_problems(path, native["total"], native["peaks"], replay_conf)
    assert not problems, "\n".join(problems)


def test_native_history_replays_exactly(tmp_path):
    replay_native_history(tmp_path, "")


def test_native_history_with_expandable_segments_replays_exactly(tmp_path):
    replay_native_history(tmp_path, "expandable_segments:True")
