"""Derive figures-only fixtures from real snapshots for tests/replay/test_native_fixtures.py.

    python scripts/make_native_fixtures.py SNAPSHOT [SNAPSHOT ...] --out tests/data/native

Keeps what the native allocator decided and nothing of the program: per
trace entry the action, address, size, stream and device_free; per final
segment its device, address, size, stream, pool and expandability, and per
block its address, size, requested size and state; the allocator settings'
numeric fields. Drops stack frames, file names, code and timestamps.
Writes NAME.json.gz per snapshot.
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import pickle

ENTRY_KEYS = ("action", "addr", "size", "stream", "device_free")
SEGMENT_KEYS = ("device", "address", "total_size", "stream", "segment_type", "is_expandable")
BLOCK_KEYS = ("address", "size", "requested_size", "state")
SETTING_KEYS = ("max_split_size", "garbage_collection_threshold", "expandable_segments", "roundup_power2_divisions")


def figures_only(snapshot: dict) -> dict:
    settings = snapshot.get("allocator_settings")
    return {
        "segments": [
            dict({k: s[k] for k in SEGMENT_KEYS if k in s},
                 blocks=[{k: b[k] for k in BLOCK_KEYS if k in b} for b in s["blocks"]])
            for s in snapshot["segments"]
        ],
        "device_traces": [[{k: e[k] for k in ENTRY_KEYS if k in e} for e in t] for t in snapshot["device_traces"]],
        **({"allocator_settings": {k: settings[k] for k in SETTING_KEYS if k in settings}} if settings else {}),
    }


def load(path: str) -> dict:
    with open(path, "rb") as f:
        head = f.read(1)
    with open(path, "rb") as f:
        return pickle.load(f) if head == b"\x80" else json.load(f)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("snapshots", nargs="+")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    for path in args.snapshots:
        name = os.path.basename(path).split("__")[0].lower().replace("-", "_")
        out = os.path.join(args.out, name + ".json.gz")
        with gzip.open(out, "wt") as f:
            json.dump(figures_only(load(path)), f, separators=(",", ":"))
        print(f"{out}: {os.path.getsize(out):,} bytes")


if __name__ == "__main__":
    main()
