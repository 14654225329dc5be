"""The card catalog (torchmem/fakegpu/cards.py) and preflight's verdict about the card itself (CPU tier).

A run fits when its peak reserved plus the memory outside PyTorch's
allocator stays within the card's total_memory (torchmem/preflight/verdict.py).
"""
from __future__ import annotations

import dataclasses

import pytest

from torchmem.fakegpu import cards
from torchmem.fakegpu.cards import ALIASES, CARDS, card
from torchmem.preflight import Report, verdict
from torchmem.preflight.report import format_report, warnings_for
from torchmem.sizes import parse_bytes

MiB, GiB = 1 << 20, 1 << 30

# The size each card is sold with (decimal GB), from the makers' data sheets: a card's total_memory is below it.
MARKETED_GB = {"h100-sxm": 80, "h100-pcie": 80, "h200": 141, "b200": 192, "a100-80gb": 80, "a100-40gb": 40,
               "l40s": 48, "l4": 24, "a10g": 24, "rtx4090": 24, "rtx3090": 24, "t4": 16}


def test_the_catalog_holds_the_cards_users_rent():
    assert sorted(CARDS) == sorted(MARKETED_GB)


@pytest.mark.parametrize("key", sorted(MARKETED_GB))
def test_each_card_reports_less_than_its_marketed_size_and_names_its_sources(key):
    c = CARDS[key]
    assert c.key == key
    assert 0.85 * MARKETED_GB[key] * GiB < c.memory < MARKETED_GB[key] * GiB
    major, minor = (int(part) for part in c.capability.split("."))
    assert 7 <= major <= 10 and 0 <= minor <= 9 and 40 <= c.multiprocessors <= 148
    assert c.total_source and c.outside_source.startswith("estimate: ")
    assert c.outside is not None and 100 * MiB <= c.outside <= 1 * GiB  # a CUDA context: a few hundred MiB
    assert c.usable == c.memory - c.outside


@pytest.mark.parametrize("old, key", [("h100", "h100-sxm"), ("h200", "h200"), ("a100", "a100-80gb"),
                                      ("a100-40gb", "a100-40gb"), ("l4", "l4")])
def test_the_names_earlier_releases_took_still_work(old, key):
    assert card(old) is CARDS[key]
    assert card(f"  {old.upper()} ") is CARDS[key]


def test_every_alias_names_a_catalog_card():
    assert all(target in CARDS for target in ALIASES.values())
    assert not set(ALIASES) & set(CARDS)
    assert cards.names()[:len(CARDS)] == sorted(CARDS)


def test_a_bare_size_assumes_nothing_outside_the_allocator():
    bare = card("80GiB")
    assert bare.memory == 80 * GiB and bare.outside is None and bare.key is None
    assert bare.outside_bytes == 0 and bare.usable == 80 * GiB
    assert card(24 * GiB).outside is None


@pytest.mark.parametrize("spec, size", [("80GiB", 80 << 30), ("24GB", 24 * 10**9), ("1.5GiB", 3 << 29),
                                        (" 512 MiB ", 512 << 20), ("80G", 80 << 30)])
def test_a_card_size_reads_as_every_other_size_does(spec, size):
    """One parser of sizes (torchmem.sizes.parse_bytes): a card takes what --capacity takes."""
    assert card(spec).memory == size == parse_bytes(spec)


def test_a_card_size_without_a_unit_says_which_units_it_could_be():
    with pytest.raises(ValueError, match=r"card size '80': no unit: write 80GiB .* or 80B \(bytes\), or a card: "):
        card("80")


@pytest.mark.parametrize("spec", ["h300", "", "80", "eighty GiB"])
def test_an_unknown_name_is_refused_naming_the_catalog(spec):
    with pytest.raises(ValueError, match="h100-sxm"):
        card(spec)


def test_the_verdict_counts_the_memory_outside_the_allocator():
    total, outside = 80 * GiB, 590 * MiB
    assert verdict(total - outside, outside, total).fits  # exactly full
    assert verdict(total - outside, outside, total).headroom == 0
    over = verdict(total - outside + 2 * MiB, outside, total)
    assert over.peak_reserved <= total  # the allocator's peak alone fits the card...
    assert not over.fits and over.headroom == -2 * MiB  # ...but not with the context beside it
    assert verdict(total - outside + 2 * MiB, 0, total).fits  # nothing outside: it would fit
    assert verdict(1 * GiB, outside, total).headroom == total - outside - 1 * GiB


@pytest.mark.parametrize("args", [(-1, 0, 1), (0, -1, 1), (0, 0, -1), (1.5, 0, 1), (True, 0, 1)])
def test_the_verdict_refuses_what_is_not_a_byte_count(args):
    with pytest.raises(ValueError, match="byte count"):
        verdict(*args)


def report_for(spec: str, peak_reserved: int, outside: int | None = None) -> Report:
    """A report as preflight builds it from one process's JSON (hook.py's fields), with no run."""
    chosen = card(spec)
    device = {"device": 0, "peak_allocated": peak_reserved // 2, "peak_reserved": peak_reserved,
              "total": chosen.memory, "num_ooms": 0, "num_alloc_retries": 0}
    if outside is not None:
        device["outside"] = outside
    process = {"name": "pid1", "pid": 1, "rank": None, "status": "completed", "torch": "2.14.1",
               "devices": [device], "snapshot": ""}
    return Report(["python", "train.py"], chosen, 1, None, "/tmp/out", 0, [process])


def test_a_run_whose_peak_fits_the_total_but_not_with_the_context_does_not_fit():
    l4 = CARDS["l4"]
    peak = l4.usable + 2 * MiB  # within total_memory, over it once the context is counted
    assert peak <= l4.memory
    report = report_for("l4", peak, outside=l4.outside)
    assert not report.fits
    [device] = report.devices
    assert device.verdict.headroom == -2 * MiB
    text = format_report(report)
    assert "does NOT fit, 2.00 MiB over" in text
    assert "The run does not fit" in text
    assert report.to_json()["devices"][0]["fits"] is False and report.to_json()["fits"] is False


def test_the_report_gives_the_figures_of_a_run_that_fits():
    l4 = CARDS["l4"]
    report = report_for("l4", l4.usable - 64 * MiB, outside=l4.outside)
    assert report.fits
    text = format_report(report)
    assert f"+ outside the allocator {l4.outside / MiB:.2f} MiB" in text
    assert "fits, headroom 64.00 MiB" in text
    assert "peak reserved plus the memory outside PyTorch's allocator" in text
    assert any("estimate: context 426 MiB" in w for w in warnings_for(report))  # where the figure comes from
    assert report.to_json()["card"]["outside"] == l4.outside and report.to_json()["card"]["key"] == "l4"


def test_a_process_that_did_not_say_what_it_took_is_held_to_the_cards_figure():
    l4 = CARDS["l4"]
    assert not report_for("l4", l4.usable + 2 * MiB).fits


def test_a_bare_size_says_what_it_assumes():
    report = report_for("24GiB", 24 * GiB)
    assert report.fits and report.devices[0].outside == 0
    assert any("none is assumed" in w for w in warnings_for(report))


def test_a_report_cannot_be_changed_once_built():
    report = report_for("h100", 10 * MiB)
    with pytest.raises(dataclasses.FrozenInstanceError):
        report.warnings = ["patched"]  # type: ignore[misc]
    assert report.warnings == [] and report.captured is None
