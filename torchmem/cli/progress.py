"""A progress bar for long work (tqdm), silent when asked or when not on a terminal."""
from __future__ import annotations

import contextlib
import sys
from typing import Callable, Iterator


@contextlib.contextmanager
def progress_bar(total: int | None, desc: str, disable: bool = False, unit: str = "ev") -> Iterator[Callable[[int], None]]:
    """Yields update(done): report the absolute number of items done."""
    if disable or not sys.stderr.isatty():
        yield lambda done: None
        return
    from tqdm import tqdm

    with tqdm(total=total, desc=desc, unit=unit, unit_scale=unit == "ev", file=sys.stderr) as bar:
        def update(done: int) -> None:
            bar.update(done - bar.n)

        yield update


@contextlib.contextmanager
def activity(desc: str, disable: bool = False) -> Iterator[None]:
    """A bar for work with no count to report (reading a big file): the seconds it has taken so far, redrawn
    twice a second on a terminal, gone when the work ends."""
    if disable or not sys.stderr.isatty():
        yield
        return
    import threading

    from tqdm import tqdm

    done = threading.Event()
    with tqdm(total=None, desc=desc, bar_format="{desc}: {elapsed}", file=sys.stderr, leave=False) as bar:
        def redraw() -> None:
            while not done.wait(0.5):
                bar.refresh()

        thread = threading.Thread(target=redraw, daemon=True)
        thread.start()
        try:
            yield
        finally:
            done.set()
            thread.join()
