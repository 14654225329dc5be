"""A preflight's answer in a screenful: per device peaks and OOMs, advise's table, the warnings."""
from __future__ import annotations

from typing import TYPE_CHECKING

from torchmem.preflight.cards_table import card_arg, format_cards
from torchmem.replay.advise import as_pytorch_setting
from torchmem.replay.advise_words import COLUMNS, table, verdict
from torchmem.sizes import fmt_size

if TYPE_CHECKING:
    from torchmem.fakegpu import Card
    from torchmem.preflight import Report

GARBAGE = ("Values computed on the device are garbage (the fake GPU skips kernels): the allocations are those of a "
           "real run where they do not depend on them.")
CUDNN = ("cuDNN is off (torch.backends.cudnn.enabled = False; the fake GPU has no cuDNN stand-in): convolutions, "
         "batch norm and RNNs take PyTorch's own CUDA kernels, whose buffers (im2col columns in slow_conv2d, for "
         "one) differ from cuDNN's workspaces, so a model with them reserves differently than on a real card.")
NCCL = ("NCCL's own buffers count outside the allocator: {size} per device. That is an estimate from NCCL's default "
        "buffer sizes and 16 channels per communicator (or NCCL's own settings), not a figure measured on a card "
        "(fakegpu/nccl/nccl.c).")
RULE = ("A run fits when its peak reserved plus the memory outside PyTorch's allocator (CUDA context, libraries) "
        "stays within the card's total_memory.")


def outside_note(card: "Card") -> str:
    """What the verdict counted outside the allocator, and where the figure comes from."""

    if card.outside is None:
        return ("A bare size has no known memory outside the allocator: none is assumed, so the whole size is "
                "PyTorch's. Name a card (--card h100, l4, ...) to count its CUDA context and libraries.")
    return (f"Outside the allocator: {fmt_size(card.outside)} taken from each device before the script ran "
            f"({card.outside_source}). A real card's figure varies with the driver, CUDA and the libraries loaded; "
            "cuDNN's modules are not counted.")


def _site_list(sites: dict[str, int], limit: int = 3) -> str:
    top = sorted(sites.items(), key=lambda kv: -kv[1])
    text = ", ".join(f"{site} ×{n}" for site, n in top[:limit])
    return text + (f", {len(top) - limit} more places" if len(top) > limit else "")


def merged_sites(processes: list[dict], key: str) -> dict[str, dict[str, int]]:
    """A per-call count of the script's lines that made it (hook.py's "reads" or "sized"), over every process."""
    out: dict[str, dict[str, int]] = {}
    for p in processes:
        for what, sites in (p.get(key) or {}).items():
            mine = out.setdefault(what, {})
            for site, n in sites.items():
                mine[site] = mine.get(site, 0) + n
    return out


def warnings_for(report: "Report") -> list[str]:
    """Where the recorded run may differ from a real one."""
    out = [GARBAGE]
    for what, sites in sorted(merged_sites(report.processes, "reads").items()):
        total = sum(sites.values())
        if what in (".item()", ".tolist()", "bool()", "int()", "float()", "index()"):
            out.append(f"{what} read a CUDA tensor {total:,} time{'s' if total != 1 else ''} ({_site_list(sites)}): "
                       "the value is garbage here; where control flow depends on it (a loss threshold, early "
                       "stopping, a while loop), this run may take another path than a real one.")
        else:
            out.append(f"{what} on a CUDA tensor {total:,} time{'s' if total != 1 else ''} ({_site_list(sites)}): its "
                       "output's size depends on garbage values here (data-dependent shapes, MoE routing counts), so "
                       "the sizes allocated after it may differ from a real run's.")
    if any(p.get("devices") for p in report.processes):
        out.append(CUDNN)
    nccl = max((d.nccl for d in report.devices), default=0)
    if nccl:
        out.append(NCCL.format(size=f"up to {fmt_size(nccl)}"))
    notes = {n for p in report.processes for n in p.get("notes", [])}
    out += sorted(notes)
    out += ended_early(report)
    out.append(outside_note(report.card))
    return out


