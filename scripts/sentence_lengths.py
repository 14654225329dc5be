#!/usr/bin/env python3
"""Words per sentence in the project's prose: README.md and docs/*.md.

    python scripts/sentence_lengths.py                 # a table, one row per file
    python scripts/sentence_lengths.py --max-median 20 # exit 1 if a file's median is above 20
    python scripts/sentence_lengths.py docs/cuda.md --long 30   # list that file's sentences over 30 words

What counts as prose: paragraphs and list items. Code blocks, tables,
headings, images and HTML comments are left out. A sentence ends at ".",
"!" or "?" followed by a space or the end of its paragraph, or at a colon or
semicolon that ends a line. A list item is a sentence of its own. Inline code
and links count as one word each; numbers such as "1.5" do not end a sentence.
"""
from __future__ import annotations

import argparse
import glob
import os
import re
import statistics
import sys
from dataclasses import dataclass

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_FENCE = re.compile(r"^\s*(```|~~~)")
_LIST_ITEM = re.compile(r"^\s*(?:[-*+]|\d+[.)])\s+")
_SKIP_LINE = re.compile(r"^\s*(?:#|\||!\[|<!--|-->|\s*$)")
_INLINE_CODE = re.compile(r"`[^`]*`")
_LINK = re.compile(r"\[([^\]]*)\]\([^)]*\)")
_END = re.compile(r"(?<=[.!?])[\"')\]]*\s+(?=[A-Z0-9`(\"'*_])|[:;]\s*$")
_ABBREVIATIONS = ("e.g.", "i.e.", "etc.", "vs.", "cf.", "approx.", "no.")


@dataclass(frozen=True)
class Sentence:
    line: int
    words: int
    text: str


def paragraphs(text: str) -> list[tuple[int, str]]:
    """(first line number, text) of each paragraph or list item outside code blocks and tables."""
    out: list[tuple[int, str]] = []
    current: list[str] = []
    start = 0
    fenced = False

    def flush() -> None:
        if current:
            out.append((start, " ".join(current)))
            current.clear()

    for number, line in enumerate(text.splitlines(), 1):
        if _FENCE.match(line):
            flush()
            fenced = not fenced
            continue
        if fenced or line.startswith("    ") and not current:
            continue
        if _SKIP_LINE.match(line):
            flush()
            continue
        if _LIST_ITEM.match(line):
            flush()
            line = _LIST_ITEM.sub("", line, count=1)
        if not current:
            start = number
        current.append(line.strip())
    flush()
    return out


def sentences(text: str) -> list[Sentence]:
    found: list[Sentence] = []
    for line, paragraph in paragraphs(text):
        flat = _LINK.sub(r"\1", _INLINE_CODE.sub("CODE", paragraph))
        for abbreviation in _ABBREVIATIONS:
            flat = flat.replace(abbreviation, abbreviation.replace(".", ""))
        for part in _END.split(flat):
            words = [w for w in part.split() if re.search(r"\w", w)]
            if words:
                found.append(Sentence(line, len(words), part.strip()))
    return found


def default_files() -> list[str]:
    return ["README.md", *sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "docs", "*.md")))]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="sentence_lengths", description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="*", help="markdown files (default: README.md and docs/*.md)")
    parser.add_argument("--max-median", type=float, help="exit 1 if any file's median sentence is longer")
    parser.add_argument("--long", type=int, metavar="N", help="list the sentences of more than N words")
    args = parser.parse_args(argv)
    files = args.files or default_files()
    worst = 0.0
    print(f"{'file':32} {'sentences':>9} {'median':>6} {'over 30':>7} {'longest':>7}")
    for name in files:
        path = name if os.path.isabs(name) else os.path.join(ROOT, name)
        try:
            with open(path, encoding="utf-8") as f:
                found = sentences(f.read())
        except OSError as error:
            print(f"sentence_lengths: {name}: {error.strerror}", file=sys.stderr)
            return 2
        counts = [s.words for s in found] or [0]
        median = statistics.median(counts)
        worst = max(worst, median)
        print(f"{name:32} {len(found):9d} {median:6.1f} {sum(c > 30 for c in counts):7d} {max(counts):7d}")
        if args.long is not None:
            for s in found:
                if s.words > args.long:
                    print(f"  {name}:{s.line}: {s.words} words: {s.text[:120]}")
    if args.max_median is not None and worst > args.max_median:
        print(f"sentence_lengths: a median of {worst:g} words is above {args.max_median:g}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
