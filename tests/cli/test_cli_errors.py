"""Command-line errors the Unix way (torchmem/cli/arguments.py): exit status 2 for a bad argument, 1 for bad
input, one line on stderr naming the file or the option, never a traceback. One test per command."""
from __future__ import annotations

import builtins
import os
import pickle

import pytest

from torchmem.cli import main

from tests.support.subprocess_runner import run_torchmem

SNAPSHOT = {"segments": [], "device_traces": [[{"action": "alloc", "addr": 2**40, "size": 512, "stream": 0}]]}
NO_TRACE = {"segments": [{"device": 0, "address": 2**40, "total_size": 2 << 20, "stream": 0, "segment_type": "small",
                          "blocks": [{"address": 2**40, "size": 2 << 20, "state": "inactive"}]}],
            "device_traces": [[]]}


def run(argv: list[str], capsys) -> tuple[int, str]:
    try:
        status = main(argv)
    except SystemExit as exc:  # argparse
        status = exc.code
    out = capsys.readouterr()
    assert "Traceback" not in out.err
    return status, out.err


def one_error(err: str, command: str) -> str:
    assert err.count("\n") == 1 and err.endswith("\n"), err
    assert err.startswith(f"torchmem {command}: error: "), err
    return err


class Files:
    def __init__(self, tmp_path) -> None:
        self.dir = tmp_path
        self.missing = str(tmp_path / "missing.pickle")
        self.empty = self.put("empty.pickle", b"")
        self.text = self.put("notes.txt", b"hello, this is not a snapshot\n")
        self.snapshot = self.put("s.pickle", pickle.dumps(SNAPSHOT))
        self.no_trace = self.put("n.pickle", pickle.dumps(NO_TRACE))
        self.locked = self.put("locked.pickle", pickle.dumps(SNAPSHOT))

    def put(self, name: str, data: bytes) -> str:
        path = self.dir / name
        path.write_bytes(data)
        return str(path)


@pytest.fixture
def files(tmp_path, monkeypatch):
    f = Files(tmp_path)
    os.chmod(f.locked, 0)
    if os.geteuid() == 0:  # root reads any file: make the open fail as it would for a user
        real_open = builtins.open

        def open_(file, *args, **kwargs):
            if os.fspath(file) == f.locked:
                raise PermissionError(13, "Permission denied", f.locked)
            return real_open(file, *args, **kwargs)

        monkeypatch.setattr(builtins, "open", open_)
    return f


def bad_input_cases(files: Files, command: list[str]) -> list[tuple[str, str]]:
    """(path, what stderr says) for the files every command refuses with status 1."""
    return [
        (files.missing, f"{files.missing}: no such file"),
        (str(files.dir), f"{files.dir}: a directory, not a file"),
        (files.empty, f"{files.empty}: empty file"),
        (files.locked, f"{files.locked}: permission denied"),
        (files.text, f"{files.text}: unknown format"),
    ]


SNAPSHOT_COMMANDS = {
    "replay": ["--no-progress"],
    "advise": ["--no-progress"],
    "ranks": ["--no-progress"],
    "stats": [],
    "plot": ["-o", "{d}/p.png", "--no-progress"],
    "viz": ["-o", "{d}/v.html", "--no-progress"],
}


def check_command(command: str, files: Files, capsys, extra: list[str]) -> None:
    extra = [a.replace("{d}", str(files.dir)) for a in extra]
    for path, says in bad_input_cases(files, [command]):
        status, err = run([command, path] + extra, capsys)
        assert status == 1, (path, err)
        assert says in one_error(err, command), err
    status, err = run([command, files.snapshot, "--no-such-option"] + extra, capsys)
    assert status == 2 and "unrecognized arguments: --no-such-option" in err and err.count("\n") == 1


def test_replay_errors(files, capsys):
    check_command("replay", files, capsys, SNAPSHOT_COMMANDS["replay"])
    status, err = run(["replay", files.snapshot, "--capacity", "lots"], capsys)
    assert status == 2 and "argument --capacity: 'lots' is not a size" in err
    status, err = run(["replay", files.snapshot, "--compare", "max_split_size_mb:x"], capsys)
    assert status == 2 and "argument --compare:" in err
    # A device with nothing at all, while another has the trace: a bad argument, and where the trace is.
    two = files.put("two.pickle", pickle.dumps({"segments": [], "device_traces": SNAPSHOT["device_traces"] + [[]]}))
    status, err = run(["replay", two, "--device", "1", "--no-progress"], capsys)
    assert status == 2
    assert "device 1 has no trace entries; device 0 has 1 trace entries (--device 0)" in one_error(err, "replay")


