"""--search's arguments and its choice of probes (torchmem/preflight/search.py), without a GPU."""
from __future__ import annotations

import pytest

from torchmem.preflight.search import SearchError, Space, _next_values, parse_cards, parse_space, substitute


def test_a_space_is_name_low_and_high():
    assert parse_space("BATCH=1..64") == Space("BATCH", 1, 64)
    for bad in ("BATCH=64..1", "BATCH=1-64", "1=1..2", "BATCH"):
        with pytest.raises(SearchError, match="--search"):
            parse_space(bad)


def test_cards_are_catalog_names_and_sizes():
    assert [c.key for c in parse_cards("l4,h100")] == ["l4", "h100-sxm"]
    assert parse_cards("24GiB")[0].memory == 24 << 30
    assert len(parse_cards(None)) == 12
    with pytest.raises(SearchError, match="--cards"):
        parse_cards("l4,nosuchcard")


def test_the_placeholder_goes_into_arguments_else_into_the_environment():
    space = Space("B", 1, 8)
    assert substitute(["python", "t.py", "--batch={B}"], space, 4) == (["python", "t.py", "--batch=4"], {})
    assert substitute(["python", "t.py"], space, 4) == (["python", "t.py"], {"B": "4"})


def test_probes_split_each_open_interval_and_stay_inside_it():
    assert _next_values({(0, 65)}, 1) == {32}
    assert _next_values({(0, 66)}, 2) == {22, 44}  # thirds: two workers, one interval
    assert _next_values({(0, 10), (20, 30)}, 2) == {5, 25}
    assert _next_values({(3, 4)}, 4) == set()
    assert _next_values(set(), 2) == set()


def test_the_table_says_when_a_card_takes_the_top_of_the_range_or_nothing():
    from torchmem.preflight.cards_table import CardFit
    from torchmem.preflight.search import CardLimit, format_limits

    fit = CardFit("h100-sxm", 80 << 30, 79 << 30, True, 10 << 30, None)
    limits = [CardLimit("h100-sxm", 64, fit, 590 << 20, None, None),
              CardLimit("t4", None, None, 282 << 20, 1, None)]
    text = format_limits(limits, Space("B", 1, 64), 0.05, 3)
    assert "h100-sxm B=64: peak reserved 10.00 GiB + outside 590.00 MiB" in text
    assert "the top of the range: a larger B may fit too" in text
    assert "t4       none fits (not even B=1); at 1, no setting advise tried fits" in text
