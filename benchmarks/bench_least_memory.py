"""The least memory each allocator setting needs, against the floor: the peak
of bytes requested and live at once (issue 18).

    python benchmarks/bench_least_memory.py [--traces DIR] [--only NAME ...] [--json FILE]

For each trace the smallest simulated capacity at which it completes is
found by bisection over replays on a 2 MiB grid (torchmem.replay.min_capacity,
the search `torchmem advise` runs), under PyTorch's default settings,
expandable_segments:True, max_split_size_mb:512 and torchmem's
policy:stitch, and divided by the trace's peak of requested bytes.

Traces:
- four models recorded on this machine's CPU with torchmem installed and
  its history on (`--record` makes them again; they are cached as JSON lines
  in --traces, default out/traces): GPT-2 with 6 layers trained on lengths
  that vary step by step, BERT-base inference, BERT with 6 layers trained
  (masked LM), T5-small trained;
- the demo's training trace (torchmem.replay.workloads.fragmenting_training);
- the GPU-recorded snapshots in ../shared/data/snapshots (not part of the
  project; skipped when absent), replayed from their recorded start state.

Then, under policy:stitch: device map and unmap calls (one per 2 MiB page)
per thousand allocations, at its least capacity, at 1.05x and 1.10x of it,
and at the capacity PyTorch's defaults need; the pages expandable
segments map and unmap at the same capacities, for comparison; and replay
speed (events per second) on the traces and on a synthetic stream.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

MiB = 2**20
GPT2_LENGTHS = [200, 100, 256, 96, 180, 128, 240, 110]
SNAPSHOTS = os.path.join(ROOT, "..", "shared", "data", "snapshots")
CONFS = ["", "expandable_segments:True", "max_split_size_mb:512", "policy:stitch"]
MODELS = ["gpt2_6l_train", "bert_base_infer", "bert_6l_train", "t5_small_train"]
TITLES = {
    "gpt2_6l_train": "GPT-2 6-layer training, varying lengths (CPU-recorded)",
    "bert_base_infer": "BERT-base inference (CPU-recorded)",
    "bert_6l_train": "BERT 6-layer training (CPU-recorded)",
    "t5_small_train": "T5-small training (CPU-recorded)",
    "demo": "the demo's training trace (synthetic, 11 layers)",
}

# ---------------------------------------------------------------------------
# Recording (in a subprocess: torch, torchmem.install(), history on)

RECORDER = r"""
import json, sys
import torch
import torchmem
from torchmem import _core

name, path = sys.argv[1], sys.argv[2]
torch.manual_seed(0)
torch.set_num_threads(2)
torchmem.install()
allocator = torchmem.caching_allocator()
_core.enable_history(allocator, 1 << 24)

def adamw(params):
    return torch.optim.AdamW(params, lr=1e-4)

def encoder(hidden, layers, heads, norm_first=False):
    layer = torch.nn.TransformerEncoderLayer(hidden, heads, 4 * hidden, dropout=0.0, batch_first=True, norm_first=norm_first)
    return torch.nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)

if name == "gpt2_6l_train":
    vocab, hidden = 50257, 768
    emb, body, head = torch.nn.Embedding(vocab, hidden), encoder(hidden, 6, 12, True), torch.nn.Linear(hidden, vocab, bias=False)
    opt = adamw(list(emb.parameters()) + list(body.parameters()) + list(head.parameters()))
    for seq in LENGTHS:
        ids = torch.randint(0, vocab, (4, seq))
        mask = torch.nn.Transformer.generate_square_subsequent_mask(seq)
        logits = head(body(emb(ids), mask=mask, is_causal=True))
        loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, vocab), ids[:, 1:].reshape(-1))
        loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)
        del logits, loss
elif name == "bert_base_infer":
    model = encoder(768, 12, 12).eval()
    for _ in range(3):
        x = torch.randn(32, 128, 768)
        with torch.no_grad():
            model(x).sum().item()
        del x
elif name == "bert_6l_train":
    vocab, hidden = 30522, 768
    emb, body, head = torch.nn.Embedding(vocab, hidden), encoder(hidden, 6, 12), torch.nn.Linear(hidden, vocab)
    opt = adamw(list(emb.parameters()) + list(body.parameters()) + list(head.parameters()))
    for _ in range(4):
        ids = torch.randint(0, vocab, (8, 128))
        logits = head(body(emb(ids)))
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, vocab), ids.reshape(-1))
        loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)
        del logits, loss
