"""torchmem from its wheel (`make wheel`) in fresh venvs: with the CUDA 13 torch (2.14.1) and the CUDA 12 torch
(2.6.0) it was built against, on the fake GPU, and with a CPU torch. Each venv runs the installed `torchmem
replay`, `advise` and `preflight`. Preflight runs from the installed package alone: the wheel carries the fake
GPU's set for its torch's CUDA major, no TORCHMEM_* variable is set, and the checkout is not in sight.

One venv at a time, with one wheel per torch, built against the torch of .venv-cuda, .venv-cuda-2.6.0 or .venv,
with no CUDA toolkit in sight (CUDA_HOME names no folder, no nvcc on PATH). setup.py keeps compiled objects per
torch (build/<cpu|cuda>-<release>/temp), where `make test` already compiled them, so a wheel only links.
The venvs are plain (`python -m venv`, no system site-packages). Each gets the source venv's torch and what
torch requires, file by file as their RECORDs list them, hard-linked where the disk allows (else copied): the
torch the wheel was built against, already installed, as in a user's environment, at no cost in disk. pip then
installs the wheel, whose pin that torch must meet.
"""
from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pytest

ROOT = Path(__file__).resolve().parents[2]
SOURCES = {"cuda": ROOT / ".venv-cuda" / "bin" / "python", "cuda12": ROOT / ".venv-cuda-2.6.0" / "bin" / "python",
           "cpu": ROOT / ".venv" / "bin" / "python"}
# pip options for the package index: this machine's pip configuration caps torch and prefers its own disk.
INDEX = ["--isolated", "--cert", "/etc/ssl/certs/ca-certificates.crt"]
# The flavours this run makes, from TORCHMEM_INSTALL_FLAVOURS (default: all three). CI makes them in two runs,
# so that no two CUDA torches are on its disk at once.
FLAVOURS = os.environ.get("TORCHMEM_INSTALL_FLAVOURS", " ".join(SOURCES)).split()
NATIVE_OOM = ROOT / "tests" / "data" / "native" / "nesta_gitu.json.gz"  # a real GPU's snapshot, ending in an OOM
MiB = 1 << 20
GiB = 1 << 30
# What one venv takes where its torch must be copied, not linked (measured: the CUDA 13 torch 5.6 GB, the CUDA 12
# one 4.6 GB, the CPU one 0.8 GB), and what the wheel's build and install take where it is linked.
DISK_NEEDED_COPIED = 6 * GiB
DISK_NEEDED_LINKED = 1 * GiB

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.environ.get("TORCHMEM_INSTALL_TESTS") != "1",
                       reason="several minutes of pip installs: run by `make test-install` (TORCHMEM_INSTALL_TESTS=1), as CI does"),
]

# On a 1 GiB card three 300 MiB blocks fit (900 MiB) and the fourth runs out of memory.
BLOCK = 300 * MiB
OOM_SCRIPT = f"""
import torch
keep = []
for _ in range(4):
    keep.append(torch.empty({BLOCK}, dtype=torch.uint8, device="cuda"))
"""


def without_nvcc(path: str) -> str:
    return os.pathsep.join(d for d in path.split(os.pathsep) if d and not os.path.exists(os.path.join(d, "nvcc")))


# The wheels are built with no CUDA toolkit in sight: the CUDA part needs only torch's nvidia wheels.
NO_TOOLKIT = {"CUDA_HOME": "/nonexistent/cuda", "PATH": without_nvcc(os.environ.get("PATH", ""))}


