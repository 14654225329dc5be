"""`torchmem viz`'s page: the user's code in "live memory by allocation
site" (the frame filter `ranks` uses), a viewport meta tag, and the page
opened in a real headless browser (Debian's chromium), which must render
the figures and the OOM section."""
from __future__ import annotations

import html
import os
import pickle
import re
import shutil
import subprocess

import pytest

from tests.support.replay_recording import GiB, random_workload, record
from torchmem.viz.html import COLORS, render_html
from torchmem.viz.ranks import rank_row

from tests.support.subprocess_runner import ROOT, ok, run_torchmem
SNAPSHOTS = os.path.normpath(os.path.join(ROOT, "..", "shared", "data", "snapshots"))
CHROMIUM = "/usr/bin/chromium"

UNWIND = {"filename": "??", "line": 0, "name": "torch::unwind::unwind()"}
MALLOC = {"filename": "/pytorch/c10/cuda/CUDACachingAllocator.cpp", "line": 1, "name": "c10::cuda::CUDACachingAllocator::malloc"}
LINEAR = {"filename": "/usr/lib/python3.11/site-packages/torch/nn/modules/linear.py", "line": 125, "name": "forward"}
USER = {"filename": "/home/me/project/train.py", "line": 42, "name": "forward"}
CALLER = {"filename": "/home/me/project/train.py", "line": 90, "name": "main"}


def site_rows(page: str) -> list[str]:
    """The first frame of each row of the sites table, as the page shows it."""
    table = page[page.index("Live memory by allocation site"):]
    table = table[:table.index("</table>")]
    return [html.unescape(code).split("<br>")[0] for code in re.findall(r"<code>(.*?)</code>", table)]


def test_sites_start_at_the_users_frame_not_in_the_allocator():
    frames = [UNWIND, MALLOC, LINEAR, USER, CALLER]  # innermost first, as PyTorch records them on CUDA
    snap = {"segments": [{"device": 0, "address": 0, "total_size": 2 << 20, "stream": 0, "segment_type": "large",
                          "blocks": [{"address": 0, "size": 2 << 20, "requested_size": 2 << 20,
                                      "state": "active_allocated", "frames": frames}]}],
            "device_traces": [[]]}
    [first] = site_rows(render_html(snap))
    assert first == "/home/me/project/train.py:42 forward"
    page = render_html(snap)
    assert "train.py:90 main" in page  # the callers follow
    assert "CUDACachingAllocator" not in page.split("Live memory by allocation site")[1]
    assert rank_row(snap, "x.pickle")["top_sites"][0]["site"] == "train.py:42 forward"


def test_the_page_has_a_viewport_meta_tag():
    page = render_html({"segments": [], "device_traces": [[]]})
    assert '<meta name="viewport" content="width=device-width, initial-scale=1">' in page


@pytest.mark.skipif(not os.path.isdir(SNAPSHOTS), reason=f"the real snapshots are not at {SNAPSHOTS}")
@pytest.mark.parametrize("name", ["HugePandaCoder__octree-nca-groupeq__0072096f_my_snapshot.pickle",
                                  "Maphsge4__select_n__5a601013_snapshot.pickle"])
def test_on_real_snapshots_viz_and_ranks_name_the_same_sites(name):
    from torchmem.formats.snapshot_format import load

    snap = load(os.path.join(SNAPSHOTS, name))
    shown = site_rows(render_html(snap))[:5]
    ranked = [s["site"] for s in rank_row(snap, name, top=5)["top_sites"]]
    assert len(shown) == len(ranked) >= 3
    for page_row, site in zip(shown, ranked):
        if site == "(no stack recorded)":
            assert page_row == site
        else:  # the page gives the path, ranks the file name: the same file, line and function
            path, _, rest = site.partition(":")
            assert page_row.endswith("/" + path + ":" + rest) or page_row == site, (page_row, site)
    assert not any(".cpp:" in row or "unwind" in row for row in shown)


@pytest.fixture(scope="module")
def oom_page(tmp_path_factory):
    snap = record(random_workload(12, 3000, large=0.6), "", capacity=2 * GiB)
    assert any(e["action"] == "oom" for e in snap["device_traces"][0])
    out = tmp_path_factory.mktemp("page")
    (out / "oom.pickle").write_bytes(pickle.dumps(snap))
    ok(run_torchmem("viz", str(out / "oom.pickle"), "-o", str(out / "oom.html"), "--no-progress", timeout=300))
    return out / "oom.html"


def chromium(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                           "--no-first-run", "--disable-extensions", *args], capture_output=True, text=True,
                          timeout=180)


def colour_pixels(png: str, hex_colour: str, tolerance: int = 12) -> int:
    """How many pixels of the screenshot are within `tolerance` of a colour."""
    import numpy as np
    from PIL import Image

    image = np.asarray(Image.open(png).convert("RGB")).astype(int)
    target = np.array([int(hex_colour[i:i + 2], 16) for i in (1, 3, 5)])
    return int((np.abs(image - target).max(axis=2) <= tolerance).sum())


@pytest.mark.skipif(not os.path.exists(CHROMIUM) or not shutil.which(CHROMIUM),
                    reason="no headless browser: Debian's chromium is not at /usr/bin/chromium "
                           "(apt-get install -y chromium)")
def test_a_headless_browser_renders_the_figures_and_the_oom_section(oom_page, tmp_path):
    dom = chromium("--dump-dom", oom_page.as_uri())
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert 'id="ooms"' in dom.stdout and "Out-of-memory events" in dom.stdout
    assert dom.stdout.count("<svg") == 2  # the timeline and the segments
    shot = tmp_path / "page.png"
    proc = chromium(f"--screenshot={shot}", "--window-size=1200,2600", oom_page.as_uri())
    assert proc.returncode == 0 and shot.exists(), proc.stderr[-2000:]
    # The figures are drawn: the allocated and reserved curves, the segments' blocks, the OOM marker.
    assert colour_pixels(str(shot), COLORS["requested"]) > 500       # allocated: curve and live blocks
    assert colour_pixels(str(shot), COLORS["reserved"]) > 200        # reserved: the curve
    assert colour_pixels(str(shot), COLORS["oom"]) > 50              # the OOM line, its label, the card
    blank = tmp_path / "blank.html"
    blank.write_text("<!DOCTYPE html><html><body></body></html>")
    chromium(f"--screenshot={tmp_path / 'blank.png'}", "--window-size=1200,2600", blank.as_uri())
    assert colour_pixels(str(tmp_path / "blank.png"), COLORS["oom"]) == 0  # the colour test sees nothing on a blank page
