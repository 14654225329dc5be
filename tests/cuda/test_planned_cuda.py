"""torchmem.planned() on CUDA: a step's allocations served from one region of
the caching allocator through the CUDA thread allocator.

Every scenario runs in its own interpreter with torchmem installed before CUDA
initialises; all skip without a GPU (real or fake). The model needs no cuBLAS
(elementwise products, repeats and sums, which change the width as linear
layers would), so it runs on the fake GPU too; there, where kernels write
nothing, each step also writes a mark into its intermediate by a copy, so a
reused escaped tensor would show, and outputs are compared only on a real GPU.
"""
from tests.cuda.cuda_helpers import FAKE_GPU, MiB, requires_gpu, run_json

pytestmark = requires_gpu

# An MLP-shaped inference step whose intermediates all die inside the step;
# `out` is made outside, so every allocation of the step can be planned.
SETUP = """
import threading
from torchmem.runtime.planned import plans, slab_stats, forget
torch.manual_seed(0)

class Mix(torch.nn.Module):
    def __init__(self, n_in, n_out):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(n_in))
        self.b = torch.nn.Parameter(torch.randn(n_out))
        self.n_out = n_out

    def forward(self, v):
        h = v * self.w
        h = h.repeat(1, self.n_out // h.shape[1]) if self.n_out > h.shape[1] else \\
            h.reshape(h.shape[0], self.n_out, -1).sum(-1)
        return h + self.b

model = torch.nn.Sequential(
    Mix(256, 1024), torch.nn.GELU(), Mix(1024, 1024), torch.nn.GELU(), Mix(1024, 16),
).cuda().eval()
x = torch.randn(64, 256, device="cuda")
x2 = torch.randn(64, 256, device="cuda")
out = torch.empty(64, 16, device="cuda")

def step(inp):
    with torch.no_grad():
        h = model[0](inp)
        if FAKE_GPU:
            put(h[:1], 1.0 if inp is x else 2.0)     # the fake GPU's kernels write nothing: a copy does
        out.copy_(model[1:](h))
    return h

def close(a, b):
    if FAKE_GPU:                                     # no kernels ran: only the marks are real
        return bool(torch.equal(a[:1], b[:1])) if a.shape[1] == 1024 else True
    return bool(torch.allclose(a, b, rtol=1e-4, atol=1e-5))

def reference(inp):
    h = step(inp)
    return h.cpu(), out.cpu()

ref_h, ref_out = reference(x)
ref2_h, ref2_out = reference(x2)
torch.cuda.synchronize()
"""


def test_inference_steps_are_recorded_then_served_from_the_region():
    r = run_json(
        SETUP
        + """
a0 = torch.cuda.memory_allocated()
n0 = torch.cuda.memory_stats()["allocation.all.current"]
reports, same, allocated = [], [], []
for i in range(4):
    with torchmem.planned("k", device="cuda", warmup=0) as rep:
        step(x)
    torch.cuda.synchronize()
    reports.append([rep.phase, rep.hits, rep.misses, rep.escaped, rep.rerecord])
    same.append(bool(close(out.cpu(), ref_out)))
    allocated.append(torch.cuda.memory_allocated())
stats = torch.cuda.memory_stats()
slab = slab_stats("cuda:0")
entry = plans("cuda:0")["k"]
tmcuda.caching_allocator(0).check_invariants()
r = {
    "reports": reports, "same": same, "a0": a0, "allocated": allocated,
    "region": slab["region_bytes"], "live_in_slab": slab["live_in_slab"], "slab_hits": slab["hits"],
    "height": entry.plan_height, "lower_bound": entry.lower_bound,
    "stats_allocated": stats["allocated_bytes.all.current"], "reserved": torch.cuda.memory_reserved(),
    "allocations_over_start": stats["allocation.all.current"] - n0,
}
forget("k", device="cuda:0")
r["allocated_after_forget"] = torch.cuda.memory_allocated()
r["region_after_forget"] = slab_stats("cuda:0")["region_bytes"]
tmcuda.caching_allocator(0).check_invariants()
r["default_device_stats"] = slab_stats() == slab_stats("cuda:0")
print(json.dumps(r))
"""
    )
    phases = [rep[0] for rep in r["reports"]]
    assert phases == ["recorded", "planned", "planned", "planned"], r["reports"]
    for phase, hits, misses, escaped, rerecord in r["reports"][1:]:
        assert hits > 0 and misses == 0 and escaped == 0 and not rerecord, r["reports"]
    assert r["slab_hits"] == sum(rep[1] for rep in r["reports"][1:])
    assert all(r["same"]), r["same"]
    # The region is one block of the caching allocator: PyTorch's counters include it.
    assert r["region"] == r["height"] > 0 and r["height"] >= r["lower_bound"]
    for allocated in r["allocated"]:
        assert r["region"] <= allocated - r["a0"] < r["region"] + 2 * MiB, (r["allocated"], r["a0"], r["region"])
    assert len(set(r["allocated"])) == 1
    assert r["stats_allocated"] == r["allocated"][-1] <= r["reserved"]
    assert r["allocations_over_start"] == 1 and r["live_in_slab"] == 0
    assert r["allocated_after_forget"] == r["a0"] and r["region_after_forget"] == 0
    assert r["default_device_stats"], "slab_stats() should default to the current CUDA device"


