"""`torchmem advise` says what it means: one line under the table defines
its columns, and the verdict agrees with the table it follows. Run on the
figures of two real GPU snapshots (tests/data/native), through the command
line; each claim of the verdict is checked against the table's own rows."""
from __future__ import annotations

import gzip
import json
import os
import re

import pytest

from tests.support.subprocess_runner import ROOT, ok, torchmem_here
from torchmem.replay.advise import Advice
from torchmem.replay.advise_words import table

NATIVE = os.path.join(ROOT, "tests", "data", "native")
UNITS = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}
ROW = re.compile(r"^  (\S.*?)\s+needs\s+([\d.,]+ \w+|not within reach), peak reserved\s+([\d.,]+ \w+); at .*: (completes|OOM)$")


def size(text: str) -> float:
    number, unit = text.split()
    return float(number.replace(",", "")) * UNITS[unit]


def advise(fixture: str, tmp_path, *args: str) -> list[str]:
    path = tmp_path / fixture.replace(".json.gz", ".json")
    path.write_bytes(gzip.decompress(open(os.path.join(NATIVE, fixture), "rb").read()))
    return ok(torchmem_here("advise", path, "--no-progress", *args)).stdout.splitlines()


def rows_of(lines: list[str]) -> list[tuple[str, float | None, float]]:
    out = []
    for line in lines:
        m = ROW.match(line)
        if m:
            need = None if m.group(2) == "not within reach" else size(m.group(2))
            out.append((m.group(1), need, size(m.group(3))))
    return out


def test_the_columns_are_defined_under_the_table(tmp_path):
    lines = advise("nesta_gitu.json.gz", tmp_path)
    table_end = max(i for i, line in enumerate(lines) if ROW.match(line))
    assert "tie rule" in lines[table_end + 1]  # the release's rule, said once under the rows
    legend = lines[table_end + 2]
    assert legend.strip().startswith("needs: the least device memory") and "peak reserved: the most" in legend


def test_a_first_row_of_torchmems_policy_does_not_contradict_the_verdict(tmp_path):
    lines = advise("nesta_gitu.json.gz", tmp_path)
    rows = rows_of(lines)
    first, own = rows[0], next(r for r in rows if "[the run's]" in r[0])
    assert first[0].startswith("policy:stitch") and first[1] < own[1]  # the first row needs less than the run's own
    native = [r for r in rows if "[torchmem]" not in r[0]]
    assert min(r[1] for r in native if r[1] is not None) == own[1]  # ... but no PyTorch setting does
    text = "\n".join(lines)
    assert "No setting tried needs less" not in text
    assert "No PyTorch setting tried needs less memory than the run's own setting" in text
    assert re.search(r"TORCHMEM_ALLOC_CONF=policy:stitch needs [\d.]+ \w+, [\d.]+ \w+ less than the best PyTorch setting", text)


def test_a_best_setting_that_reserves_more_says_why(tmp_path):
    lines = advise("hugepandacoder.json.gz", tmp_path)
    rows = rows_of(lines)
    text = "\n".join(lines)
    m = re.search(r"Best PyTorch setting: PYTORCH_CUDA_ALLOC_CONF=(\S+) needs ([\d.]+ \w+)", text)
    assert m
    best = next(r for r in rows if r[0].split(" [")[0] == m.group(1))  # a row's name may carry marks ([guess])
    own = next(r for r in rows if "[the run's]" in r[0])
    assert best[1] == size(m.group(2)) and best[1] < own[1]  # the verdict names the table's best PyTorch row
    if best[2] > own[2]:  # it reserves more on the large card than the run's own setting: a word of why
        why = next(line for line in lines if line.strip().startswith("Its peak reserved"))
        quoted = re.search(r"Its peak reserved \(([\d.]+ \w+)\) is above .*'s \(([\d.]+ \w+)\)", why)
        assert quoted and (size(quoted.group(1)), size(quoted.group(2))) == (best[2], own[2])  # the table's figures
        assert "release its cache" in why and m.group(2) in why
    else:
        pytest.fail("expected this snapshot's best PyTorch setting to reserve more than the default on 80 GiB")


