"""The C++ JSON-lines reader (csrc/core/traces/jsonl_reader.h, _core.JsonlReader) against
the Python reader it replaced: json.loads of each line, then traces._parse_event.

Every file is read both ways and must give the same events, or the same error
message for the same line.
"""
from __future__ import annotations

import io
import json
import random
import sys

import numpy as np
import pytest

from torchmem import _core

from torchmem.formats import trace_types, traces
from torchmem.replay.trace_files import load_trace
from torchmem import replay as sim

ALLOC_LINE = b'{"op": "alloc", "id": 1, "size": 4096, "stream": 0}\n'

# CPython 3.13 renamed two JSONDecodeError messages; the reader keeps the
# 3.11/3.12 wording.
RENAMED_IN_3_13 = {
    "Illegal trailing comma before end of object": "Expecting property name enclosed in double quotes",
    "Illegal trailing comma before end of array": "Expecting value",
}


def reference(data: bytes) -> tuple[list[list[int]], str | None]:
    """Events and error message as the Python reader gave them (json.loads + _parse_event)."""
    columns: list[list[int]] = [[], [], [], []]
    for lineno, line in enumerate(io.BytesIO(data), 1):
        if not line.strip():
            continue
        try:
            event = json.loads(line)
        except json.JSONDecodeError as exc:
            return columns, f"line {lineno}: not JSON ({RENAMED_IN_3_13.get(exc.msg, exc.msg)}); truncated file?"
        except UnicodeDecodeError:
            return columns, f"line {lineno}: not UTF-8 text"
        try:
            parsed = traces._parse_event(event, f"line {lineno}")
        except trace_types.TraceError as exc:
            return columns, str(exc)
        for column, value in zip(columns, parsed):
            column.append(value)
    return columns, None


def read_cpp(path, buffer_bytes: int | None = None, max_events=(trace_types.CHUNK,)):
    """Events and error message from _core.JsonlReader, reading max_events in turn."""
    reader = _core.JsonlReader(str(path)) if buffer_bytes is None else _core.JsonlReader(str(path), buffer_bytes)
    columns: list[list[int]] = [[], [], [], []]
    for call in range(10**9):
        try:
            got = reader.read(max_events[call % len(max_events)])
        except ValueError as exc:
            return columns, str(exc)
        assert [a.dtype for a in got] == [np.uint8, np.uint64, np.uint64, np.uint64]
        assert len({len(a) for a in got}) == 1
        if not len(got[0]):
            return columns, None
        for column, array in zip(columns, got):
            column.extend(array.tolist())


def assert_same(path, data: bytes, **kw) -> tuple[list[list[int]], str | None]:
    want_columns, want_error = reference(data)
    got_columns, got_error = read_cpp(path, **kw)
    assert got_error == want_error, data[:300]
    if want_error is None:
        assert got_columns == want_columns
    else:  # the events of the calls before the bad line's
        assert all(g == w[: len(g)] for g, w in zip(got_columns, want_columns))
    return got_columns, got_error


def check(tmp_path, data: bytes, name: str = "t.jsonl", **kw):
    path = tmp_path / name
    path.write_bytes(data)
    return assert_same(path, data, **kw)


# ---------------------------------------------------------------------------
# Random valid files

TEXT_CHARS = ['a', 'Z', ' ', '"', "'", '\\', '/', '\n', '\r', '\t', '\x00', '\x1f', '\x7f', '\x85', '\xa0', 'é',
              '€', '中', '\U0001d11e', '\ud800', '\udc00', '{', '}', '[', ']', ',', ':']


def random_text(rng: random.Random) -> str:
    return "".join(rng.choice(TEXT_CHARS) for _ in range(rng.randint(0, 8)))