elif name == "t5_small_train":
    vocab, hidden = 32128, 512
    emb = torch.nn.Embedding(vocab, hidden)
    model = torch.nn.Transformer(hidden, 8, 6, 6, 2048, dropout=0.0, batch_first=True)
    head = torch.nn.Linear(hidden, vocab, bias=False)
    opt = adamw(list(emb.parameters()) + list(model.parameters()) + list(head.parameters()))
    for _ in range(4):
        src, tgt = torch.randint(0, vocab, (8, 256)), torch.randint(0, vocab, (8, 64))
        mask = torch.nn.Transformer.generate_square_subsequent_mask(64)
        logits = head(model(emb(src), emb(tgt), tgt_mask=mask, tgt_is_causal=True))
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, vocab), tgt.reshape(-1))
        loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)
        del logits, loss
else:
    raise SystemExit(f"unknown model {name}")

entries = _core.history_entries(allocator)
_core.enable_history(allocator, 0)
ids, next_id, n = {}, 0, 0
with open(path, "w") as f:
    for e in entries:
        if e["action"] == "alloc":
            ids[e["addr"]] = next_id
            f.write(json.dumps({"op": "alloc", "id": next_id, "size": e["size"], "stream": 0}) + "\n")
            next_id += 1
        elif e["action"] == "free_completed" and e["addr"] in ids:
            f.write(json.dumps({"op": "free", "id": ids.pop(e["addr"])}) + "\n")
        n += 1
print(json.dumps({"entries": n, "allocs": next_id}))
""".replace("LENGTHS", repr(GPT2_LENGTHS))


def record(name: str, path: str) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    start = time.perf_counter()
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run([sys.executable, "-c", RECORDER, name, path + ".tmp"], check=True, capture_output=True,
                         text=True, env=env, cwd=ROOT)
    os.replace(path + ".tmp", path)
    info = json.loads(out.stdout.strip().splitlines()[-1])
    print(f"recorded {name}: {info['allocs']:,} allocations in {time.perf_counter() - start:.0f} s -> {path}",
          file=sys.stderr)


def load_traces(trace_dir: str, only: list[str], rerecord: bool) -> dict:
    from torchmem.replay import workloads
    from torchmem import replay as sim

    traces = {}
    for name in MODELS:
        if only and name not in only:
            continue
        path = os.path.join(trace_dir, name + ".jsonl")
        if rerecord or not os.path.exists(path):
            record(name, path)
        traces[name] = sim.load_trace(path)
    if not only or "demo" in only:
        traces["demo"] = workloads.fragmenting_training()
    for path in sorted(glob.glob(os.path.join(SNAPSHOTS, "*"))):
        if path.endswith(".md"):
            continue
        name = os.path.basename(path).split("__")[0]
        if only and name not in only:
            continue
        traces[name] = sim.load_trace(path)
        TITLES[name] = f"GPU snapshot {os.path.basename(path).split('__')[1]} ({name})"
    return traces


# ---------------------------------------------------------------------------
# Measurements


def peak_requested(trace) -> int:
    from torchmem import replay as sim

    return sim.replay(trace, "1TiB", "").stats["requested_bytes"]["all"]["peak"]


def page_counts(trace, capacity: int, conf: str) -> dict:
    """Pages mapped and unmapped (2 MiB) and allocations, from the replay's history."""
    from torchmem import replay as sim

    r = sim.replay(trace, capacity, conf, history=1 << 22)
    hist = r.replayer.history()
    mapped = sum(e["size"] for e in hist if e["action"] == "segment_map") // (2 * MiB)
    unmapped = sum(e["size"] for e in hist if e["action"] == "segment_unmap") // (2 * MiB)
    return {"completed": r.completed, "allocations": r.allocations, "pages_mapped": mapped, "pages_unmapped": unmapped,
            "map_calls": r.counters["page_maps"] if r.counters else None,
            "unmap_calls": r.counters["page_unmaps"] if r.counters else None,
            "peak_reserved": r.peak_reserved, "seconds": r.seconds, "events": r.events}


def measure(name: str, trace) -> dict:
    from torchmem import replay as sim

    floor = peak_requested(trace)
    row: dict = {"trace": name, "title": TITLES.get(name, name), "peak_requested": floor, "min_capacity": {}, "ratio": {},
                 "search_seconds": {}}
    for conf in CONFS:
        start = time.perf_counter()
        need = sim.min_capacity(trace, conf)
        row["search_seconds"][conf] = round(time.perf_counter() - start, 2)
        row["min_capacity"][conf] = need
        row["ratio"][conf] = None if need is None else need / floor
    stitch_min = row["min_capacity"]["policy:stitch"]
    native_min = row["min_capacity"][""]
    costs = {}
    for label, capacity in (("stitch min", stitch_min), ("1.05x", _grid(stitch_min * 1.05)),
                            ("1.10x", _grid(stitch_min * 1.10)), ("default's min", native_min)):
        if capacity is None:
            continue
        costs[label] = {"capacity": capacity, "stitch": page_counts(trace, capacity, "policy:stitch"),
                        "expandable": page_counts(trace, capacity, "expandable_segments:True")}
    row["costs"] = costs
    speed = page_counts(trace, 80 << 30 if stitch_min is None else max(stitch_min, 80 << 30), "policy:stitch")
    row["events_per_s"] = speed["events"] / speed["seconds"] if speed["seconds"] else None
    return row


