"""`torchmem preflight --search NAME=LO..HI`: the largest value of a placeholder that fits each card.

    torchmem preflight --search BATCH=1..64 --cards l4,a100-40gb,h100 -- python train.py --batch {BATCH}

Each probe runs the command once, with `{NAME}` replaced by a value in its
arguments (or, when no argument has it, the environment variable NAME set
to the value), under preflight with `--steps` (default 3), on a card larger
than any asked for. Its trace is then replayed at each card's allocator
capacity less the margin (cards_table.card_fits), so one probe answers for
every card. Each card's bisection takes the probes the others made; probes
run in parallel, up to the cores.

The bisection assumes that a value that fits a card, every smaller one fits
too. For each card the table gives the largest value that fits, the memory it
needs (peak reserved plus the memory outside the allocator), its headroom,
and advise's best setting at the next value up, with whether that fits.
"""
from __future__ import annotations

import concurrent.futures
import os
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from torchmem.fakegpu import Card, card as parse_card
from torchmem.preflight.cards_table import CardFit, capacity_of, card_fits, card_label
from torchmem.fakegpu.cards import CARDS
from torchmem.preflight import PreflightError, run_command
from torchmem.preflight.report import merged_sites
from torchmem.replay import advise, load_trace
from torchmem.replay.advise import as_pytorch_setting
from torchmem.sizes import fmt_size

PROBE_CARD = 1 << 40  # a 1 TiB fake card (compute capability 9.0): no probe runs out of memory before the trace ends


class SearchError(ValueError):
    """A --search, --cards or --margin that cannot be used, or a probe that failed for its own reasons."""


@dataclass(frozen=True)
class Space:
    """The placeholder and the values searched: {name} from lo to hi, both included."""

    name: str
    lo: int
    hi: int


def parse_space(text: str) -> Space:
    """NAME=LO..HI, e.g. BATCH=1..64."""
    found = re.fullmatch(r"([A-Za-z_][A-Za-z0-9_]*)=(\d+)\.\.(\d+)", text.strip())
    if found is None:
        raise SearchError(f"--search {text!r}: give NAME=LO..HI, e.g. BATCH=1..64")
    space = Space(found[1], int(found[2]), int(found[3]))
    if space.lo > space.hi:
        raise SearchError(f"--search {text!r}: {space.lo} is above {space.hi}")
    return space


def parse_cards(text: str | None) -> list[Card]:
    """A comma-separated list of catalog names and sizes; None: the whole catalog."""

    if text is None:
        return list(CARDS.values())
    try:
        cards = [parse_card(part.strip()) for part in text.split(",") if part.strip()]
    except (ValueError, TypeError) as exc:
        raise SearchError(f"--cards: {exc}") from None
    if not cards:
        raise SearchError("--cards: name at least one card")
    return cards


@dataclass(frozen=True)
class CardLimit:
    """One card's answer."""

    card: str
    largest: int | None          # the largest value that fits; None: not even the lowest
    fit: CardFit | None          # the largest value's row (peak reserved, headroom)
    outside: int                 # memory outside the allocator on that card
    next_value: int | None       # the value just above `largest` (None at the top of the range)
    next_setting: str | None     # advise's best setting that fits next_value on that card; None: none does

    @property
    def next_fits(self) -> bool:
        """Whether some setting advise tried fits the next value up."""
        return self.next_setting is not None

    def to_json(self) -> dict[str, Any]:
        return {"card": self.card, "largest": self.largest, "outside": self.outside,
                "fit": self.fit.to_json() if self.fit else None, "next_value": self.next_value,
                "next_setting": self.next_setting, "next_fits": self.next_fits}


@dataclass
class _Probe:
    value: int
    trace: Any
    fits: dict[str, CardFit]
    seconds: float


def substitute(command: Sequence[str], space: Space, value: int) -> tuple[list[str], dict[str, str]]:
    """The command with {NAME} replaced, and the environment variables to add (NAME, when no argument has it)."""
    mark = "{" + space.name + "}"
    if any(mark in part for part in command):
        return [part.replace(mark, str(value)) for part in command], {}
    return list(command), {space.name: str(value)}


