"""Expandable segments under memory pressure: allocate until the GPU is full,
free, reallocate, run out again and recover.

Takes the whole GPU: run it alone (scripts/gpu_check.sh runs this file in a
stage of its own, after the other tests). Skips without a GPU; estimated
15-30 s on an H200 (139 GiB mapped twice, page by page), 75 s at most. tests/cuda/test_gpu_checks_offline.py checks the child's code on any
machine.
"""
from tests.cuda.cuda_helpers import check_noted, requires_gpu, that

pytestmark = requires_gpu

PRESSURE_CHILD = """
GiB = 1 << 30
# Warm-up: on a GPU the first launch of a kernel loads its module with memory of the driver's,
# which a full card no longer has. The kernels used once the card is full are loaded now.
if not FAKE_GPU:
    w = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
    w.fill_(1)
    int(w.min()), int(w.max())
    del w
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
free_at_start, total = torch.cuda.mem_get_info()
note("free_at_start", free_at_start)

def fill(chunk, limit):
    \"\"\"Allocate `chunk`-byte tensors until out of memory (or `limit` of them); the error's type.\"\"\"
    got = []
    error = None
    while len(got) < limit:
        try:
            got.append(torch.empty(chunk, dtype=torch.uint8, device="cuda"))
        except Exception as e:
            error = f"{type(e).__module__}.{type(e).__qualname__}", isinstance(e, torch.cuda.OutOfMemoryError)
            break
    return got, error

t0 = time.perf_counter()
big, error = fill(2 * GiB, 200)
note("first_oom", error)
small, error = fill(64 << 20, 200)                   # the last gap, 64 MiB at a time
note("second_oom", error)
note("fill_seconds", round(time.perf_counter() - t0, 2))
note("reserved_share_when_full", round(torch.cuda.memory_reserved() / free_at_start, 4))
note("num_ooms", torch.cuda.memory_stats()["num_ooms"])
segs = torch.cuda.memory._snapshot()["segments"]
note("segments_when_full", len(segs))
note("expandable", bool(segs) and all(s["is_expandable"] for s in segs))
del segs

# Free every other 2 GiB tensor; the same bytes come back as 1 GiB tensors, without running out.
freed = len(big[::2])
del big[::2]
again = []
t0 = time.perf_counter()
try:
    for _ in range(2 * freed):
        again.append(torch.empty(GiB, dtype=torch.uint8, device="cuda"))
    note("reallocated", True)
except torch.cuda.OutOfMemoryError as e:
    note("reallocated", f"OOM after {len(again)} of {2 * freed}: {str(e)[:300]}")
note("realloc_seconds", round(time.perf_counter() - t0, 2))

# Every tensor holds its own value (a 2 GiB tensor checked with min and max: no temporary of its
# size; 128 MiB freed first for the reductions' workspace). On the fake GPU, which runs no kernels,
# each tensor's first and last 64 KiB are written by copies and read back instead.
del small[-2:]
tensors = big + small + again

def stamp(t, value):
    for part in (t[:1 << 16], t[-(1 << 16):]):
        put(part, value)

def stamped(t, value):
    return all(bool((part.cpu() == value).all()) for part in (t[:1 << 16], t[-(1 << 16):]))

for i, t in enumerate(tensors):
    stamp(t, i % 251) if FAKE_GPU else t.fill_(i % 251)
torch.cuda.synchronize()
note("values_ok", all(stamped(t, i % 251) if FAKE_GPU else int(t.min()) == int(t.max()) == i % 251
                      for i, t in enumerate(tensors)))

# And once more past the end, then everything back to the driver.
more, error = fill(GiB, 50)
note("third_oom", error)
del tensors, big, small, again, more, t            # t: the loop's last tensor
gc.collect()
t0 = time.perf_counter()
torch.cuda.empty_cache()
note("empty_cache_seconds", round(time.perf_counter() - t0, 2))
note("reserved_after_empty", torch.cuda.memory_reserved())
note("free_back_share", round(torch.cuda.mem_get_info()[0] / free_at_start, 4))

# Recovered: one tensor of most of the GPU, and a computation.
t0 = time.perf_counter()
whole = torch.empty(int(free_at_start * 0.9), dtype=torch.uint8, device="cuda")
stamp(whole, 7) if FAKE_GPU else whole.fill_(7)
note("whole_ok", stamped(whole, 7) if FAKE_GPU else int(whole.min()) == int(whole.max()) == 7)
del whole
torch.cuda.empty_cache()
note("whole_seconds", round(time.perf_counter() - t0, 2))
if FAKE_GPU:
    note("works_after", host_sum(filled(1 << 20, 1.0)) == 1 << 20)
else:
    a = torch.randn(1024, 1024, device="cuda")
    note("works_after", bool(torch.allclose(a @ torch.eye(1024, device="cuda"), a)))
"""

def test_expandable_segments_fill_the_gpu_and_recover():
    check_noted("pressure", PRESSURE_CHILD, {
        "first_oom": that("torch.cuda.OutOfMemoryError", lambda v: v is not None and v[1] is True),
        "second_oom": that("torch.cuda.OutOfMemoryError", lambda v: v is not None and v[1] is True),
        "reserved_share_when_full": that("over 0.95 of the memory free at the start", lambda v: v > 0.95),
        "num_ooms": that("at least 2", lambda v: v >= 2),
        "expandable": True,
        "reallocated": True,
        "values_ok": True,
        "third_oom": that("torch.cuda.OutOfMemoryError", lambda v: v is not None and v[1] is True),
        "reserved_after_empty": 0,
        "free_back_share": that("over 0.99 of the memory free at the start", lambda v: v > 0.99),
        "whole_ok": True,
        "works_after": True,
    }, conf="expandable_segments:True", timeout=75)
