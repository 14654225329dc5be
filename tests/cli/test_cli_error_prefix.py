"""Every subcommand's errors begin `torchmem COMMAND: error:`, whether argparse or the command raised them.

A subcommand's own argument may share a name with the parser's record of the subcommand (preflight's
`-- COMMAND` once replaced it, and a bad --card printed `torchmem ['--', 'true']: error: ...`)."""
from __future__ import annotations

import importlib

import pytest

from torchmem.cli import COMMANDS, main

# The least argv each command parses, after its name.
MINIMAL = {
    "demo": [],
    "replay": ["trace.pickle"],
    "advise": ["trace.pickle"],
    "ranks": ["a.pickle", "b.pickle"],
    "plan": ["buffers.csv"],
    "stats": ["s.pickle"],
    "plot": ["s.pickle", "-o", "p.png"],
    "viz": ["s.pickle", "-o", "v.html"],
    "preflight": ["--", "true"],
}

# An argument argparse refuses, for each command (preflight's REMAINDER takes unknown options as the command).
REFUSED = {name: ["--no-such-option"] + MINIMAL[name] for name in MINIMAL}
REFUSED["preflight"] = ["--devices", "many", "--", "true"]


def run(argv: list[str], capsys) -> tuple[int, str]:
    try:
        status = main(argv)
    except SystemExit as exc:  # argparse
        status = exc.code
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return status, err


def test_every_command_is_covered():
    assert sorted(MINIMAL) == sorted(COMMANDS)


@pytest.mark.parametrize("name", COMMANDS)
def test_an_error_the_command_raises_names_the_command(name, monkeypatch, capsys):
    def failing(args):
        raise ValueError("the input is bad")

    monkeypatch.setattr(importlib.import_module(f"torchmem.cli.{name}"), "run", failing)
    status, err = run([name, *MINIMAL[name]], capsys)
    assert status == 1
    assert err == f"torchmem {name}: error: the input is bad\n"


@pytest.mark.parametrize("name", COMMANDS)
def test_an_argument_argparse_refuses_names_the_command(name, capsys):
    status, err = run([name, *REFUSED[name]], capsys)
    assert status == 2
    assert err.startswith(f"torchmem {name}: error: ") and err.count("\n") == 1, err


def test_a_bad_card_names_preflight(capsys):
    status, err = run(["preflight", "--card", "huge", "--", "true"], capsys)
    assert status == 2
    assert err.startswith("torchmem preflight: error: --card: "), err
    assert err.count("\n") == 1, err
