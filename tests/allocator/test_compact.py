"""torchmem.compact(): long-lived tensors repacked into one block,
values and identities kept, training continues identically, the freed
segments are returned; skipped tensors and misuse are reported clearly."""
from tests.support.subprocess_runner import run_python, run_python_json

PRELUDE = """
import json, torch, torchmem
torch.manual_seed(0)
torchmem.install()
def make():
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(512, 700), torch.nn.ReLU(), torch.nn.Linear(700, 512), torch.nn.LayerNorm(512))
    return net, torch.optim.AdamW(net.parameters(), lr=1e-2)
def train(net, opt, steps, start=0):
    losses = []
    for i in range(start, start + steps):
        x = torch.randn(16, 512, generator=torch.Generator().manual_seed(i))
        loss = net(x).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses
"""


def run_json(body: str) -> dict:
    return run_python_json(PRELUDE + body)


def test_compaction_keeps_objects_and_values_and_training_is_unchanged():
    r = run_json(
        """
ref_net, ref_opt = make()
expected = train(ref_net, ref_opt, 6)
net, opt = make()
first = train(net, opt, 2)
params = list(net.parameters())
ids = [id(p) for p in params]
values = [p.detach().clone() for p in params]
moments = [opt.state[p]["exp_avg"].clone() for p in params]
report = torchmem.compact(net, opt)
same_ids = ids == [id(p) for p in net.parameters()]
same_values = all(torch.equal(a, b) for a, b in zip(values, net.parameters()))
same_moments = all(torch.equal(m, opt.state[p]["exp_avg"]) for m, p in zip(moments, params))
storages = {p.untyped_storage().data_ptr() for p in net.parameters()}
rest = train(net, opt, 4, start=2)
torchmem.caching_allocator().check_invariants()
print(json.dumps({"same_ids": same_ids, "same_values": same_values, "same_moments": same_moments,
                  "one_block": len(storages) == 1, "losses": first + rest, "expected": expected,
                  "tensors": report.tensors, "blocks": report.blocks, "skipped": report.skipped,
                  "bytes": report.bytes, "param_bytes": sum(p.numel() * 4 for p in params)}))
"""
    )
    assert r["same_ids"] and r["same_values"] and r["same_moments"] and r["one_block"]
    assert r["losses"] == r["expected"]
    # 6 parameters; AdamW keeps step, exp_avg and exp_avg_sq for each.
    assert (r["tensors"], r["blocks"], r["skipped"]) == (6 + 18, 1, 0)
    assert r["bytes"] >= 3 * r["param_bytes"]


def test_compaction_returns_the_segments_fragmented_by_long_lived_tensors():
    r = run_json(
        """
keep, drop = [], []
for i in range(40):   # interleaved: every other 3 MiB tensor dies, leaving holes in 20 MiB segments
    (keep if i % 2 == 0 else drop).append(torch.ones(3 << 18))
del drop
torchmem.empty_cache()
before = torchmem.memory_reserved()
report = torchmem.compact(keep)
print(json.dumps({"before": before, "after": torchmem.memory_reserved(), "allocated": torchmem.memory_allocated(),
                  "report_after": report.reserved_after, "intact": all(bool((t == 1).all()) for t in keep)}))
"""
    )
    assert r["intact"]
    assert r["before"] >= 2 * r["allocated"]          # half of every segment is a hole
    assert r["after"] == r["report_after"] <= r["allocated"] + (2 << 20)


def test_shared_storage_and_other_devices_are_skipped():
    r = run_json(
        """
base = torch.ones(1000)
view = base[10:20]
lone = torch.ones(1000)
meta = torch.empty(10, device="meta")
report = torchmem.compact([base, view, lone, meta])
print(json.dumps({"tensors": report.tensors, "skipped": report.skipped,
                  "view_follows": view.untyped_storage().data_ptr() == base.untyped_storage().data_ptr()}))
"""
    )
    assert r == {"tensors": 1, "skipped": 3, "view_follows": True}


def test_misuse_is_refused():
    r = run_json(
        """
errors = []
try:
    torchmem.compact("weights")
except TypeError as e:
    errors.append(str(e))
with torchmem.planned("k"):
    try:
        torchmem.compact(torch.ones(4))
    except RuntimeError as e:
        errors.append(str(e))
print(json.dumps(errors))
"""
    )
    assert "modules, optimizers, tensors" in r[0]
    assert "between steps" in r[1]


def test_compact_needs_install():
    proc = run_python("import torch, torchmem\ntry:\n    torchmem.compact(torch.ones(2))\nexcept RuntimeError as e:\n    print(e)")
    assert "needs torchmem.install()" in proc.stdout


def test_a_block_of_1_to_10_mib_takes_a_20_mib_segment_and_the_report_says_so():
    """examples/planned_step.py's reserved 10 -> 22 MiB: the native policy serves a request of 1-10 MiB
    from a 20 MiB segment, so packing 1.5 MiB of weights into one block reserves 20 MiB for it."""
    r = run_json(
        """
net = torch.nn.Linear(768, 512)   # (768 * 512 + 512) * 4 bytes = 1.50 MiB: one request of 1-10 MiB
report = torchmem.compact(net)
seg = [s for s in torchmem.caching_allocator().segments() if s["address"] <= net.weight.data_ptr() < s["address"] + s["total_size"]]
print(json.dumps({"bytes": report.bytes, "segment_bytes": report.segment_bytes, "seg": seg[0]["total_size"],
                  "after": report.reserved_after, "text": report.explain()}))
"""
    )
    assert r["bytes"] == (768 * 512 + 512) * 4
    assert r["segment_bytes"] == r["seg"] == 20 << 20
    assert r["after"] >= 20 << 20
    assert "20 MiB segment" in r["text"] and "stays cached" in r["text"]