def clean_env(**extra: str) -> dict[str, str]:
    """This environment less what points at the checkout or the fake GPU (the fake-GPU tier's own set-up):
    no TORCHMEM_* variable at all."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "LD_PRELOAD", "LD_LIBRARY_PATH", "VIRTUAL_ENV", "PYTHONHOME")
           and not k.startswith("TORCHMEM_")}
    env.update(extra)
    return env


def run(args: list[str], *, timeout: float = 600, cwd: Path | None = None, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=timeout,
                          cwd=cwd, env=clean_env(**env))


def ok(proc: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert proc.returncode == 0, f"exit {proc.returncode}: {proc.args}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


@dataclass
class Installed:
    """A fresh venv with a torchmem wheel installed by pip."""

    flavour: str        # "cuda" (CUDA 13), "cuda12" or "cpu"
    torch: str          # the version pip knows the torch built against by (2.14.1, 2.13.0+cpu)
    wheel: Path
    venv: Path

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"

    def torchmem(self, *argv: str, **kwargs) -> subprocess.CompletedProcess:
        """The venv's `torchmem` command, run from outside the checkout."""
        return run([self.venv / "bin" / "torchmem", *argv], cwd=self.venv, **kwargs)


def source_torch(python: Path) -> tuple[str, bool]:
    """The torch of a venv: the version pip knows it by, and whether it is a CUDA build."""
    code = "import importlib.metadata as m, torch; print(m.version('torch'), torch.version.cuda is not None)"
    version, cuda = ok(run([python, "-c", code])).stdout.split()
    return version, cuda == "True"


# Run in the source venv: the files of torch and of what it requires (its requirement closure, with the extras
# each requirement names and the markers evaluated by packaging, as pip does), as [site-packages, path relative
# to it] pairs. Files outside site-packages (console scripts, whose first line names the source venv's python)
# are left out.
TORCH_FILES = r"""
import importlib.metadata as m, json, os, sys
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
listed, seen, todo, files = set(), set(), [("torch", "")], []
while todo:
    name, extra = todo.pop()
    if (name, extra) in seen:
        continue
    seen.add((name, extra))
    try:
        dist = m.distribution(name)
    except m.PackageNotFoundError:
        sys.exit(f"{name}, which torch requires, is not installed")
    if name not in listed:
        listed.add(name)
        if dist.files is None:
            sys.exit(f"{name} has no RECORD: its files cannot be listed")
        here = os.path.realpath(dist.locate_file(""))  # a venv with system site-packages has two sites
        files += [(here, str(f)) for f in dist.files if not str(f).startswith("..")]
    for line in dist.requires or []:
        req = Requirement(line)
        if req.marker is None or req.marker.evaluate({"extra": extra}):
            todo += [(canonicalize_name(req.name), e) for e in sorted(req.extras) or [""]]
print(json.dumps(files))
"""


def site_packages(python: Path) -> Path:
    code = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    return Path(ok(run([python, "-c", code])).stdout.strip())


def same_disk(a: Path, b: Path) -> bool:
    return os.stat(a).st_dev == os.stat(b).st_dev


def fresh_venv(venv: Path, source: Path) -> int:
    """A plain venv holding the source venv's torch and what torch requires: each file hard-linked where the two
    lie on one disk, else copied. Returns the number of files."""
    ok(run([sys.executable, "-m", "venv", venv]))
    files = json.loads(ok(run([source, "-c", TORCH_FILES])).stdout)
    dst = site_packages(venv / "bin" / "python")
    for site, rel in files:
        target = dst / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        if not target.exists():
            (os.link if same_disk(Path(site), dst) else shutil.copy2)(Path(site) / rel, target)
    return len(files)