def search(command: Sequence[str], space: Space, cards: list[Card], *, margin: float = 0.05, steps: int = 3,
           out: str | os.PathLike[str], env: Mapping[str, str] | None = None, conf: str | None = None,
           jobs: int | None = None, progress: Callable[[str], None] | None = None) -> list[CardLimit]:
    """Each card's largest value of `space` that fits, with `margin` of its memory left free."""
    if not 0 <= margin < 1:
        raise SearchError(f"--margin must be at least 0 and below 1, not {margin}")
    probes: dict[int, _Probe] = {}
    folder = Path(out)
    say = progress or (lambda line: print(line, file=sys.stderr, flush=True))
    workers = jobs or max(1, os.cpu_count() or 1)

    def probe(value: int) -> _Probe:
        return _run_probe(command, space, value, cards, margin, steps, folder / f"{space.name}={value}", env, conf)

    bounds = {card_label(c): [space.lo - 1, space.hi + 1] for c in cards}  # fits at lo, fails at hi (sentinels)
    with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool:
        while True:
            wanted = _next_values({(lo, hi) for lo, hi in bounds.values() if hi - lo > 1}, workers) - set(probes)
            if not wanted:
                break
            wanted = sorted(wanted)
            for done in pool.map(probe, wanted[:workers]):
                probes[done.value] = done
                fitting = sum(f.fits for f in done.fits.values())
                say(f"torchmem preflight: {space.name}={done.value} fits {fitting} of {len(cards)} cards "
                    f"({done.seconds:.1f} s)")
            for key, b in bounds.items():  # the largest value seen to fit, the smallest seen not to
                b[0] = max([b[0]] + [v for v, done in probes.items() if done.fits[key].fits and v < b[1]])
                b[1] = min([b[1]] + [v for v, done in probes.items() if not done.fits[key].fits and v > b[0]])
    return [_limit(c, bounds[card_label(c)][0], probes, space, margin) for c in cards]


def _next_values(open_intervals: set[tuple[int, int]], workers: int) -> set[int]:
    """The values to probe next: points that split each open interval evenly, as many per interval as the
    workers allow (one: its midpoint)."""
    if not open_intervals:
        return set()
    parts = max(2, workers // len(open_intervals) + 1)
    values = {lo + (hi - lo) * i // parts for lo, hi in open_intervals for i in range(1, parts)}
    return {v for v in values if any(lo < v < hi for lo, hi in open_intervals)}


def _run_probe(command: Sequence[str], space: Space, value: int, cards: list[Card], margin: float, steps: int,
               out: Path, env: Mapping[str, str] | None, conf: str | None) -> _Probe:
    argv, extra = substitute(command, space, value)
    started = time.monotonic()
    try:
        report = run_command(argv, PROBE_CARD, out=out, advise=False, capture_output=True, steps=steps, conf=conf,
                             env={**(env if env is not None else os.environ), **extra}, card_table=False)
    except PreflightError as exc:
        raise SearchError(f"{space.name}={value}: {exc}") from None
    if report.advised is None:
        raise SearchError(f"{space.name}={value}: {report.advice_missing or 'no trace to replay'}")
    process, device = report.advised
    [chosen] = [d for d in report.devices if (d.process, d.device) == (process, device)]
    trace = load_trace(chosen.snapshot, device=device)
    rows = card_fits(trace, parse_card(PROBE_CARD), None, bool(merged_sites(report.processes, "sized")), cards, margin)
    fits = {r.key: r for r in rows}
    if report.ooms:  # the probe itself ran out: no card fits this value
        fits = {k: CardFit(r.key, r.memory, r.usable, False, r.peak_reserved, None, r.marks) for k, r in fits.items()}
    return _Probe(value, trace, fits, time.monotonic() - started)


def _limit(card: Card, largest: int, probes: dict[int, _Probe], space: Space, margin: float) -> CardLimit:
    key = card_label(card)
    found = largest if largest >= space.lo else None
    next_value = largest + 1 if largest < space.hi else None  # probed: the bisection ended between the two
    setting = None
    if next_value is not None and next_value in probes:
        rows = advise(probes[next_value].trace, capacity_of(card, margin))
        best = next((r for r in rows if r.completes and r.policy == "native"),
                    next((r for r in rows if r.completes), None))
        if best is not None:
            setting = (as_pytorch_setting(best.conf) or "(defaults)") + (" [torchmem]" if best.policy == "stitch" else "")
    return CardLimit(key, found, probes[found].fits[key] if found is not None else None, card.outside_bytes,
                     next_value, setting)


def format_limits(limits: list[CardLimit], space: Space, margin: float, steps: int) -> str:
    """The search's table, one card per line."""

    lines = [f"The largest {space.name} in {space.lo}..{space.hi} that fits each card, with {margin:.0%} of the card "
             f"left free, over the first {steps} optimizer step{'s' if steps != 1 else ''}:"]
    width = max(len(limit.card) for limit in limits)
    for limit in limits:
        if limit.largest is None:
            head = f"none fits (not even {space.name}={space.lo})"
        else:
            f = limit.fit
            head = (f"{space.name}={limit.largest}: peak reserved {fmt_size(f.peak_reserved)} + outside "
                    f"{fmt_size(limit.outside)} = {fmt_size(f.peak_reserved + limit.outside)}, headroom "
                    f"{fmt_size(f.headroom)}")
        if limit.next_value is not None:
            head += (f"; at {limit.next_value}, {limit.next_setting} fits" if limit.next_fits else
                     f"; at {limit.next_value}, no setting advise tried fits")
        elif limit.largest is not None:
            head += f"; the top of the range: a larger {space.name} may fit too"
        lines.append(f"  {limit.card:<{width}} {head}")
    lines.append("Confirm a row: torchmem preflight --card CARD --conf SETTING -- COMMAND, with the value in place.")
    return "\n".join(lines)
