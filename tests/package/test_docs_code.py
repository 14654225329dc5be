"""The README's and docs/*.md's python code blocks run as written.

Every ```python block of README.md and docs/*.md is found here and either
run in a fresh interpreter (in an empty directory, torchmem importable) or
listed in NOT_RUN with the reason. A block that uses names of the reader's
own program (a `loader`, a `train_step`, a snapshot file) runs after a
SETUP from the reviewed table below, which defines exactly those names and
nothing the block defines itself; CHECKS then asserts what the block's
comments claim. A block in neither table runs as it is. A block added to
the docs that fails, or an entry in these tables that matches no block,
fails the test.
"""
from __future__ import annotations

import glob
import gzip
import json
import os
import pickle
import re
import sys

import pytest

from tests.support.subprocess_runner import ROOT, run_args
from tests.allocator.test_planned_loops import TRAIN_STEP

DOCS = ["README.md", *sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "docs", "*.md")))]

# (file, first line of the block) -> why it is not run.
NOT_RUN = {
    ("README.md", "torch.cuda.memory._record_memory_history(max_entries=100_000)"):
        "needs a GPU: PyTorch's own CUDA history and _dump_snapshot",
    ("docs/replay.md", "import torch"):
        "needs a GPU: PyTorch's own CUDA history and _dump_snapshot (the README's block, with its import)",
    ("docs/arena_and_paged.md", "torchmem.install()                               # before CUDA initialises"):
        "needs a GPU: an arena on torchmem's CUDA caching allocator",
    ("docs/cuda.md", "torchmem.install()                        # on a machine with CUDA"):
        "needs a GPU: the device rule on CUDA (tests/cuda/test_cuda_install.py makes the same calls on the fake GPU)",
    ("docs/cuda.md", "with torchmem.planned(inputs=batch):      # device: the current GPU"):
        "needs a GPU: planned() on the current CUDA device (docs/planned.md's block is the CPU form)",
    ("docs/preflight.md", "from torchmem import preflight"):
        "needs a CUDA build of torch and the fake GPU: tests/fakegpu/test_preflight.py makes the same calls",
    ("docs/fakegpu.md", "from torchmem import fakegpu"):
        "needs the fake GPU: a CUDA build of torch (the Makefile's fake-GPU tier, .venv-cuda)",
    ("docs/fakegpu.md", "from torchmem.fakegpu import Control"):
        "needs the fake GPU: runs inside a process started by python -m torchmem.fakegpu",
    ("docs/fakegpu.md", "from tests.support import oracle"):
        "needs the fake GPU: the oracle runs PyTorch's CUDA allocator (tests/fakegpu/test_native_oracle.py runs it)",
    ("docs/oom.md", "torchmem.dump_on_oom(path=\"oom_rank{rank}_pid{pid}.pickle\", max_entries=100_000)"):
        "a summary of signatures, not a program: `conf=...` and `True | \"path template\" | None` stand for values",
}

# Names the reader's program defines, for the blocks that use them.
TRAINING = """
import torch
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Tanh(), torch.nn.Linear(64, 10))
optimizer = opt = torch.optim.SGD(model.parameters(), lr=0.01)
loader = [torch.randn(32, 64) for _ in range(8)]
""" + TRAIN_STEP + """
def train():
    for batch in loader:
        train_step(batch)
"""
SUPERVISED = """
import torch
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Tanh(), torch.nn.Linear(64, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
loss_fn = torch.nn.functional.cross_entropy
loader = [(torch.randn(32, 64), torch.randint(0, 10, (32,))) for _ in range(8)]
total = 0.0
"""
# A snapshot written on a GPU at its OOM: the figures of a real one (tests/data/native/nesta_gitu.json.gz).
SNAPSHOT = """
import gzip, json, pickle
snapshot = json.load(gzip.open({fixture!r}))
for name in ("oom.pickle", "run.pickle"):
    with open(name, "wb") as f:
        pickle.dump(snapshot, f)
""".format(fixture=os.path.join(ROOT, "tests", "data", "native", "nesta_gitu.json.gz"))
FX = """
import torch, torch.fx
class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(64, 64) for _ in range(8))
    def forward(self, x):
        for layer in self.layers:
            x = torch.relu(layer(x))
        return x
gm = torch.fx.symbolic_trace(Net())
example_inputs = (torch.randn(16, 64),)
"""

