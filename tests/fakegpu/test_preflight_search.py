"""`torchmem preflight --search`: each card's largest value, held to preflights of that value and the next."""
from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.fakegpu.helpers import ROOT
from torchmem import preflight
from torchmem.preflight.search import Space, parse_cards, search

SCRIPT = """
import os, sys, torch
batch = int(sys.argv[1]) if len(sys.argv) > 1 else int(os.environ["BATCH"])
model = torch.nn.Linear(4096, 4096).cuda()
opt = torch.optim.AdamW(model.parameters())
for _ in range(5):
    model(torch.randn(batch * 1024, 4096, device="cuda")).square().mean().backward()
    opt.step()
    opt.zero_grad()
"""


def test_the_largest_batch_fits_each_card_and_the_next_one_does_not(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    cards = parse_cards("t4,l4")
    limits = search([sys.executable, str(script), "{B}"], Space("B", 1, 256), cards, margin=0.0, steps=3,
                    out=tmp_path / "search", progress=lambda line: None)
    assert [limit.card for limit in limits] == ["t4", "l4"]
    assert 1 < limits[0].largest < limits[1].largest < 256
    for limit in limits:
        for value, fits in ((limit.largest, True), (limit.largest + 1, False)):
            report = preflight.run_command([sys.executable, str(script), str(value)], limit.card, advise=False,
                                           out=tmp_path / f"{limit.card}-{value}", capture_output=True, steps=3)
            assert report.fits == fits, (limit.card, value)
        assert limit.fit.peak_reserved + limit.outside <= parse_cards(limit.card)[0].memory


def test_the_command_line_sets_an_environment_variable_and_gives_json(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-m", "torchmem", "preflight", "--search", "BATCH=1..64", "--cards", "t4",
                           "--margin", "0.5", "--json", "--", sys.executable, str(script)],
                          capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr
    [t4] = json.loads(proc.stdout)["cards"]
    # Half of the T4 left free: at most half its memory, less what sits outside the allocator.
    assert t4["largest"] and t4["fit"]["peak_reserved"] + t4["outside"] <= 15_095 * (1 << 20) // 2 + t4["outside"]
    assert "BATCH=" in proc.stderr and "of 1 cards" in proc.stderr
