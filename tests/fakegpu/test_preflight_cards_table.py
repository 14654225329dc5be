"""Every preflight report ends with the catalog's cards (torchmem/preflight/cards_table.py).

Each row is a replay of the run's trace at that card's allocator capacity. The tests hold rows to real
preflight runs on those cards: the run's own card to the byte, a card too small to its OOM, a larger one
to its peak, and a row's setting to a run with that setting.
"""
from __future__ import annotations

import sys

from tests.fakegpu.helpers import GiB
from torchmem import preflight

BLOCKS = """
import torch
READ_SIZE and torch.cuda.mem_get_info()
kept = [torch.empty(1 << 28, device="cuda") for _ in range(22)]  # 22 GiB in 1 GiB blocks
"""


def run(tmp_path, card: str, read_size: bool = False, conf: str | None = None) -> preflight.Report:
    script = tmp_path / "blocks.py"
    script.write_text(f"READ_SIZE = {read_size}\n" + BLOCKS)
    return preflight.run_command([sys.executable, str(script)], card, out=tmp_path / f"out-{card}-{conf}",
                                 capture_output=True, advise=False, conf=conf)


def test_each_row_agrees_with_a_preflight_on_that_card(tmp_path):
    report = run(tmp_path, "h100")
    rows = {r.key: r for r in report.cards}
    assert len(rows) == 12 and rows["h100-sxm"].marks == ("the run's card",)
    assert rows["h100-sxm"].fits and rows["h100-sxm"].peak_reserved == report.devices[0].peak_reserved == 22 * GiB
    assert rows["rtx4090"].fits and not rows["l4"].fits and not rows["t4"].fits
    on_4090, on_l4 = run(tmp_path, "rtx4090"), run(tmp_path, "l4")
    assert on_4090.fits and on_4090.devices[0].peak_reserved == rows["rtx4090"].peak_reserved
    assert not on_l4.fits and on_l4.ooms
    assert "The catalog's cards" in report.format().split("How far to trust it:")[-1]
    assert report.to_json()["cards"][0]["key"] == min(rows.values(), key=lambda r: r.memory).key


def test_a_script_that_reads_the_cards_size_marks_the_other_cards(tmp_path):
    report = run(tmp_path, "h100", read_size=True)
    assert report.processes[0]["sized"]["torch.cuda.mem_get_info()"]
    rows = {r.key: r for r in report.cards}
    assert "sized itself" not in rows["h100-sxm"].marks
    assert all("sized itself" in r.marks for k, r in rows.items() if k != "h100-sxm")
    assert "sized itself: the script read the card's size" in report.format()


def test_a_row_that_does_not_fit_names_a_setting_that_does(tmp_path):
    command = [sys.executable, "examples/preflight_batch32.py", "--batch", "32"]
    report = preflight.run_command(command, "h100", out=tmp_path / "out", capture_output=True)
    [row] = [r for r in report.cards if r.key == "h100-sxm"]
    assert not report.fits and not row.fits and row.setting and "[torchmem]" not in row.setting
    confirmed = preflight.run_command(command, "h100", conf=row.setting, out=tmp_path / "confirm", capture_output=True,
                                      advise=False)
    assert confirmed.fits