SETUP = {
    ("README.md", "from torchmem.replay import advise, replay"): SNAPSHOT,
    ("docs/arena_and_paged.md", "import torch, torchmem"): SUPERVISED,
    ("docs/cpu.md", "torchmem.install(conf=\"reuse_order:address,min_block_size:512\")"): "import torchmem\n",
    ("docs/oom.md", "import torchmem"): TRAINING,
    ("docs/planned.md", "import torchmem"): TRAINING,
    ("docs/planner.md", "from torchmem.plan import pipeline"): FX,
    ("docs/replay.md", "from torchmem.replay import advise"): SNAPSHOT,
    ("docs/snapshots.md", "import torchmem"): TRAINING,
    ("docs/stitch.md", "from torchmem.replay import min_capacity, replay"): SNAPSHOT,
}

# What the block's comments claim, checked after it ran.
CHECKS = {
    ("README.md", "import torch, torchmem"):
        "assert x.nbytes <= stats['allocated_bytes.all.current'] <= stats['reserved_bytes.all.current'], stats",
    ("docs/planned.md", "import torchmem"):
        "assert report.phase == 'planned' and report.misses == 0 and report.hits > 0, report",
    ("README.md", "from torchmem.replay import advise, replay"):
        "assert result.recorded_oom['reproduced'] and result.exact",
    ("docs/planner.md", "from torchmem.plan import Buffer, solve"):
        "assert (plan.height, plan.lower_bound, plan.optimal) == (12, 12, True) and plan.validate()",
    ("docs/planner.md", "from torchmem.plan import Buffer, Sync, lifetimes, solve"):
        "assert lifetimes(bs)[0].own == 6 and plan.height == 128",
    ("docs/snapshots.md", "import torchmem"):
        "import os; assert os.path.getsize('snapshot.pickle') > 0",
    ("docs/arena_and_paged.md", "import torch"):
        "assert slots.tolist() == [40] and torch.equal(cache.gather(0, child)[0][:40], k.half())",
}


def blocks() -> list[tuple[str, str, str]]:
    """(file, label, code) of every python block; the label is its first line, or its first two
    ("a / b") where another block of the file starts with the same line."""
    out = []
    for rel in DOCS:
        with open(os.path.join(ROOT, rel), encoding="utf-8") as f:
            text = f.read()
        codes = [m.group(1) for m in re.finditer(r"^```python\n(.*?)^```", text, re.S | re.M)]
        lines = [[line.rstrip() for line in code.splitlines() if line.strip()] for code in codes]
        firsts = [ls[0] for ls in lines]
        for code, ls in zip(codes, lines):
            label = ls[0] if firsts.count(ls[0]) == 1 else " / ".join(ls[:2])
            out.append((rel, label, code))
    return out


BLOCKS = blocks()


def test_the_tables_name_only_blocks_that_exist():
    keys = {(f, first) for f, first, _ in BLOCKS}
    assert len(keys) == len(BLOCKS), "two blocks of one file start with the same line: the tables cannot tell them apart"
    for table in (NOT_RUN, SETUP, CHECKS):
        assert set(table) <= keys, set(table) - keys
    assert not set(NOT_RUN) & (set(SETUP) | set(CHECKS))
    assert len(BLOCKS) >= 20  # README.md and docs/ hold this many python blocks today


@pytest.mark.parametrize("doc, first, code", [b for b in BLOCKS if b[:2] not in NOT_RUN],
                         ids=[f"{b[0]}:{b[1][:40]}" for b in BLOCKS if b[:2] not in NOT_RUN])
def test_block_runs_as_written(doc, first, code, tmp_path):
    key = (doc, first)
    program = SETUP.get(key, "") + "\n" + code + "\n" + CHECKS.get(key, "") + "\n"
    proc = run_args(["-c", program], timeout=600, cwd=tmp_path, drop_env=["TORCHMEM_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF"])
    assert proc.returncode == 0, f"{doc}: the block starting {first!r} failed:\n{proc.stderr[-3000:]}"


@pytest.mark.parametrize("name", ["fragmentation_watch", "forget", "planned", "planned_step", "compact",
                                  "dump_on_oom", "install", "memory_summary"])
def test_names_the_readme_uses_are_exported(name):
    import torchmem

    assert callable(getattr(torchmem, name)) and name in torchmem.__all__


@pytest.mark.parametrize("name", ["slab_stats", "plans", "forget", "fragmentation_watch", "shape_key"])
def test_torchmem_planned_dot_name_works_as_docs_planned_md_writes_it(name):
    import torchmem

    # torchmem.planned is the function; the module of that name is sys.modules["torchmem.runtime.planned"]
    assert getattr(torchmem.planned, name) is getattr(sys.modules["torchmem.runtime.planned"], name)