def _grid(n: float) -> int:
    g = 2 * MiB
    return int(-(-int(n) // g) * g)


def stream_speed(events: int, conf: str) -> dict:
    """Events per second on bench_replay.py's synthetic stream (2,000 live allocations, 512 B to 64 MiB)."""
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    import bench_replay

    out = subprocess.run([sys.executable, "-c", bench_replay.WORKER, str(events), conf], check=True,
                         capture_output=True, text=True, cwd=ROOT,
                         env=dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")))
    return json.loads(out.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------------------
# Report


def report(rows: list[dict], streams: list[dict]) -> None:
    def ratio(x):
        return "-" if x is None else f"{x:.3f}"

    print("| trace | peak requested MiB | default | expandable_segments | max_split_size_mb:512 | best PyTorch | policy:stitch |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        native = [r["ratio"][c] for c in CONFS[:3] if r["ratio"][c] is not None]
        print(f"| {r['title']} | {r['peak_requested'] / MiB:,.1f} | {ratio(r['ratio'][''])} | "
              f"{ratio(r['ratio']['expandable_segments:True'])} | {ratio(r['ratio']['max_split_size_mb:512'])} | "
              f"{ratio(min(native) if native else None)} | **{ratio(r['ratio']['policy:stitch'])}** |")
    print()
    print("Map and unmap calls under policy:stitch (one call per 2 MiB page), per 1,000 allocations; "
          "expandable segments' pages mapped / unmapped at the same capacity in brackets:")
    print()
    print("| trace | allocations | capacity | maps | unmaps | per 1k allocs (maps + unmaps) | expandable_segments pages (map + unmap) |")
    print("|---|---:|---|---:|---:|---:|---:|")
    for r in rows:
        for label, c in r["costs"].items():
            s, e = c["stitch"], c["expandable"]
            per_k = 1000 * (s["map_calls"] + s["unmap_calls"]) / max(1, s["allocations"])
            done = "" if s["completed"] else " (OOM)"
            edone = "" if e["completed"] else " (OOM)"
            print(f"| {r['trace']} | {s['allocations']:,} | {label}: {c['capacity'] / MiB:,.0f} MiB{done} | "
                  f"{s['map_calls']:,} | {s['unmap_calls']:,} | {per_k:,.0f} | "
                  f"{e['pages_mapped']:,} + {e['pages_unmapped']:,}{edone} |")
    print()
    print("| trace | events | replay events/s under policy:stitch (80 GiB) | min-capacity search s (stitch) |")
    print("|---|---:|---:|---:|")
    for r in rows:
        speed = r["events_per_s"]
        print(f"| {r['trace']} | {r['costs'].get('stitch min', {}).get('stitch', {}).get('events', 0):,} | "
              f"{'-' if speed is None else f'{speed / 1e6:.2f} M'} | {r['search_seconds']['policy:stitch']} |")
    for s in streams:
        print(f"| synthetic stream, {s['conf'] or 'default'} | {s['events']:,} | {s['events_per_s'] / 1e6:.2f} M | - |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--traces", default=os.path.join(ROOT, "out", "traces"), help="where recorded traces are cached")
    parser.add_argument("--record", action="store_true", help="record the model traces again")
    parser.add_argument("--only", nargs="+", default=[], help="trace names (gpt2_6l_train, demo, HugePandaCoder, ...)")
    parser.add_argument("--stream-events", type=int, default=2_000_000, help="synthetic stream length (0: skip)")
    parser.add_argument("--json", help="also write the figures as JSON here")
    args = parser.parse_args()
    traces = load_traces(args.traces, args.only, args.record)
    rows = []
    for name, trace in traces.items():
        start = time.perf_counter()
        rows.append(measure(name, trace))
        print(f"{name}: {time.perf_counter() - start:.1f} s", file=sys.stderr)
    streams = [stream_speed(args.stream_events, conf) for conf in ("", "policy:stitch")] if args.stream_events else []
    report(rows, streams)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "streams": streams}, f, indent=1)


if __name__ == "__main__":
    main()