def test_the_best_setting_is_one_pytorch_takes():
    """A torch 2.13+ snapshot replays with reuse_order:segment (the replay's tie rule, not a PyTorch key):
    the verdict's PYTORCH_CUDA_ALLOC_CONF leaves it out, and PyTorch's own parser takes the rest."""
    from torchmem.replay.advise import Advice
    from torchmem.replay.advise_words import verdict

    def row(conf, need, recorded=False):
        return Advice(conf, min_capacity=need, peak_reserved=need, completes=need <= 80 * 2**30,
                      capacity=80 * 2**30, recorded=recorded)

    rows = [row("max_split_size_mb:64,reuse_order:segment", 70 * 2**30),
            row("reuse_order:segment", 85 * 2**30, recorded=True)]
    text = "\n".join(verdict(rows))
    assert "Best PyTorch setting: PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:64 needs 70" in text, text
    assert "reuse_order" not in text


def test_the_rows_keep_one_column_when_a_label_is_long(tmp_path):
    # Every row of this snapshot is marked [guess]; the collector's row makes the longest label, over 66 wide.
    lines = advise("hugepandacoder.json.gz", tmp_path)
    rows = [line for line in lines if ROW.match(line)]
    assert max(len(line.split(" needs ")[0]) for line in rows) > 2 + 66
    assert len({line.index(" needs ") for line in rows}) == 1


def _with_settings(fixture: str, tmp_path, extra: dict) -> str:
    """The fixture's snapshot with `extra` added to its allocator_settings, written to a file."""
    snap = json.loads(gzip.decompress(open(os.path.join(NATIVE, fixture), "rb").read()))
    snap["allocator_settings"] = {**snap["allocator_settings"], **extra}
    path = tmp_path / "settings.json"
    path.write_text(json.dumps(snap))
    return str(path)


def _rule_lines(lines: list[str]) -> list[str]:
    return [line for line in lines if "tie rule" in line]


def test_rows_of_a_torch_2_14_snapshot_show_only_keys_a_user_types(tmp_path):
    # torch 2.13 and later write max_cached_size into the settings: the replay ties equal blocks by segment age,
    # with its own key reuse_order:segment, which PYTORCH_CUDA_ALLOC_CONF does not take.
    path = _with_settings("hugepandacoder.json.gz", tmp_path, {"max_cached_size": -1})
    lines = ok(torchmem_here("advise", path, "--no-progress")).stdout.splitlines()
    rows = [line for line in lines if ROW.match(line)]
    assert len(rows) > 5 and not [line for line in rows if "reuse_order" in line], rows
    assert any(line.startswith("  (defaults) [the run's]") for line in rows), rows
    assert any(line.startswith("  max_split_size_mb:") for line in rows), rows
    table_end = max(i for i, line in enumerate(lines) if ROW.match(line))
    rule = _rule_lines(lines)
    assert len(rule) == 1 and "segment was allocated first" in rule[0], rule
    assert lines.index(rule[0]) == table_end + 1  # under the table, once
    assert "reuse_order" not in "\n".join(lines)


def test_a_snapshot_without_torch_2_13s_settings_says_the_address_rule_it_assumed(tmp_path):
    lines = advise("hugepandacoder.json.gz", tmp_path)  # settings of an earlier release: no max_cached_size
    rule = _rule_lines(lines)
    assert len(rule) == 1 and "the lowest address" in rule[0] and "max_cached_size" in rule[0], rule
    assert "segment was allocated first" not in "\n".join(lines)
    assert "reuse_order" not in "\n".join(lines)


def test_a_cpu_install_s_own_reuse_order_shows_in_its_rows_and_names_no_release_rule():
    rows = [Advice(conf, min_capacity=2**30, peak_reserved=2**30, completes=True, capacity=2**31)
            for conf in ("reuse_order:recent", "reuse_order:recent,max_split_size_mb:64")]
    lines = table(rows)
    assert [line.split(" needs ")[0].strip() for line in lines[:2]] == [
        "reuse_order:recent", "reuse_order:recent,max_split_size_mb:64"]
    assert not _rule_lines(lines)
