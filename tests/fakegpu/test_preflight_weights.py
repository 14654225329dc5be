"""Under preflight a safetensors checkpoint loads its shapes, not its bytes (torchmem/preflight/weights_hook.py).

A Qwen2-shaped model built from a config is saved with save_pretrained. A copy of its folder keeps each weight
file's header and leaves the rest a hole of the same size (a sparse file). from_pretrained of the copy under
preflight must read under 1 MiB and copy no weight into host memory; its device peaks must equal those of a
load that reads the real files whole (--read-weights).
"""
from __future__ import annotations

import json
import os
import shutil
import struct
import sys

import pytest

from torchmem import preflight

MiB = 1 << 20

LOAD = """
import ctypes, glob, json, mmap, os, sys, torch
from transformers import AutoModelForCausalLM, Qwen2ForCausalLM  # imported before the reads are counted

FILES = sorted(glob.glob(os.path.join(sys.argv[1], "*.safetensors")))
libc = ctypes.CDLL(None, use_errno=True)

def cached() -> int:
    # Bytes of the weight files in the page cache: what any read, mmap's included, brought in.
    total = 0
    for path in FILES:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            m = mmap.mmap(f.fileno(), size, access=mmap.ACCESS_COPY)
            pages = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE
            vec = (ctypes.c_ubyte * pages)()
            address = ctypes.addressof(ctypes.c_char.from_buffer(m))
            assert libc.mincore(ctypes.c_void_p(address), ctypes.c_size_t(size), vec) == 0, ctypes.get_errno()
            total += sum(v & 1 for v in vec) * mmap.PAGESIZE
            del address
            m.close()
    return total

for path in FILES:  # out of the page cache (the fixture synced them)
    fd = os.open(path, os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)
start = cached()
model = AutoModelForCausalLM.from_pretrained(sys.argv[1], device_map="cuda", dtype=torch.bfloat16)
print(json.dumps({"start": start, "read": cached(),
                  "parameters": sum(p.numel() for p in model.parameters()),
                  "on_device": all(p.is_cuda for p in model.parameters())}))
"""


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    pytest.importorskip("transformers")
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    root = tmp_path_factory.mktemp("weights")
    config = Qwen2Config(vocab_size=32000, hidden_size=512, intermediate_size=1408, num_hidden_layers=4,
                         num_attention_heads=8, num_key_value_heads=2, tie_word_embeddings=False)
    torch.manual_seed(0)
    Qwen2ForCausalLM(config).to(torch.bfloat16).save_pretrained(root / "real")
    for path in (root / "real").glob("*.safetensors"):
        with open(path, "rb+") as f:
            os.fsync(f.fileno())  # written back, so the load can drop it from the page cache
    shutil.copytree(root / "real", root / "sparse")
    files = sorted((root / "sparse").glob("*.safetensors"))
    assert files
    for path in files:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(8)
            head += f.read(struct.unpack("<Q", head)[0])
        with open(path, "wb") as f:
            f.write(head)
            f.truncate(size)  # the same size; the tensors' bytes are a hole that reads as zeros
            os.fsync(f.fileno())
        assert path.stat().st_blocks * 512 < 1 * MiB < size
    return root


def load(root, folder: str, tmp_path, read_weights: bool = False) -> tuple[preflight.Report, dict]:
    script = tmp_path / "load.py"
    script.write_text(LOAD)
    report = preflight.run_command([sys.executable, str(script), str(root / folder)], "l4", advise=False,
                                   out=tmp_path / f"out-{folder}-{read_weights}", capture_output=True,
                                   read_weights=read_weights)
    return report, json.loads(report.captured[0].strip().splitlines()[-1])


def test_from_pretrained_reads_the_headers_alone_and_allocates_as_a_real_load(checkpoints, tmp_path):
    shapes, measured = load(checkpoints, "sparse", tmp_path)
    assert measured["on_device"] and measured["parameters"] > 40_000_000
    weight_bytes = 2 * measured["parameters"]
    assert measured["start"] < 1 * MiB and measured["read"] < 1 * MiB  # the headers' pages alone
    whole, read = load(checkpoints, "real", tmp_path, read_weights=True)
    assert read["start"] < 1 * MiB and read["read"] > weight_bytes // 2  # the real loader reads the bytes
    mine, theirs = shapes.devices[0], whole.devices[0]
    assert (mine.peak_allocated, mine.peak_reserved) == (theirs.peak_allocated, theirs.peak_reserved)
    assert mine.peak_allocated >= weight_bytes
