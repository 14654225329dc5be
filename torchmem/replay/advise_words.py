"""Advise's table and the words under it: what its columns mean, and the verdict lines that compare its rows.

`torchmem advise` (cli/advise.py) and preflight's report (preflight/report.py) print both.
"""
from __future__ import annotations

from torchmem.pytorch_env import conf_items
from torchmem.replay.advise import SEGMENT_AGE_RULE, as_pytorch_setting
from torchmem.sizes import fmt_size

COLUMNS = ("  needs: the least device memory with which the trace completes under that setting (it completes there "
           "and fails 2 MiB below); peak reserved: the most the allocator held from the device, replayed on "
           "{reference} (on its 'needs' when it does not complete there); at {reference}: whether it completes "
           "on the reference capacity.")


AGE_RULE = ("  Every PyTorch setting was replayed with the tie rule of the snapshot's release (torch 2.13 and "
            "later): among free blocks of one size, the one whose segment was allocated first.")
ADDRESS_RULE = ("  Every PyTorch setting was replayed with the tie rule of torch 2.11 and earlier: among free blocks "
                "of one size, the lowest address (assumed: the trace records no max_cached_size, which torch "
                "2.13 and later write into a snapshot's settings).")


def table(rows: list) -> list[str]:
    """Advise's rows, indented, their labels in one column as wide as the longest (at least 66); then, once,
    the tie rule the replay took for the snapshot's release, which the rows leave out (advise.shown_setting)."""
    width = max([66] + [len(r.label) for r in rows])
    lines = ["  " + r.summary(width) for r in rows]
    rule = tie_rule([r for r in rows if r.policy == "native"])
    return lines + ([rule] if rule else [])


def tie_rule(native: list) -> str | None:
    """The line that names the tie rule every PyTorch row was replayed with: torch 2.13+'s, which the snapshot's
    settings imply, or the earlier releases' by address, which the replay assumes where they do not. None where
    the rows differ, or a row's own reuse_order (torchmem's CPU setting) shows in it."""
    orders = {next((item for item in conf_items(r.conf) if item.startswith("reuse_order:")), None) for r in native}
    if orders == {SEGMENT_AGE_RULE}:
        return AGE_RULE
    if orders == {None}:
        return ADDRESS_RULE
    return None


def verdict(rows: list) -> list[str]:
    """The lines under advise's table; they name the rows they compare, so they agree with the table."""
    lines = []
    reference = rows[0].capacity
    baseline = next((r for r in rows if r.recorded), None)
    what = "the run's own setting"
    if baseline is None:  # a trace without settings: compare with PyTorch's defaults
        baseline, what = next((r for r in rows if not r.conf), None), "PyTorch's defaults"
    native = [r for r in rows if r.policy == "native"]  # what PYTORCH_CUDA_ALLOC_CONF can say
    best = native[0] if native else None
    stitched = next((r for r in rows if r.policy == "stitch"), None)
    base_need = "never completes" if baseline is None or baseline.min_capacity is None else f"needs {fmt_size(baseline.min_capacity)}"
    if best is not None and best.min_capacity is not None and best is not baseline and baseline is not None and (
            baseline.min_capacity is None or best.min_capacity < baseline.min_capacity):
        saved = "" if baseline.min_capacity is None else f", {fmt_size(baseline.min_capacity - best.min_capacity)} less than {what}"
        lines.append(f"Best PyTorch setting: PYTORCH_CUDA_ALLOC_CONF={as_pytorch_setting(best.conf)} needs {fmt_size(best.min_capacity)}{saved} "
                     f"({base_need}).")
        if best.peak_reserved > baseline.peak_reserved:
            why = (" (max_split_size_mb: a cached block above the limit is not split for a smaller request)"
                   if "max_split_size_mb" in best.conf else "")
            lines.append(f"  Its peak reserved ({fmt_size(best.peak_reserved)}) is above {what}'s "
                         f"({fmt_size(baseline.peak_reserved)}) on {fmt_size(reference)}: while the card has room, "
                         f"the allocator takes a new segment rather than release its cache, and under this setting "
                         f"cached blocks serve fewer requests{why}, so it holds more there; on a smaller card a "
                         f"refused segment makes it release its cache and retry, and it completes in "
                         f"{fmt_size(best.min_capacity)}.")
    elif baseline is not None:
        lines.append(f"No PyTorch setting tried needs less memory than {what} ({base_need}).")
    if stitched is not None and stitched.min_capacity is not None:
        reference_row = best if best is not None and best.min_capacity is not None else None
        versus = "" if reference_row is None else (
            f", {fmt_size(reference_row.min_capacity - stitched.min_capacity)} less than the best PyTorch setting"
            if stitched.min_capacity < reference_row.min_capacity else ", no less than the best PyTorch setting")
        lines.append(f"With torchmem installed: TORCHMEM_ALLOC_CONF={stitched.conf} needs {fmt_size(stitched.min_capacity)}"
                     f"{versus} (docs/stitch.md).")
    guessed = [(r.guessed_at, r.guess) for r in rows if r.guessed_at is not None]
    if guessed:
        entry, what = min(guessed)
        lines.append(f"Rows marked [guess] rest on a choice the snapshot cannot settle, first at entry {entry}: {what}.")
    first = rows[0]
    if not any(r.completes for r in rows) and first.min_capacity is not None:
        lines.append(f"None completes on {fmt_size(reference)}: the least any needs is {fmt_size(first.min_capacity)} "
                     f"({fmt_size(first.min_capacity - reference)} more). Less must be live at the peak "
                     "(a smaller batch, activation checkpointing), or the card must be larger.")
    return lines