def test_a_tensor_escaping_a_planned_step_keeps_its_values():
    r = run_json(
        SETUP
        + """
with torchmem.planned("k", device="cuda", warmup=0):
    step(x)
with torchmem.planned("k", device="cuda", max_miss_ratio=1.0) as rep:
    kept = step(x)                  # an intermediate the plan frees in the step: it escapes
escaped = [rep.hits, rep.misses, rep.escaped]
snapshot = kept.cpu()
later = []
for i in range(3):                  # other inputs: reusing kept's bytes would change its values
    with torchmem.planned("k", device="cuda", max_miss_ratio=1.0) as rep:
        step(x2)
    torch.cuda.synchronize()
    later.append([rep.phase, rep.misses, bool(close(out.cpu(), ref2_out))])
r = {"escaped": escaped, "later": later, "kept_intact": bool(torch.equal(kept.cpu(), snapshot)),
     "kept_close": close(kept.cpu(), ref_h), "live_with_kept": slab_stats("cuda:0")["live_in_slab"]}
box = [kept]
del kept
freeing = threading.Thread(target=box.clear)   # frees reach the slab from any thread
freeing.start()
freeing.join()
with torchmem.planned("k", device="cuda") as rep:
    step(x)
torch.cuda.synchronize()
r["after_release"] = [rep.hits, rep.misses, rep.escaped, bool(close(out.cpu(), ref_out))]
r["live_after_release"] = slab_stats("cuda:0")["live_in_slab"]
tmcuda.caching_allocator(0).check_invariants()
print(json.dumps(r))
"""
    )
    hits, misses, escaped = r["escaped"]
    assert hits > 0 and misses == 0 and escaped == 1, r["escaped"]
    assert r["kept_intact"] is True and r["kept_close"] is True
    assert r["live_with_kept"] == 1
    for phase, misses, same in r["later"]:
        assert phase == "planned" and misses >= 1 and same, r["later"]
    hits, misses, escaped, same = r["after_release"]
    assert hits > 0 and misses == 0 and escaped == 0 and same, r["after_release"]
    assert r["live_after_release"] == 0


def test_record_stream_graph_capture_and_out_of_memory_inside_planned_steps():
    r = run_json(
        SETUP
        + """
side = torch.cuda.Stream()
with torchmem.planned("k", device="cuda", warmup=0):
    step(x)
r = {}

# A region block used on another stream is freed (to the slab) only once that stream is done.
with torchmem.planned("k", device="cuda") as rep:
    with torch.no_grad():
        h = model[0](x)
        hold(side)
        with torch.cuda.stream(side):
            h.record_stream(side)
        out.copy_(model[1:](h))
        del h
    r["pending_in_step"] = tmcuda.pending_frees(0)
r["record_stream_step"] = [rep.hits, rep.misses, rep.escaped]
torch.cuda.synchronize()
torch.empty(16, device="cuda")      # an allocation processes completed events
r["pending_after_sync"] = tmcuda.pending_frees(0)
r["live_after_sync"] = slab_stats("cuda:0")["live_in_slab"]

# A graph captured inside a planned step keeps its private pool.
gx = filled(1024, 1.0)
side.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(side):
    for _ in range(3):
        gy = gx * 2 + 1
torch.cuda.current_stream().wait_stream(side)
# What a capture allocates outside its graph's pool, which a planned step
# cannot plan: torch 2.11 makes its generator's graph state (two 8-byte
# tensors, in the main pool) at every capture, 2.14 none.
n0 = torch.cuda.memory_stats()["allocation.all.current"]
g0 = torch.cuda.CUDAGraph()
with torch.cuda.graph(g0):
    g0y = gx * 2 + 1
r["capture_outside_pool"] = torch.cuda.memory_stats()["allocation.all.current"] - n0 - 1   # less g0y
del g0, g0y
g = torch.cuda.CUDAGraph()
with torchmem.planned("k", device="cuda") as rep:
    step(x)
    with torch.cuda.graph(g):
        gy = gx * 2 + 1
r["graph_step"] = [rep.hits, rep.misses, rep.escaped]
r["pools"] = tmcuda.pool_count(0)
r["gy_in_main"] = tmcuda.caching_allocator(0).owns(gy.data_ptr())
put(gx, 3)
g.replay()
torch.cuda.synchronize()
r["replayed"] = float(gy[0])
del g, gy

# Running out of memory inside a planned step: torch.cuda.OutOfMemoryError, then steps go on.
total = torch.cuda.get_device_properties(0).total_memory
try:
    with torchmem.planned("k", device="cuda"):
        step(x)
        torch.empty(2 * total, dtype=torch.uint8, device="cuda")
    r["oom"] = None
except torch.cuda.OutOfMemoryError as e:
    r["oom"] = str(e)
r["num_ooms"] = torch.cuda.memory_stats()["num_ooms"]
with torchmem.planned("k", device="cuda") as rep:
    step(x)
torch.cuda.synchronize()
r["after_oom"] = [rep.hits, rep.misses, bool(close(out.cpu(), ref_out))]
tmcuda.caching_allocator(0).check_invariants()
print(json.dumps(r))
"""
    )
    assert r["pending_in_step"] == 1
    hits, misses, escaped = r["record_stream_step"]
    assert hits > 0 and misses == 0 and escaped == 1, r["record_stream_step"]
    assert r["pending_after_sync"] == 0 and r["live_after_sync"] == 0
    hits, misses, escaped = r["graph_step"]
    assert hits > 0 and misses == r["capture_outside_pool"] and escaped == 0, r
    assert r["capture_outside_pool"] in (0, 2), r
    assert r["pools"] == 1 and r["gy_in_main"] is False
    if not FAKE_GPU:  # computed by the replay's kernels
        assert r["replayed"] == 7.0
    assert r["oom"] is not None and r["oom"].startswith("CUDA out of memory."), r["oom"]
    assert r["num_ooms"] == 1
    hits, misses, same = r["after_oom"]
    assert hits > 0 and misses == 0 and same, r["after_oom"]
