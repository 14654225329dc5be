"""The config grammar of PYTORCH_CUDA_ALLOC_CONF, and its errors."""
import pytest

import torchmem
from torchmem import _C
from torchmem._install import resolve_conf

from conftest import GiB, MiB


def test_empty_config_is_default():
    assert _C.parse_config("") == ""


@pytest.mark.parametrize(
    "text, normalised",
    [
        ("max_split_size_mb:128", "max_split_size_mb:128"),
        ("garbage_collection_threshold:0.6", "garbage_collection_threshold:0.600000"),
        ("expandable_segments:True", "expandable_segments:True"),
        ("expandable_segments:False", ""),
        ("max_non_split_rounding_mb:64", "max_non_split_rounding_mb:64"),
        (" max_split_size_mb : 64 , expandable_segments:True ", "max_split_size_mb:64,expandable_segments:True"),
        ("backend:native", ""),
        ("capacity:1GiB", f"capacity:{GiB}"),
    ],
)
def test_valid_configs(text, normalised):
    assert _C.parse_config(text) == normalised


@pytest.mark.parametrize(
    "text, fragments",
    [
        ("max_split_size_mb:10", ["max_split_size_mb", "greater than 20"]),
        ("max_split_size_mb:-5", ["max_split_size_mb", "whole number"]),
        ("max_split_size_mb:abc", ["max_split_size_mb"]),
        ("garbage_collection_threshold:1.5", ["garbage_collection_threshold", "between 0.0 and 1.0"]),
        ("garbage_collection_threshold:0", ["garbage_collection_threshold"]),
        ("roundup_power2_divisions:3", ["roundup_power2_divisions", "power of two"]),
        ("roundup_power2_divisions:[256:3]", ["roundup_power2_divisions"]),
        ("roundup_power2_divisions:[256:1", ["unbalanced"]),
        ("expandable_segments:maybe", ["expandable_segments", "True or False"]),
        ("backend:cudaMallocAsync", ["backend", "native"]),
        ("no_such_key:1", ["unknown key 'no_such_key'", "max_split_size_mb", "expandable_segments"]),
        ("max_split_size_mb", ["not key:value"]),
        ("capacity:lots", ["size"]),
        ("per_process_memory_fraction:2", ["per_process_memory_fraction", "(0.0, 1.0]"]),
    ],
)
def test_bad_configs_name_key_and_allowed_values(text, fragments):
    with pytest.raises(ValueError) as info:
        _C.parse_config(text)
    for fragment in fragments:
        assert fragment in str(info.value)


def test_roundup_divisions_list_form():
    # [256:1,512:2,>:8]: below 256 MB no rounding, 512 MB intervals in halves, above in eighths.
    conf = "roundup_power2_divisions:[256:1,512:2,>:8]"
    assert "roundup_power2_divisions:[1:1,2:1" in _C.parse_config(conf)
    a = _C.CachingAllocator(_C.SimDevice(100 * GiB), conf)
    p = a.allocate(600 * MiB)  # 512 MiB interval, two divisions: rounds to 768 MiB
    assert a.segments()[0]["blocks"][0]["size"] == 768 * MiB
    a.deallocate(p)
    p = a.allocate(1100 * MiB)  # 1 GiB interval, eight divisions: 1152 MiB
    assert [b["size"] for s in a.segments() for b in s["blocks"] if b["allocated"]] == [1152 * MiB]


@pytest.mark.parametrize(
    "text, size",
    [("80GiB", 80 * GiB), ("512MB", 512_000_000), ("1.5 GiB", 3 * GiB // 2), ("4096", 4096), ("2M", 2 * MiB)],
)
def test_parse_size(text, size):
    assert _C.parse_size(text) == size


@pytest.mark.parametrize("text", ["", "GiB", "12 parsecs", "-1GiB", "1e30"])
def test_parse_size_rejects(text):
    with pytest.raises(ValueError):
        _C.parse_size(text)


def test_environment_variable_is_read(monkeypatch):
    monkeypatch.setenv("TORCHMEM_ALLOC_CONF", "max_split_size_mb:64")
    assert resolve_conf(None) == "max_split_size_mb:64"
    assert resolve_conf("max_split_size_mb:32") == "max_split_size_mb:32"
    monkeypatch.setenv("TORCHMEM_ALLOC_CONF", "bogus:1")
    with pytest.raises(ValueError, match="bogus"):
        resolve_conf(None)


def test_install_rejects_bad_kind_and_conf():
    with pytest.raises(ValueError, match="unknown allocator kind"):
        torchmem.install(kind="magic")
    with pytest.raises(ValueError, match="unknown key"):
        torchmem.install(conf="nope:1")
    with pytest.raises(TypeError):
        torchmem.install(conf=128)