def make_installed(flavour: str, tmp: Path) -> Installed:
    """The venv of one flavour with its wheel installed; skips when this checkout has no source venv for it."""
    python = SOURCES[flavour]
    if not python.exists():
        pytest.skip(f"no {python.parent.parent.name} to build the {flavour} wheel with")
    version, cuda = source_torch(python)
    if cuda != flavour.startswith("cuda"):
        pytest.skip(f"torch {version} in {python.parent.parent.name} is not a {flavour} build")
    needed = DISK_NEEDED_LINKED if same_disk(python.parent, tmp) else DISK_NEEDED_COPIED
    free = shutil.disk_usage(tmp).free
    assert free >= needed, (f"the {flavour} install test needs {needed / GiB:.0f} GB free under {tmp}; "
                            f"{free / GiB:.1f} GB are")
    fresh_venv(tmp / "venv", python)
    assert source_torch(tmp / "venv" / "bin" / "python") == (version, cuda)
    ok(run(["make", "-s", "wheel", f"WHEEL_PYTHON={python}", f"WHEEL_DIR={tmp / 'dist'}"],
           cwd=ROOT, timeout=1200, **NO_TOOLKIT))
    (wheel,) = (tmp / "dist").glob("torchmem-*.whl")
    # The wheel's own requirement must be met by the torch already there, or pip would look for another.
    ok(run([tmp / "venv" / "bin" / "pip", "install", "-q", "--no-compile",
            *(INDEX if flavour == "cuda12" else []), wheel], timeout=600))
    return Installed(flavour, version, wheel, tmp / "venv")


