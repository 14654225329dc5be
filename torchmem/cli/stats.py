"""`torchmem stats`: totals of a memory snapshot, as torch.cuda._memory_viz segsum counts them."""
from __future__ import annotations

import argparse
import json

from torchmem.formats.annotations import as_json, format_notes
from torchmem.formats.snapshot_devices import choose_device, device_segments
from torchmem.formats.snapshot_format import load
from torchmem.viz.totals import format_totals, totals


def run(args: argparse.Namespace) -> int:
    snapshot = load(args.snapshot)
    choice = choose_device(snapshot, args.device, args.snapshot)
    t = totals({"segments": device_segments(snapshot, choice.device)})
    if args.json:
        print(json.dumps(dict(t, device=choice.device, device_choice=choice.describe(),
                              **as_json(snapshot, choice.device)), indent=2))
    else:
        print(format_totals(t, f"{args.snapshot}, {choice.describe()}"))
        notes = format_notes(snapshot, choice.device)
        if notes:
            print(notes)
    return 0
