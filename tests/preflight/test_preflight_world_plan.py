"""preflight --world-size's plan (torchmem/preflight/world.py): a launch command read as torchrun reads it,
the ranks checked, and the variables each rank gets."""
from __future__ import annotations

import pytest

from torchmem.preflight.world import WorldError, parse_ranks, plan


@pytest.mark.parametrize("text, ranks", [
    ("0", (0,)), ("0,7,63", (0, 7, 63)), ("3-5", (3, 4, 5)), ("9,0-2,1", (0, 1, 2, 9)),
])
def test_ranks_are_read_as_lists_and_ranges(text, ranks):
    assert parse_ranks(text) == ranks


@pytest.mark.parametrize("text", ["", "a", "1-", "5-3", "-1", "1,,2"])
def test_bad_ranks_are_refused(text):
    with pytest.raises(WorldError, match="--ranks"):
        parse_ranks(text)


@pytest.mark.parametrize("launch", [
    ["torchrun", "--nnodes", "8", "--nproc-per-node", "8", "train.py", "--lr", "3"],
    ["torchrun", "--nnodes=8", "--nproc_per_node=8", "--rdzv-backend", "c10d", "--rdzv-endpoint", "h:29400",
     "train.py", "--lr", "3"],
    ["python3", "-m", "torch.distributed.run", "--standalone", "--nnodes", "8", "--nproc-per-node", "8",
     "train.py", "--lr", "3"],
])
def test_torchrun_is_read_for_its_layout_and_left_out(launch):
    world = plan(launch, 64, [0, 9, 63])
    assert (world.size, world.per_node, world.ranks) == (64, 8, (0, 9, 63))
    assert world.command[1:] == ("train.py", "--lr", "3")
    assert "python" in world.command[0]


def test_torchrun_module_and_no_python_forms():
    assert plan(["torchrun", "--nproc-per-node", "4", "-m", "pkg.train", "x"], 8).command[1:] == ("-m", "pkg.train",
                                                                                                  "x")
    assert plan(["torchrun", "--no-python", "--nproc-per-node", "4", "./run.sh"], 8).command == ("./run.sh",)


def test_a_plain_command_gets_eight_ranks_per_node_or_the_whole_world():
    assert plan(["python", "train.py"], 64).per_node == 8
    assert plan(["python", "train.py"], 4).per_node == 4
    assert plan(["python", "train.py"], 64, per_node=4).per_node == 4


def test_each_rank_gets_what_torchrun_would_set():
    env = plan(["python", "train.py"], 64, [9]).environment(9)
    assert {k: env[k] for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                                "GROUP_WORLD_SIZE")} == {"RANK": "9", "LOCAL_RANK": "1", "WORLD_SIZE": "64",
                                                         "LOCAL_WORLD_SIZE": "8", "GROUP_RANK": "1",
                                                         "GROUP_WORLD_SIZE": "8"}
    assert not [k for k in env if k.startswith("TORCHMEM_")]  # the world size travels in the run plan (run_plan.py)


@pytest.mark.parametrize("args, says", [
    ((["python", "x.py"], 0), "positive whole number"),
    ((["python", "x.py"], 4, [4]), "rank 4 is not in a world of 4"),
    ((["torchrun", "--nnodes", "1:2", "--nproc-per-node", "8", "x.py"], 16), "elastic range"),
    ((["torchrun", "--nproc-per-node", "gpu", "x.py"], 8), "elastic range or 'gpu'"),
    ((["torchrun", "--nnodes"], 8), "needs a value"),
    ((["python", "x.py"], 128, [0], 65), "1 to 64 devices"),
])
def test_what_cannot_run_says_why(args, says):
    with pytest.raises(WorldError, match=says):
        plan(*args)
