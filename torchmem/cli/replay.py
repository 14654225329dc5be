"""`torchmem replay`: replay a trace on a simulated GPU and say what happened."""
from __future__ import annotations

import argparse
import json
import sys

from torchmem.cli import arguments
from torchmem.cli.arguments import other_devices
from torchmem.cli.progress import activity, progress_bar
from torchmem.pytorch_env import pytorch_conf
from torchmem.replay import replay
from torchmem.replay.trace_files import load_trace
from torchmem.sizes import fmt_size, size_reading
from torchmem.viz.replays import plot_replays


def describe(result, trace, path: str, given_capacity: str | None = None) -> str:
    """What was rebuilt, what was assumed, how closely the recording was followed."""
    lines = []
    rec = result.recorded
    if rec is not None:
        devices = ", ".join(f"device {d}: {n:,} entries" + (" (replayed)" if d == rec.device else "")
                            for d, n in rec.devices) or "no device has entries"
        lines.append(f"Snapshot {path}: {devices}.")
        lines.append(f"  Replayed {rec.device_choice}" + ("; replay another with --device N." if len(rec.devices) > 1 else "."))
        described = result.start.describe()
        lines.append(f"  {described[0].upper()}{described[1:]}.")
    sources = {
        "oom": "reserved at the recorded OOM plus its device_free",
        "given": "given",
        "expandable": "the largest card whose expandable ranges (9/8 of it each) fit between the recorded ones",
        "default": "the default; give --capacity for your card" + (" (the snapshot has no OOM)" if rec else ""),
    }
    read = size_reading(given_capacity) if result.capacity_source == "given" else ""
    lines.append(f"  Capacity {fmt_size(result.capacity)}: {sources[result.capacity_source]}" + (f" as {read}" if read else "") + ".")
    conf_sources = {"recorded": "the snapshot's allocator_settings", "given": "given",
                    "default": "PyTorch's defaults" + (" (the snapshot does not record its settings)" if rec else "")}
    lines.append(f"  Settings {result.conf or '(defaults)'}: {conf_sources[result.conf_source]}.")
    lines += environment_note(result.conf_source)
    f = result.fidelity
    if rec is not None and rec.entries == 0:
        others = other_devices(rec)
        if others:
            lines.append(f"  Device {rec.device} has no trace, only its final segments, rebuilt here; {others}.")
        else:
            lines.append("  The snapshot has no trace, only its final segments: record with "
                         "torch.cuda.memory._record_memory_history() before dumping to replay what happened.")
    elif f is not None:
        total = f["placements_matched"] + f["placements_differed"]
        if result.exact:
            lines.append(f"  Followed the recording exactly: all {total:,} allocations at their recorded addresses, "
                         f"{f['segments_followed']:,} new segments where the GPU put them, "
                         f"empty_cache() called {rec.empty_cache_calls} time{'s' if rec.empty_cache_calls != 1 else ''}.")
        else:
            where = f"first at trace entry {f['first_difference_entry']:,}" if f.get("first_difference_entry") is not None else ""
            lines.append(f"  Left the recording: {f['placements_matched']:,} of {total:,} allocations at their recorded "
                         f"addresses ({where}); {f['segments_missed']} recorded segment addresses not taken.")
    oom = result.recorded_oom
    if oom is not None:
        if oom["reproduced"]:
            lines.append(f"  The recorded OOM is reproduced: {fmt_size(oom['size'])} refused with {fmt_size(oom['reserved'])} reserved, "
                         "as on the GPU.")
        elif result.completed or result.fidelity and result.fidelity["failed_alloc_succeeded"] is not None:
            lines.append(f"  The recorded OOM ({fmt_size(oom['size'])} with {fmt_size(oom['reserved'])} reserved) does not happen here.")
        else:
            lines.append(f"  The recorded OOM ({fmt_size(oom['size'])}) is not reproduced as recorded.")
        ooms = result.recorded_ooms
        if len(ooms) > 1 and result.follows_recording:
            reproduced = sum(o["reproduced"] for o in ooms)
            lines.append(f"  The recording ran out of memory {len(ooms):,} times and asked for memory again after "
                         f"{len(ooms) - 1:,} of them (the program caught the error); "
                         f"{'all' if reproduced == len(ooms) else f'{reproduced:,}'} reproduced at their trace entries "
                         "with the native reserved bytes.")
    for note in result.notes:
        lines.append(f"  Note: {note}.")
    return "\n".join(lines)


def environment_note(conf_source: str) -> list[str]:
    """A line when PyTorch's settings variable is set here: the replay does not take it from the environment."""

    found = pytorch_conf()
    if found is None or conf_source == "given":
        return []
    name, value = found
    return [f"  Note: {name}={value} is set here, but a replay takes the snapshot's recorded settings or --conf, "
            f"not this environment's: --conf '{value}' replays under it."]


def run(args: argparse.Namespace) -> int:
    with activity(f"reading {args.trace}", disable=args.no_progress or args.json):
        trace = load_trace(args.trace, device=args.device, skip_bad_events=args.skip_bad_events)
    if args.device is not None and trace.start is not None and not trace.start.segments:
        # Nothing on that device at all: say where the trace is (a device with only segments replays them).
        arguments.require_trace(trace, args.trace, True, "the device has no segments either")
    confs = [args.conf] + (args.compare or [])
    results = []
    for conf in confs:
        label = conf if conf is not None else "as recorded"
        with progress_bar(trace.total, f"replay {label or 'default'}", disable=args.no_progress or args.json) as update:
            results.append(
                replay(
                    trace, args.capacity, conf, skip_bad_events=args.skip_bad_events,
                    progress=update, in_use_by_others=args.in_use_by_others,
                )
            )
    if results[0].skipped:
        print(f"warning: skipped {results[0].skipped_detail}", file=sys.stderr)
    if args.json:
        out = [r.to_json() for r in results]
        print(json.dumps(out if args.compare else out[0], indent=2))
    else:
        first = results[0]
        if trace.recorded is not None:
            print(describe(first, trace, args.trace, args.capacity))
            print()
        else:
            for note in first.notes:
                print(f"note: {note}", file=sys.stderr)
            read = size_reading(args.capacity) if args.capacity else ""
            if read:
                print(f"Capacity: {read}.")
        print(first.explain())
        if len(results) > 1:
            print()
            for r in results:
                print(r.summary())
        if not first.completed:
            print(f"\nWhich setting avoids it, and how much memory each needs: torchmem advise {args.trace}")
            if not any(r.policy == "stitch" for r in results):
                print(f"torchmem's least-memory policy on the same card: torchmem replay {args.trace} --compare policy:stitch")
    if args.plot:
        plot_replays(results, args.plot, title=args.trace)
        print(f"wrote {args.plot}", file=sys.stderr)
    return 0
