"""Planned allocation at run time: record, plan, serve; misses, divergence,
buckets, re-recording and escaping tensors. Each scenario installs torchmem
in a fresh interpreter."""
import json

from conftest import run_python

PRELUDE = """
import json, torch, torchmem
from torchmem.planned import planned, plans, shape_key, fragmentation_watch
torch.manual_seed(0)
torchmem.install()
model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 256))
def step(x):
    with torch.no_grad():
        return float(model(x).sum())
"""


def run_json(body: str) -> dict:
    proc = run_python(PRELUDE + body)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_first_step_records_then_steps_hit_the_plan_with_the_same_results():
    r = run_json(
        """
x = torch.randn(64, 256)
expected = step(x)
reports, values = [], []
for _ in range(4):
    with planned("s") as rep:
        values.append(step(x))
    reports.append([rep.phase, rep.hits, rep.misses, rep.escaped])
entry = plans()["s"]
torchmem.caching_allocator().check_invariants()
print(json.dumps({"reports": reports, "values": values, "expected": expected,
                  "height": entry.plan_height, "lb": entry.lower_bound}))
"""
    )
    assert r["reports"][0][0] == "recorded"
    for phase, hits, misses, escaped in r["reports"][1:]:
        assert phase == "planned" and hits > 0 and misses == 0 and escaped == 0
    assert all(v == r["expected"] for v in r["values"])
    assert r["lb"] <= r["height"] <= r["lb"] * 1.01 + 4096


def test_divergent_sizes_miss_safely_and_force_a_rerecord():
    r = run_json(
        """
with planned("k"):
    step(torch.randn(64, 256))
with planned("k", max_miss_ratio=0.25) as rep:
    value = step(torch.randn(80, 256))   # other sizes: every request misses
fresh = step(torch.randn(80, 256))
print(json.dumps({"hits": rep.hits, "misses": rep.misses, "rerecord": rep.rerecord, "still_planned": "k" in plans()}))
"""
    )
    assert r["misses"] > r["hits"]  # only requests whose size does not depend on the batch can hit
    assert r["rerecord"] is True and r["still_planned"] is False


def test_shape_buckets_share_a_plan():
    r = run_json(
        """
a = shape_key(torch.randn(8, 100), bucket=64)
b = shape_key(torch.randn(8, 120), bucket=64)
c = shape_key(torch.randn(8, 130), bucket=64)
print(json.dumps({"same": a == b, "different": a != c}))
"""
    )
    assert r == {"same": True, "different": True}


def test_escaping_tensor_keeps_its_bytes_and_is_never_overwritten():
    r = run_json(
        """
def leaky(x):
    with torch.no_grad():
        h = model[0](x)          # an intermediate the step would free
        out = model[2](model[1](h))
    return h, out

x = torch.randn(64, 256)
with planned("e"):
    leaky(x)
with planned("e") as rep1:
    kept, _ = leaky(x)           # `kept` escapes the step
snapshot = kept.clone()
with planned("e") as rep2:
    for _ in range(3):
        leaky(x)                 # would reuse kept's bytes if the plan ignored the escape
print(json.dumps({"escaped": rep1.escaped, "intact": bool(torch.equal(kept, snapshot)),
                  "misses2": rep2.misses}))
"""
    )
    assert r["escaped"] >= 1
    assert r["intact"] is True


def test_decorator_and_fragmentation_watch():
    r = run_json(
        """
from torchmem.planned import planned_step
@planned_step(bucket=32)
def run(x):
    return step(x)
vals = [run(torch.randn(16, 256)) for _ in range(3)]
keys = list(plans())
report = fragmentation_watch(recent_sizes=[1 << 40], factor=4.0)
print(json.dumps({"keys": len(keys), "compact": report.compact, "reason": report.reason,
                  "free": report.free_blocks, "active": report.active_blocks}))
"""
    )
    assert r["keys"] == 1
    assert r["free"] >= 0 and r["active"] >= 0


def test_planned_needs_install():
    proc = run_python(
        """
import torchmem
from torchmem.planned import planned
try:
    with planned():
        pass
except RuntimeError as e:
    print("error:", e)
"""
    )
    assert "needs torchmem.install()" in proc.stdout