def format_report(report: "Report") -> str:
    card = report.card
    first = report.processes[0] if report.processes else {}
    known = f" ({card.key}: total_memory {card.memory:,} bytes, {card.total_source})" if card.key else ""
    lines = [f"Preflight of `{' '.join(report.command)}` on a {fmt_size(card.memory)} card ({card.name}, compute "
             f"capability {card.capability}){known}, torch {first.get('torch', '?')}, settings "
             f"{report.conf if report.conf is not None else first.get('settings') or '(defaults)'}:"]
    for d in report.devices:
        who = f"{d.process} device {d.device}" if len(report.processes) > 1 else f"device {d.device}"
        v = d.verdict
        head = (f"  {who}: peak allocated {fmt_size(d.peak_allocated)}, peak reserved {fmt_size(d.peak_reserved)}"
                f" + outside the allocator {fmt_size(d.outside)}"
                f"{f' (NCCL {fmt_size(d.nccl)})' if d.nccl else ''} = {fmt_size(v.needed)} of {fmt_size(d.total)}")
        if d.oom is not None:
            tried = f"tried to allocate {d.oom['tried']}" if d.oom.get("tried") else "an allocation failed"
            lines.append(f"{head}: OUT OF MEMORY at {d.oom['where']}: {tried}.")
        elif not v.fits:
            lines.append(f"{head}: does NOT fit, {fmt_size(-v.headroom)} over.")
        else:
            caught = f" ({d.num_ooms} out-of-memory error{'s' if d.num_ooms != 1 else ''} caught by the script)" \
                if d.num_ooms else ""
            lines.append(f"{head}: fits, headroom {fmt_size(v.headroom)}{caught}.")
    lines += step_lines(report)
    lines.append(RULE)
    if report.fits:
        lines.append(f"The run fits the {fmt_size(card.memory)} card.")
    else:
        lines.append(f"The run does not fit the {fmt_size(card.memory)} card.")
    snapshots = sorted({d.snapshot for d in report.devices if d.snapshot})
    if snapshots:
        lines.append(f"Native snapshot{'s' if len(snapshots) > 1 else ''}: {', '.join(snapshots)} "
                     "(torchmem replay, torchmem viz, or PyTorch's memory_viz)")
    if report.advice_missing:
        lines.append(f"No advise table: {report.advice_missing}.")
    if report.advice:
        process, device = report.advised or ("?", 0)
        lines.append("")
        lines.append(f"torchmem advise ({process}, device {device}): the least memory each setting needs, to 2 MiB, "
                     f"best first, replayed on the {fmt_size(card.usable)} the allocator can get:")
        lines += table(report.advice)
        lines.append(COLUMNS.format(reference=fmt_size(card.usable)))
        lines += verdict(report.advice)
        step = next_step(report)
        if step:
            lines.append(step)
    if report.warnings:
        lines.append("")
        lines.append("How far to trust it:")
        lines += [f"  - {w}" for w in report.warnings]
    if report.cards:
        process, device = report.advised or ("?", 0)
        lines.append("")
        lines += format_cards(report.cards, process, device)
    return "\n".join(lines)


def step_lines(report: "Report") -> list[str]:
    """--steps: each counted step's peaks per device, whether the last two agree, and a run that ended early."""

    lines = []
    for p in report.processes:
        steps = p.get("steps")
        if not steps:
            continue
        done, asked = len(steps["steps"]), steps["asked"]
        who = f"{p['name']}: " if len(report.processes) > 1 else ""
        lines.append(f"  {who}{done} of {asked} optimizer step{'s' if asked != 1 else ''} asked for ran"
                     + ("; the run stopped there." if done == asked else "; the run ended before the rest."))
        devices = sorted({d for s in steps["steps"] for d in s["devices"]}, key=int)
        for d in devices:
            peaks = [s["devices"].get(d) for s in steps["steps"]]
            shown = ", ".join(f"{fmt_size(x['allocated'])} / {fmt_size(x['reserved'])}" if x else "-" for x in peaks)
            lines.append(f"    device {d}, each step's peak allocated / reserved: {shown}")
            if len(peaks) >= 2 and peaks[-1] and peaks[-2]:
                same = peaks[-1] == peaks[-2]
                lines.append(f"    device {d}: the last step's peaks {'equal' if same else 'differ from'} the one "
                             f"before{'' if same else ': memory had not settled; try more steps'}.")
    return lines


def ended_early(report: "Report") -> list[str]:
    """A warning for each process that ended before the steps asked for."""
    out = []
    for p in report.processes:
        steps = p.get("steps")
        if steps and len(steps["steps"]) < steps["asked"]:
            out.append(f"{p['name']} ended after {len(steps['steps'])} of the {steps['asked']} optimizer steps asked "
                       "for: the later steps' memory is not known.")
    return out


def next_step(report: "Report") -> str | None:
    """The preflight that would confirm advise's answer: the best PyTorch setting on this card, or a larger card."""
    import math
    import shlex

    if report.fits or not report.advice:
        return None
    command = shlex.join(report.command)
    card = report.card
    native = [r for r in report.advice if r.policy == "native" and r.min_capacity is not None]
    fitting = [r for r in native if r.completes]
    if fitting:
        conf = as_pytorch_setting(fitting[0].conf)
        return f"Confirm it: torchmem preflight --card {card_arg(card.memory)} --conf '{conf}' -- {command}"
    if native:
        need = min(r.min_capacity for r in native) + card.outside_bytes
        size = math.ceil(need / (1 << 30))
        return f"Confirm a larger card: torchmem preflight --card {size}GiB -- {command}"
    return None
