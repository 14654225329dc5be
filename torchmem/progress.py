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
