"""`torchmem preflight`'s bad arguments: status 2 and one line on stderr, before anything runs (docs/preflight.md)."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from torchmem.cli import main


def preflight(capsys, *args: str) -> SimpleNamespace:
    try:
        status = main(["preflight", *args])
    except SystemExit as exc:  # argparse's own errors
        status = exc.code
    out, err = capsys.readouterr()
    return SimpleNamespace(returncode=status, stdout=out, stderr=err)


@pytest.mark.parametrize("args, says", [
    ([], "no command to run"),
    (["--"], "no command to run"),
    (["--card", "huge", "--", "python", "x.py"], "--card: card size 'huge'"),
    (["--card", "1MiB", "--", "python", "x.py"], "at least 2MiB"),
    (["--devices", "0", "--", "python", "x.py"], "must be 1 or more"),
    (["--devices", "65", "--", "python", "x.py"], "--devices must be 1 to 64"),
    (["--conf", "expandable_segments:maybe", "--", "python", "x.py"], "expandable_segments"),
    (["--conf", "policy:stitch", "--", "python", "x.py"], "PYTORCH_CUDA_ALLOC_CONF settings only"),
])
def test_bad_arguments_exit_2_with_one_line(capsys, args, says):
    proc = preflight(capsys, *args)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert says in lines[0]
    assert proc.stdout == ""


def test_a_command_that_does_not_exist_is_named(capsys):
    proc = preflight(capsys, "--", "no-such-program-torchmem")
    if "fake GPU is not built" in proc.stderr:
        pytest.skip("the fake GPU is not built in this checkout")
    assert proc.returncode == 127
    assert proc.stderr.strip() == "torchmem preflight: error: no-such-program-torchmem: command not found"
