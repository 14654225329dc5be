"""torchmem.cli.progress: bars on a terminal only, and the bar for work with no count (reading a big snapshot)."""
from __future__ import annotations

import io
import sys
import time

from torchmem.cli.progress import activity


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_activity_draws_the_seconds_on_a_terminal_and_clears_its_line(monkeypatch):
    import tqdm.utils

    term = Terminal()
    monkeypatch.setattr(sys, "stderr", term)
    monkeypatch.setattr(tqdm.utils, "_screen_shape_wrapper", lambda: lambda fp: (100, 40))
    with activity("reading big.pickle"):
        time.sleep(1.2)
    text = term.getvalue()
    assert "reading big.pickle: 00:00" in text and "reading big.pickle: 00:01" in text  # redrawn while it works
    assert text.endswith("\r") or text.rstrip(" ").endswith("\r")  # and gone at the end (leave=False)


def test_activity_is_silent_off_a_terminal_or_when_disabled(monkeypatch):
    term = Terminal()
    monkeypatch.setattr(sys, "stderr", term)
    with activity("reading", disable=True):
        pass
    plain = io.StringIO()
    monkeypatch.setattr(sys, "stderr", plain)
    with activity("reading"):
        pass
    assert term.getvalue() == "" and plain.getvalue() == ""
