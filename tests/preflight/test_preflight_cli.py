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
    (["--ranks", "3", "--", "python", "x.py"], "--ranks needs --world-size"),
    (["--world-size", "8", "--devices", "2", "--", "python", "x.py"], "--devices does not go with --world-size"),
    (["--world-size", "0", "--", "python", "x.py"], "must be 1 or more"),
    (["--world-size", "64", "--ranks", "64", "--", "python", "x.py"], "rank 64 is not in a world of 64"),
    (["--world-size", "64", "--ranks", "0,x", "--", "python", "x.py"], "give ranks as 0, 0,7,63 or 0-7"),
    (["--world-size", "64", "--", "torchrun", "--nnodes", "1:8", "--nproc-per-node", "8", "x.py"], "elastic range"),
    (["--world-size", "64", "--", "torchrun", "--nnodes", "4", "--nproc-per-node", "8", "x.py"],
     "disagrees with torchrun's --nnodes 4 x --nproc-per-node 8 = 32"),
    (["--world-size", "8", "--", "torchrun", "--nproc-per-node", "8"], "torchrun was given no script"),
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
    if "is not installed" in proc.stderr:
        pytest.skip("the fake GPU is not built in this checkout")
    assert proc.returncode == 127
    assert proc.stderr.strip() == "torchmem preflight: error: no-such-program-torchmem: command not found"