def test_advise_errors(files, capsys):
    check_command("advise", files, capsys, SNAPSHOT_COMMANDS["advise"])
    status, err = run(["advise", files.no_trace, "--no-progress"], capsys)
    assert status == 1 and "has no trace, only its final segments" in one_error(err, "advise")
    status, err = run(["advise", files.snapshot, "--try", "expandable_segments:maybe"], capsys)
    assert status == 2 and "argument --try:" in err


def test_ranks_errors(files, capsys):
    check_command("ranks", files, capsys, SNAPSHOT_COMMANDS["ranks"])
    jsonl = files.put("t.jsonl", b'{"op": "alloc", "id": 1, "size": 4}\n')
    status, err = run(["ranks", jsonl, "--no-progress"], capsys)
    assert status == 1 and "JSON lines of events, not a snapshot" in one_error(err, "ranks")
    status, err = run(["ranks", files.snapshot, "--top", "-1"], capsys)
    assert status == 2 and "argument --top: must be 0 or more" in err


def test_stats_errors(files, capsys):
    check_command("stats", files, capsys, SNAPSHOT_COMMANDS["stats"])
    bad = files.put("bad.pickle", pickle.dumps({"segments": [{"address": 1}], "device_traces": []}))
    status, err = run(["stats", bad], capsys)
    assert status == 1 and f"{bad}: segment 0: missing field 'total_size'" in one_error(err, "stats")


def test_plot_errors(files, capsys):
    check_command("plot", files, capsys, SNAPSHOT_COMMANDS["plot"])
    status, err = run(["plot", files.no_trace, "-o", str(files.dir / "p.png"), "--no-progress"], capsys)
    assert status == 1 and "has no trace (no history), so there is no timeline to draw" in one_error(err, "plot")
    status, err = run(["plot", files.no_trace, "-o", str(files.dir / "p.png"), "--segments"], capsys)
    assert status == 0
    status, err = run(["plot", files.snapshot, "-o", str(files.dir / "p.png"), "--max-segments", "0"], capsys)
    assert status == 2 and "argument --max-segments: must be 1 or more" in err


def test_viz_errors(files, capsys):
    check_command("viz", files, capsys, SNAPSHOT_COMMANDS["viz"])
    status, err = run(["viz", files.snapshot, "-o", str(files.dir), "--no-progress"], capsys)
    assert status == 1 and f"{files.dir}: is a directory" in one_error(err, "viz")


def test_plan_errors(files, capsys):
    for path, says in bad_input_cases(files, ["plan"])[:4]:
        status, err = run(["plan", path], capsys)
        assert status == 1 and says in one_error(err, "plan"), err
    status, err = run(["plan", files.snapshot], capsys)
    assert status == 1 and "a pickle (a memory snapshot?" in one_error(err, "plan")
    binary = files.put("b.csv", b"\xff\xfe\x00\x01" * 50)
    status, err = run(["plan", binary], capsys)
    assert status == 1 and "not UTF-8 text, not a CSV of buffers" in one_error(err, "plan")
    status, err = run(["plan", files.text, "--alignment", "0"], capsys)
    assert status == 2 and "argument --alignment: must be 1 or more" in err


def test_demo_errors(capsys):
    status, err = run(["demo", "--steps", "0"], capsys)
    assert status == 2 and "argument --steps: must be 1 or more" in err


def test_no_command_and_unknown_command(capsys):
    status, err = run([], capsys)
    assert status == 2 and "a command is needed: demo, replay" in err and err.count("\n") == 1
    status, err = run(["frobnicate"], capsys)
    assert status == 2 and "invalid choice: 'frobnicate'" in err and err.count("\n") == 1


def test_a_real_process_exits_with_one_line(tmp_path):
    """The same, through `python -m torchmem`: the exit status the shell sees and nothing but one line."""
    for argv, status in ((["replay", str(tmp_path)], 1), (["replay", str(tmp_path / "x"), "--capacity", "8x"], 2)):
        proc = run_torchmem(*argv, timeout=120)
        assert proc.returncode == status and proc.stdout == "" and proc.stderr.count("\n") == 1, proc.stderr


def test_every_help_names_the_formats(capsys):
    for command in SNAPSHOT_COMMANDS:
        with pytest.raises(SystemExit):
            main([command, "--help"])
        text = " ".join(capsys.readouterr().out.split())
        assert "torch.cuda.memory._dump_snapshot()" in text and "JSON object" in text, command
        assert ("JSON lines" in text) == (command in ("replay", "advise")), command