@pytest.fixture(scope="session")
def venv(request, tmp_path_factory) -> Iterator[Installed]:
    """The installed venv of the flavour a test names (indirect parametrization). Session-scoped and
    parametrized, so pytest runs each flavour's tests together and removes a venv before it makes the next:
    one venv is on disk at a time."""
    tmp = tmp_path_factory.mktemp(f"wheel-{request.param}")
    try:
        yield make_installed(request.param, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def flavours(*names: str):
    """The test runs in each of these flavours that this run makes."""
    return pytest.mark.parametrize("venv", [n for n in names if n in FLAVOURS], indirect=True)


@pytest.fixture(scope="session")
def native_oom(tmp_path_factory) -> tuple[Path, int]:
    """The native fixture as a JSON file, and the size its recorded OOM asked for."""
    path = tmp_path_factory.mktemp("native") / "nesta_gitu.json"
    with gzip.open(NATIVE_OOM, "rt") as f:
        snapshot = json.load(f)
    path.write_text(json.dumps(snapshot))
    ooms = [e["size"] for trace in snapshot["device_traces"] for e in trace if e["action"] == "oom"]
    assert len(ooms) == 1
    return path, ooms[0]


def requirements(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as z:
        name = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        lines = z.read(name).decode().splitlines()
    return [line.split(":", 1)[1].strip() for line in lines if line.startswith("Requires-Dist:")]


def imported(venv: Installed) -> dict:
    code = ("import json, importlib.metadata as m, torch, torchmem, torchmem._C as C; print(json.dumps({"
            "'torchmem': torchmem.__file__, 'torch': m.version('torch'), 'cuda': torch.version.cuda, "
            "'glue': hasattr(C, 'cuda_install')}))")
    return json.loads(ok(run([venv.python, "-c", code], cwd=venv.venv)).stdout)


def check_replay_and_advise(venv: Installed, snapshot: Path, oom_size: int) -> dict:
    """replay reproduces the recorded OOM; advise finds that the recorded setting does not fit the card.
    Returns advise's row for the recorded setting."""
    replay = json.loads(ok(venv.torchmem("replay", "--json", "--no-progress", str(snapshot))).stdout)
    assert replay["completed"] is False
    assert replay["oom"]["size"] == oom_size
    assert replay["recorded_oom"]["reproduced"] is True
    rows = json.loads(ok(venv.torchmem("advise", "--json", "--no-progress", str(snapshot))).stdout)
    recorded = [r for r in rows if r["recorded"]]
    assert len(recorded) == 1 and recorded[0]["completes"] is False
    assert recorded[0]["min_capacity"] > recorded[0]["capacity"]
    return recorded[0]


@flavours("cuda", "cuda12", "cpu")
def test_the_wheel_requires_the_torch_it_was_built_against(venv: Installed):
    flavour = venv.flavour
    assert f"torch=={venv.torch}" in requirements(venv.wheel)
    found = imported(venv)
    assert Path(found["torchmem"]).is_relative_to(venv.venv)  # the wheel's, not the checkout's
    assert found["torch"] == venv.torch  # installing the wheel left the torch it pins in place
    assert (found["cuda"] is not None) == flavour.startswith("cuda")
    # The CUDA glue is in the CUDA 13 wheel only: torch 2.6 is older than the glue supports (setup.py).
    assert found["glue"] == (flavour == "cuda")


@flavours("cuda")
def test_cuda_wheel_swaps_the_allocator_on_the_fake_gpu(venv: Installed):
    code = ("import json, torch, torchmem; torchmem.install(); x = torch.empty(5 << 20, dtype=torch.uint8, "
            "device='cuda'); print(json.dumps([torch.cuda.memory.get_allocator_backend(), "
            "torch.cuda.memory_allocated(), torchmem.memory_allocated()]))")
    proc = ok(run([venv.python, "-m", "torchmem.fakegpu", "--", venv.python, "-c", code],
                  cwd=venv.venv))
    assert json.loads(proc.stdout.splitlines()[-1]) == ["torchmem", 5 * MiB, 5 * MiB]


@flavours("cuda")
def test_cuda_wheel_preflight_then_replay_and_advise_its_snapshot(venv: Installed, tmp_path):
    script = tmp_path / "oom.py"
    script.write_text(OOM_SCRIPT)
    out = tmp_path / "out"
    proc = venv.torchmem("preflight", "--card", "1GiB", "--json", "--no-advise", "--out", str(out), "--",
                              str(venv.python), str(script))
    assert proc.returncode == 3, proc.stderr[-3000:]  # 3: ran out of memory
    report = json.loads(proc.stdout)
    (device,) = report["devices"]
    assert report["fits"] is False
    assert device["peak_allocated"] == 3 * BLOCK and device["num_ooms"] == 1
    recorded = check_replay_and_advise(venv, Path(device["snapshot"]), BLOCK)
    assert recorded["min_capacity"] == 4 * BLOCK  # all four blocks at once, to 2 MiB


# A training loop: a 4,096 x 4,096 fp32 weight (64 MiB) and AdamW, three steps.
WEIGHT = 4096 * 4096 * 4
TRAIN_SCRIPT = """
import torch
model = torch.nn.Linear(4096, 4096, bias=False, device="cuda")
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
for _ in range(3):
    loss = model(torch.randn(512, 4096, device="cuda")).square().mean()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
state = opt.state[model.weight]
assert state["exp_avg"].is_cuda and state["exp_avg_sq"].is_cuda
"""


@flavours("cuda", "cuda12")
def test_preflight_runs_a_training_script_from_the_installed_package_alone(venv: Installed, tmp_path):
    where = ok(run([venv.python, "-c", "from torchmem import fakegpu; print(fakegpu.library_dir())"], cwd=venv.venv))
    assert Path(where.stdout.strip()).is_relative_to(venv.venv)  # the package's own set, not the checkout's
    script = tmp_path / "train.py"
    script.write_text(TRAIN_SCRIPT)
    proc = venv.torchmem("preflight", "--card", "l4", "--json", "--out", str(tmp_path / "out"), "--",
                         str(venv.python), str(script))
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    (device,) = report["devices"]
    assert report["fits"] is True
    # The weight, its gradient and AdamW's two moments are live at once after the first step.
    assert device["peak_allocated"] >= 4 * WEIGHT
    assert report["advice"], "advise's table is in the report"


@flavours("cpu")
def test_cpu_wheel_replays_and_advises_a_real_gpus_snapshot(venv: Installed, native_oom):
    check_replay_and_advise(venv, *native_oom)


@flavours("cpu")
def test_cpu_wheel_preflight_says_in_one_line_that_torch_has_no_cuda(venv: Installed, tmp_path):
    script = tmp_path / "oom.py"
    script.write_text(OOM_SCRIPT)
    proc = venv.torchmem("preflight", "--card", "1GiB", "--", str(venv.python), str(script))
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("torchmem preflight: error:"), proc.stderr
    assert "is a CPU build" in lines[0], lines[0]
