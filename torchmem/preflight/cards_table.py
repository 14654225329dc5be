"""Which cards of the catalog fit a preflight's run, from its one recorded trace (docs/preflight.md).

The trace advise read is replayed under the run's own setting at each card's
allocator capacity: its total_memory less the memory outside the allocator
(torchmem/fakegpu/cards.py). A card fits when the replay completes there;
its headroom is that capacity less the replay's peak reserved. Where it does
not fit, the setting shown is advise's best one that needs no more than
that capacity: a PyTorch setting when one does, else torchmem's policy.

Marks:
- "the run's card": the card the script ran on;
- "guess": the replay chose between start segments whose ages the snapshot
  lacks, or the setting's advise row rests on such a choice;
- "sized itself": any other card, when the script read the card's size
  (Note [The script sized itself] in hook.py): on that card it may allocate
  otherwise.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from torchmem.fakegpu.cards import CARDS
from torchmem.replay import replay
from torchmem.replay.advise import as_pytorch_setting
from torchmem.sizes import fmt_size

if TYPE_CHECKING:
    from torchmem.fakegpu import Card


@dataclass(frozen=True)
class CardFit:
    """One catalog card against the run's trace."""

    key: str
    memory: int               # the card's total_memory
    usable: int               # what PyTorch's allocator can get on it (less a search's margin)
    fits: bool                # the run's setting completes at `usable`
    peak_reserved: int        # the replay's, at `usable` (at the OOM when it does not fit)
    setting: str | None       # where it does not fit: the best setting that does, None when none does
    marks: tuple[str, ...] = field(default=())

    @property
    def headroom(self) -> int:
        return self.usable - self.peak_reserved

    def to_json(self) -> dict[str, Any]:
        return {**self.__dict__, "marks": list(self.marks), "headroom": self.headroom}


def capacity_of(card: "Card", margin: float = 0.0) -> int:
    """What the allocator may take on `card`, less `margin` of its total_memory, down to the 2 MiB grid."""
    grid = 2 << 20
    return max(grid, (card.usable - int(margin * card.memory)) // grid * grid if margin else card.usable)


def card_arg(memory: int) -> str:
    """A --card value for a size: 80GiB, 512MiB, or bytes."""
    for unit, shift in (("GiB", 30), ("MiB", 20)):
        if memory % (1 << shift) == 0:
            return f"{memory >> shift}{unit}"
    return f"{memory}B"


def card_label(card: "Card") -> str:
    """A card's catalog name, or its size as --card takes it."""
    return card.key or card_arg(card.memory)


def card_fits(trace: Any, run_card: "Card", advice: list[Any] | None, sized: bool,
              cards: list["Card"] | None = None, margin: float = 0.0) -> list[CardFit]:
    """Each card (default: the catalog's), smallest first, against `trace` (a torchmem Trace) replayed under its
    own setting at the card's allocator capacity less `margin` of its memory (capacity_of)."""

    rows = []
    for card in sorted(CARDS.values() if cards is None else cards, key=lambda c: (c.memory, c.key or "")):
        capacity = capacity_of(card, margin)
        result = replay(trace, capacity=capacity)
        mine = card.key == run_card.key if card.key else card.memory == run_card.memory and not run_card.key
        marks = ["the run's card"] if mine else ["sized itself"] if sized else []
        guessed = result.start_age_guesses > 0
        setting = None
        if not result.completed:
            fitting = [a for a in advice or () if a.min_capacity is not None and a.min_capacity <= capacity]
            best = next((a for a in fitting if a.policy == "native"), fitting[0] if fitting else None)
            if best is not None:
                setting = as_pytorch_setting(best.conf) or "(defaults)"
                setting += " [torchmem]" if best.policy == "stitch" else ""
                guessed = guessed or best.guessed_at is not None
        if guessed:
            marks.append("guess")
        rows.append(CardFit(card_label(card), card.memory, capacity, result.completed,
                            result.peak_reserved, setting, tuple(marks)))
    return rows


def format_cards(rows: list[CardFit], process: str, device: int) -> list[str]:
    """The report's last section: one line per card."""

    lines = [f"The catalog's cards, from {process} device {device}'s trace replayed under the run's setting at "
             "each card's allocator capacity (total less the memory outside the allocator):"]
    width = max(len(r.key) for r in rows)
    for r in rows:
        if r.fits:
            outcome = f"fits, peak reserved {fmt_size(r.peak_reserved)}, headroom {fmt_size(r.headroom)}"
        else:
            fix = f"; fits with {r.setting}" if r.setting else "; no setting advise tried fits"
            outcome = f"does NOT fit{fix}"
        marks = f" [{', '.join(r.marks)}]" if r.marks else ""
        lines.append(f"  {r.key:<{width}} {fmt_size(r.memory):>10} (allocator {fmt_size(r.usable):>10}): "
                     f"{outcome}{marks}")
    if any("sized itself" in r.marks for r in rows):
        lines.append("  sized itself: the script read the card's size (mem_get_info or get_device_properties), so "
                     "on that card it may allocate otherwise.")
    lines.append("  Each row assumes the script allocates on that card as it did here. Libraries that size buffers by "
                 "compute capability may not.")
    if any("guess" in r.marks for r in rows):
        lines.append("  guess: the replay chose between segments whose ages the snapshot lacks.")
    return lines