def random_value(rng: random.Random, depth: int = 0):
    kind = rng.choice(["int", "float", "str", "const"] + (["list", "dict"] if depth < 4 else []))
    if kind == "int":
        return rng.choice([0, -1, 7, 2**64, -(2**70), rng.randint(-10**30, 10**30)])
    if kind == "float":
        return rng.choice([0.5, -0.0, 1e300, 1e-300, 4096.0, float("nan"), float("inf"), -float("inf"), rng.random()])
    if kind == "str":
        return random_text(rng)
    if kind == "const":
        return rng.choice([True, False, None])
    if kind == "list":
        return [random_value(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    return {random_text(rng): random_value(rng, depth + 1) for _ in range(rng.randint(0, 4))}


def spaces(rng: random.Random) -> str:
    return rng.choice(["", "", " ", "  ", "\t", "\r", " \t "])


def json_text(rng: random.Random, value) -> str:
    return json.dumps(value, ensure_ascii=rng.random() < 0.5, separators=(rng.choice([",", ", "]), rng.choice([":", ": "])))


def key_text(rng: random.Random, key: str) -> str:
    """The key, sometimes with its letters written as \\u escapes."""
    if rng.random() < 0.8:
        return json.dumps(key)
    return '"' + "".join(f"\\u{ord(c):04x}" if rng.random() < 0.5 else c for c in key) + '"'


def integer_text(rng: random.Random, value: int) -> str:
    return "-0" if value == 0 and rng.random() < 0.2 else str(value)


def random_event_line(rng: random.Random) -> str:
    op = rng.choice(["alloc", "free"])
    id_ = rng.choice([0, 1, 2**64 - 1, rng.randrange(2**64), rng.randrange(1000)])
    members = [(key_text(rng, "op"), json.dumps(op)), (key_text(rng, "id"), integer_text(rng, id_))]
    if op == "alloc" or rng.random() < 0.3:
        size = rng.choice([1, 512, 2**64 - 1, rng.randrange(1, 2**40)])
        members.append((key_text(rng, "size"), integer_text(rng, size)))
    if rng.random() < 0.6:
        members.append((key_text(rng, "stream"), integer_text(rng, rng.choice([0, 1, 2**63, rng.randrange(2**64)]))))
    for _ in range(rng.randint(0, 3)):  # other keys, anywhere
        members.insert(rng.randint(0, len(members)), (json.dumps(random_text(rng)), json_text(rng, random_value(rng))))
    if rng.random() < 0.2:  # a key given twice: the last one counts
        key, _ = rng.choice(members[:2])
        members.insert(0, (key, json_text(rng, random_value(rng))))
    body = ",".join(f"{spaces(rng)}{k}{spaces(rng)}:{spaces(rng)}{v}{spaces(rng)}" for k, v in members)
    return spaces(rng) + "{" + body + "}" + spaces(rng)


def random_file(rng: random.Random, lines: int) -> bytes:
    out = []
    for _ in range(lines):
        if rng.random() < 0.1:
            out.append(rng.choice(["", " ", "\t", "\r", "\x0b", "\x0c", "  \r"]))
        out.append(("\ufeff" if rng.random() < 0.02 else "") + random_event_line(rng))
    newline = rng.choice(["\n", "\r\n"])
    text = newline.join(out) + rng.choice([newline, ""])
    return text.encode("utf-8", "surrogatepass")


@pytest.mark.parametrize("seed", range(40))
def test_random_valid_files_read_as_json_loads_reads_them(tmp_path, seed):
    rng = random.Random(seed)
    data = random_file(rng, rng.choice([1, 5, 50, 400]))
    columns, error = check(tmp_path, data, max_events=(rng.choice([1, 3, 64, trace_types.CHUNK]),))
    assert error is None and len(columns[0]) > 0


def test_every_buffer_size_splits_lines_everywhere(tmp_path):
    data = random_file(random.Random(7), 30)
    path = tmp_path / "t.jsonl"
    path.write_bytes(data)
    for buffer_bytes in range(1, 2 * max(len(line) for line in data.split(b"\n")) + 2):
        assert_same(path, data, buffer_bytes=buffer_bytes, max_events=(1, 5, 1000))


FILLER = b'{"op": "free", "id": 5}\n'
TARGETS = [
    b'{"op": "alloc", "id": 18446744073709551615, "size": 123456, "stream": 3}\n',
    b'{"x": ["\\"}\\\\", {"y": null}], "\\u006fp": "alloc", "id": 9, "size": 1}\r\n',
    b'{"op": "alloc", "id": 9, "note": "\xc3\xa9\xe2\x82\xac\xf0\x9d\x84\x9e", "size": 1}',  # the last line, no "\n"
]


@pytest.mark.parametrize("target", TARGETS, ids=["plain", "escapes-crlf", "utf8-no-final-newline"])
def test_lines_across_the_default_buffer_end_at_every_offset(tmp_path, target):
    buffer_bytes = _core.JsonlReader.DEFAULT_BUFFER_BYTES
    want_target = reference(target)[0]
    tail = FILLER if target.endswith(b"\n") else b""
    for start in range(buffer_bytes - len(target) - 2, buffer_bytes + 3):
        # one filler line made longer so that the target starts at `start`
        pad_line = b'{"op": "free", "id": 5, "pad": "' + b"x" * ((start - 35) % len(FILLER)) + b'"}\n'
        head = pad_line + FILLER * ((start - len(pad_line)) // len(FILLER))
        assert len(head) == start
        path = tmp_path / "t.jsonl"
        path.write_bytes(head + target + tail)
        columns, error = read_cpp(path)
        fillers = head.count(b"\n")
        assert error is None
        assert columns[0] == [1] * fillers + want_target[0] + ([1] if tail else [])
        assert [c[fillers] for c in columns] == [w[0] for w in want_target]


def test_lines_longer_than_the_buffer(tmp_path):
    long_value = json.dumps({"frames": [{"file": "x" * 1000, "line": i} for i in range(300)]})
    data = (f'{{"op": "alloc", "id": 1, "size": 8, "stack": {long_value}}}\n' * 3).encode() + ALLOC_LINE.replace(b"1,", b"2,")
    for buffer_bytes in (1, 16, 4096, None):
        check(tmp_path, data, buffer_bytes=buffer_bytes)


def test_load_jsonl_yields_chunks_of_chunk_events(tmp_path):
    n = 2 * trace_types.CHUNK + 5
    path = tmp_path / "t.jsonl"
    path.write_text("".join(f'{{"op": "alloc", "id": {i}, "size": {i + 1}}}\n' for i in range(n)))
    chunks = list(traces.load_jsonl(str(path)).chunks())
    assert [len(c) for c in chunks] == [trace_types.CHUNK, trace_types.CHUNK, 5]
    assert np.concatenate([c.ids for c in chunks]).tolist() == list(range(n))
    assert np.concatenate([c.sizes for c in chunks]).tolist() == list(range(1, n + 1))
    assert sim.replay(str(path), "64GiB").events == n


# ---------------------------------------------------------------------------
# Bad lines: the same message as the Python reader, word for word

BAD = [
    # not UTF-8 (whatever else is wrong with the line)
    (b'{\xff\xfe\n', "line 1: not UTF-8 text"),
    (b'{"op": "alloc", "id": 1, "size": 5, "x": "\xc0\x80"}\n', "not UTF-8"),  # overlong
    (b'{"op": "alloc", "id": 1, "size": 5, "x": "\xe0\x80\x80"}\n', "not UTF-8"),  # overlong
    (b'{"op": "alloc", "id": 1, "size": 5, "x": "\xf4\x90\x80\x80"}\n', "not UTF-8"),  # past U+10FFFF
    (b'{"op": "alloc", "id": 1, "size": 5, "x": "\xc3"}\n', "not UTF-8"),  # truncated
    (b'{"op": "alloc", "id": 1, "size": 5, "x": "\x80"}\n', "not UTF-8"),  # stray continuation
    (b'{"op": "alloc", "id": 1, "size": 5, "x": "\xf5\x80\x80\x80"}\n', "not UTF-8"),
    (b'{"op": "alloc", "id": 1, "size": 5, "x": "\xe2\x82"}\n', "not UTF-8"),
    (b'{"op": "alloc", "id": 1, "si\xff', "not UTF-8"),
    # not JSON
    (b'{"op": "alloc", "id": 1, "size"\n', "line 1: not JSON (Expecting ':' delimiter); truncated file?"),
    (ALLOC_LINE + b'{"op": "alloc", "id": 2, "si', "line 2: not JSON (Unterminated string starting at)"),
    (ALLOC_LINE + b'{"op": "alloc", "id": 2, "si\n', "line 2: not JSON (Invalid control character at)"),
    (b'{"op": "alloc" "id": 1}\n', "Expecting ',' delimiter"),
    (b'{"op": "alloc", "id": 1,}\n', "Expecting property name enclosed in double quotes"),
    (b'{"op": "alloc", "id": [1,]}\n', "Expecting value"),
    (b'{"op": "alloc", "id": [1 2]}\n', "Expecting ',' delimiter"),
    (b"{'op': 'alloc'}\n", "Expecting property name"),
    (b'{"op": "alloc", "id": 1}}\n', "Extra data"),
    (b'{"op": "alloc", "id": 1} {}\n', "Extra data"),
    (b'{"op": "alloc", "id": 01}\n', "Expecting ',' delimiter"),
    (b'{"op": "alloc", "id": 1.}\n', "Expecting ',' delimiter"),
    (b'{"op": "alloc", "id": 1e}\n', "Expecting ',' delimiter"),
    (b'{"op": "alloc", "id": 1e+}\n', "Expecting ',' delimiter"),
    (b'{"op": "alloc", "id": -}\n', "Expecting value"),
    (b'{"op": "alloc", "id": +1}\n', "Expecting value"),
    (b'{"op": "alloc", "id": .5}\n', "Expecting value"),
    (b'{"op": "alloc", "id": nul}\n', "Expecting value"),
    (b'{"op": "alloc", "id": True}\n', "Expecting value"),
    (b'{"op": "alloc", "id": -NaN}\n', "Expecting value"),
    (b'{"op": "alloc", "id": -Inf}\n', "Expecting value"),
    (b'{"op": "alloc", "id": 1, "x": "\\x"}\n', "Invalid \\escape"),
    (b'{"op": "alloc", "id": 1, "x": "\\u12G4"}\n', "Invalid \\uXXXX escape"),
    (b'{"op": "alloc", "id": 1, "x": "\\u12"}\n', "Invalid \\uXXXX escape"),
    (b'{"op": "alloc", "id": 1, "x": "\\ud800\\u12"}\n', "Invalid \\uXXXX escape"),
    (b'{"op": "alloc", "id": 1, "x": "\\u00e9', "Invalid \\uXXXX escape"),
    (b'{"op": "alloc", "id": 1, "x": "\\', "Unterminated string starting at"),
    (b'{"op": "alloc", "id": 1, "x": "\t"}\n', "Invalid control character at"),
    (b'{"op": "alloc", "id": 1, "x": "\x00"}\n', "Invalid control character at"),
    (b'{"op": "alloc", "id": 1, "x": "a\\\n', "Invalid \\escape"),
    (b'{\n', "Expecting property name enclosed in double quotes"),
    (b'{"op"\n', "Expecting ':' delimiter"),
    (b'{"op":\n', "Expecting value"),
    (b'{"op": "alloc"\n', "Expecting ',' delimiter"),
    (b'\x0c{"op": "alloc", "id": 1, "size": 4}\n', "Expecting value"),
    (b'\xef\xbb\xbf\n', "Expecting value"),
    (b'\xef\xbb\xbf\xef\xbb\xbf{}\n', "Expecting value"),
    (b'{"op": "alloc", "id": 1, "size": 4}\x0c\n', "Extra data"),
    (b'\xc2\xa0{"op": "alloc", "id": 1, "size": 4}\n', "Expecting value"),
    (b'{"op": "alloc", "id": 1, "size": 4}\r{"op": "free", "id": 1}\n', "Extra data"),
    # not an object
    (b'[1, 2]\n', 'line 1: expected an object like {"op": "alloc", "id": 1, "size": 512}, got [1, 2]'),
    (b'"alloc"\n', "got 'alloc'"),
    (b'5\n', "got 5"),
    (b'null\n', "got None"),
    (b'-0.0\n', "got -0.0"),
    (b"[" + b", ".join(b'"%d"' % i for i in range(100)) + b"]\n", "got ['0', '1',"),
    (b'[{"a": 1, "b": [true, false, null], "a": 2.5}]\n', "got [{'a': 2.5, 'b': [True, False, None]}]"),
    # op
    (b'{"op": "malloc", "id": 1, "size": 512}\n', "line 1: unknown op 'malloc' (expected 'alloc' or 'free')"),
    (b'{"id": 1, "size": 512}\n', "unknown op None"),
    (b'{"op": null, "id": 1}\n', "unknown op None"),
    (b'{"op": "Alloc", "id": 1}\n', "unknown op 'Alloc'"),
    (b'{"op": "alloc ", "id": 1}\n', "unknown op 'alloc '"),
    (b'{"op": 0, "id": 1}\n', "unknown op 0"),
    (b'{"op": true, "id": 1}\n', "unknown op True"),
    (b'{"op": ["alloc"], "id": 1}\n', "unknown op ['alloc']"),
    (b'{"op": {"alloc": 1}, "id": 1}\n', "unknown op {'alloc': 1}"),
    (b'{"op": "it\'s", "id": 1}\n', 'unknown op "it\'s"'),
    (b'{"op": "say \\"hi\\" it\'s", "id": 1}\n', "unknown op 'say \"hi\" it\\'s'"),
    (b'{"op": "\\n\\t\\r\\b\\f\\\\/\\u0000\\u007f", "id": 1}\n', "unknown op '\\n\\t\\r\\x08\\x0c\\\\/\\x00\\x7f'"),
    (b'{"op": "\xc3\xa9\xc2\x85\xc2\xa0\xc2\xad\xc3\xbf", "id": 1}\n', "unknown op '\u00e9\\x85\\xa0\\xad\u00ff'"),
    (b'{"op": "\\ud800 \xed\xb0\x80 \\ud83d\\ude00 \xf0\x9d\x84\x9e", "id": 1}\n', "unknown op '\\ud800 \\udc00 \U0001f600 \U0001d11e'"),
    (b'{"op": "alloc", "op": "malloc", "id": 1, "size": 4}\n', "unknown op 'malloc'"),
    (b'{"op": 1.5e300, "id": 1}\n', "unknown op 1.5e+300"),
    # id, size, stream
    (b'{"op": "alloc", "size": 5}\n', "line 1: bad or missing field ('id')"),
    (b'{"op": "free"}\n', "bad or missing field ('id')"),
    (b'{"op": "alloc", "id": "7", "size": 5}\n', "line 1: id must be an integer, got '7'"),
    (b'{"op": "alloc", "id": null, "size": 5}\n', "id must be an integer, got None"),
    (b'{"op": "alloc", "id": 1, "size": 4096.0}\n', "size must be an integer, got 4096.0"),
    (b'{"op": "alloc", "id": 1, "size": 1e3}\n', "size must be an integer, got 1000.0"),
    (b'{"op": "alloc", "id": 1, "size": 1E400}\n', "size must be an integer, got inf"),
    (b'{"op": "alloc", "id": 1, "size": -1e400}\n', "size must be an integer, got -inf"),
    (b'{"op": "alloc", "id": 1, "size": 1e-400}\n', "size must be an integer, got 0.0"),
    (b'{"op": "alloc", "id": 1, "size": 1e16}\n', "got 1e+16"),
    (b'{"op": "alloc", "id": 1, "size": 1e15}\n', "got 1000000000000000.0"),
    (b'{"op": "alloc", "id": 1, "size": 0.0001}\n', "got 0.0001"),
    (b'{"op": "alloc", "id": 1, "size": 0.00001}\n', "got 1e-05"),
    (b'{"op": "alloc", "id": 1, "size": 123456789012345678.5}\n', "got 1.2345678901234568e+17"),
    (b'{"op": "alloc", "id": 1, "size": 5e-324}\n', "got 5e-324"),
    (b'{"op": "alloc", "id": 1, "size": 0.1e1}\n', "got 1.0"),
    (b'{"op": "alloc", "id": 1, "size": NaN}\n', "line 1: size must be an integer, got nan"),
    (b'{"op": "alloc", "id": 1, "size": Infinity}\n', "line 1: size must be an integer, got inf"),
    (b'{"op": "alloc", "id": 1, "size": -Infinity}\n', "size must be an integer, got -inf"),
    (b'{"op": "alloc", "id": true, "size": 5}\n', "id must be an integer, got True"),
    (b'{"op": "alloc", "id": 1, "size": false}\n', "size must be an integer, got False"),
    (b'{"op": "alloc", "id": 1, "size": 5, "stream": [0]}\n', "stream must be an integer, got [0]"),
    (b'{"op": "free", "id": 1, "size": {}}\n', "size must be an integer, got {}"),
    (b'{"op": "alloc", "id": 1.5, "size": "x"}\n', "id must be an integer, got 1.5"),
    (b'{"op": "alloc", "id": 18446744073709551616, "size": 5}\n', "line 1: id, size and stream must be below 2**64"),
    (b'{"op": "alloc", "id": 1, "size": 99999999999999999999999999}\n', "below 2**64"),
    (b'{"op": "alloc", "id": -1, "size": 18446744073709551616}\n', "below 2**64"),
    (b'{"op": "alloc", "id": 1, "size": -5}\n', "line 1: id, size and stream must be non-negative"),
    (b'{"op": "alloc", "id": 1, "size": 5, "stream": -1}\n', "non-negative"),
    (b'{"op": "alloc", "id": -18446744073709551616, "size": 5}\n', "non-negative"),
    (b'{"op": "alloc", "id": 1, "size": 0}\n', "line 1: alloc of 0 bytes"),
    (b'{"op": "alloc", "id": 1}\n', "alloc of 0 bytes"),
    (b'{"op": "alloc", "id": 1, "size": -0}\n', "alloc of 0 bytes"),
    (b'{"op": "alloc", "id": 1, "size": 5, "size": 0}\n', "alloc of 0 bytes"),
    # the line number counts blank lines; earlier lines still count
    (b'\n\n \r\n' + ALLOC_LINE + b'\r\n{"op": "free"}\n', "line 6: bad or missing field"),
]


@pytest.mark.parametrize("data, fragment", BAD, ids=[f"bad-{i}" for i in range(len(BAD))])
def test_bad_lines_get_the_python_readers_message(tmp_path, data, fragment):
    columns, error = check(tmp_path, data, max_events=(1,))
    assert error is not None and fragment in error


def test_valid_lines_json_loads_accepts(tmp_path):
    lines = [
        b'{"op": "alloc", "id": 18446744073709551615, "size": 18446744073709551615, "stream": 18446744073709551615}',
        b'{"op": "free", "id": -0, "size": 0, "stream": -0}',
        b'{"op": "free", "id": 3, "size": 77}',
        b'{"op": "alloc", "size": 1.5, "size": 9, "id": "x", "id": 4}',
        b'{"\\u006f\\u0070": "\\u0061lloc", "i\\u0064": 5, "siz\\u0065": 6, "stre\\u0061m": 7}',
        b'\xef\xbb\xbf{"op": "free", "id": 8}',
        b'{"op":"free","id":9,"x":NaN,"y":-Infinity,"z":[{}, [], "\\ud800", "\xed\xa0\x80", 1e999]}',
        b' \t\r{ "op" : "free" , "id" : 10 } \t\r',
        b'{"op": "free", "id": 11, "x": "' + "é€中\U0001d11e".encode() + b'"}',
        b'{"op": "free", "id": 12, "": 0, "\\"}": "{\\"op\\": 1}"}',
        b'{"op": "free", "id": 13, "deep": ' + b"[" * 500 + b"]" * 500 + b"}",
    ]
    columns, error = check(tmp_path, b"\n".join(lines) + b"\n\x0b\x0c\n")
    assert error is None and columns[1][-1] == 13


def test_nesting_deeper_than_1000_levels_is_an_error(tmp_path):
    path = tmp_path / "deep.jsonl"
    for depth, error in [(1000, None), (1001, "line 1: not JSON (nested deeper than 1000 arrays and objects); truncated file?")]:
        path.write_bytes(b'{"op": "free", "id": 1, "x": ' + b"[" * (depth - 1) + b"]" * (depth - 1) + b"}\n")
        assert read_cpp(path)[1] == error


# Single lines mutated at random: whatever json.loads and _parse_event make
# of them, the reader must agree. (No NUL or 0xFE bytes, with which json.loads
# would try UTF-16 or UTF-32.)
MUTATIONS = list(b'{}[]",:\\ \t\r0123456789-+.eEaflorsutnNIy') + [0xC3, 0xA9, 0xED, 0xA0, 0x80, 0xFF]


@pytest.mark.parametrize("seed", range(8))
def test_mutated_lines_agree_with_json_loads(tmp_path, seed):
    rng = random.Random(1000 + seed)
    path = tmp_path / "m.jsonl"
    for _ in range(400):
        line = bytearray(random_event_line(rng).encode("utf-8", "surrogatepass"))
        for _ in range(rng.randint(1, 3)):
            i = rng.randint(0, len(line))
            action = rng.choice(["insert", "delete", "replace"])
            if action == "insert" or not line:
                line.insert(i, rng.choice(MUTATIONS))
            elif action == "delete":
                del line[min(i, len(line) - 1)]
            else:
                line[min(i, len(line) - 1)] = rng.choice(MUTATIONS)
        data = ALLOC_LINE + bytes(line) + rng.choice([b"\n", b""])
        path.write_bytes(data)
        assert_same(path, data)


# ---------------------------------------------------------------------------
# The reader's own contract


def test_after_an_error_every_read_raises_it_again(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_bytes(ALLOC_LINE * 3 + b"{oops\n" + ALLOC_LINE)
    reader = _core.JsonlReader(str(path))
    assert len(reader.read(2)[0]) == 2
    for _ in range(2):
        with pytest.raises(ValueError, match="^line 4: not JSON"):
            reader.read(2)
    assert reader.lines == 4


def test_end_of_file_and_zero_events(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_bytes(ALLOC_LINE + b"\n\n")
    reader = _core.JsonlReader(str(path))
    assert len(reader.read(0)[0]) == 0
    assert len(reader.read(5)[0]) == 1
    assert len(reader.read(5)[0]) == 0 and len(reader.read(5)[0]) == 0
    assert reader.lines == 3
    empty = tmp_path / "empty.jsonl"
    empty.write_bytes(b"")
    assert len(_core.JsonlReader(str(empty)).read(5)[0]) == 0


def test_files_that_cannot_be_read_raise_os_errors(tmp_path):
    with pytest.raises(FileNotFoundError):
        _core.JsonlReader(str(tmp_path / "missing.jsonl"))
    with pytest.raises(IsADirectoryError):
        _core.JsonlReader(str(tmp_path)).read(1)
    with pytest.raises(FileNotFoundError):
        list(traces.load_jsonl(str(tmp_path / "missing.jsonl")).chunks())


def test_trace_errors_name_the_file(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_bytes(ALLOC_LINE + b'{"op": "alloc", "id": 2, "size": 4096.0}\n')
    with pytest.raises(trace_types.TraceError) as info:
        list(load_trace(str(path)).chunks())
    assert str(info.value) == f"{path}: line 2: size must be an integer, got 4096.0"


def test_non_utf8_path(tmp_path):
    if sys.platform == "darwin":
        pytest.skip("macOS file names must be UTF-8")
    name = tmp_path.as_posix().encode() + b"/t\xff.jsonl"
    try:
        with open(name, "wb") as f:
            f.write(ALLOC_LINE)
    except OSError:
        pytest.skip("the file system refuses the name")
    path = name.decode(sys.getfilesystemencoding(), "surrogateescape")
    assert [len(c) for c in traces.load_jsonl(path).chunks()] == [1]
