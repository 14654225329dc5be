"""The prose stays short: README.md and every doc, a median of at most 20 words a sentence
(scripts/sentence_lengths.py measures it), and the README at most 150 lines."""
from __future__ import annotations

import os
import sys

import pytest

from tests.support.subprocess_runner import ROOT

sys.path.insert(0, os.path.join(ROOT, "scripts"))
import sentence_lengths  # noqa: E402


def test_the_counter_splits_sentences_and_skips_code_and_tables():
    text = """# A heading that is not counted at all

One two three. Four five six seven: eight nine.
Version 1.5 of `torch.cuda.memory_stats()` stays one word, e.g. here!

- A list item of six words
- and another

| a table | row |
|---|---|

```
code is not prose. at all.
```
"""
    counts = [s.words for s in sentence_lengths.sentences(text)]
    assert counts == [3, 6, 9, 6, 2]


@pytest.mark.parametrize("name", sentence_lengths.default_files())
def test_median_sentence_is_at_most_20_words(name):
    with open(os.path.join(ROOT, name), encoding="utf-8") as f:
        counts = sorted(s.words for s in sentence_lengths.sentences(f.read()))
    median = (counts[(len(counts) - 1) // 2] + counts[len(counts) // 2]) / 2
    assert median <= 20, f"{name}: median sentence of {median} words (python scripts/sentence_lengths.py {name} --long 20)"


def test_readme_is_a_front_door_of_at_most_150_lines():
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        assert len(f.read().splitlines()) <= 150
