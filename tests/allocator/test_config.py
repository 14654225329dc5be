"""The config grammar of PYTORCH_CUDA_ALLOC_CONF, and its errors.

The rules are PyTorch's (2.13): c10/core/AllocatorConfig.cpp
(AcceleratorAllocatorConfig::parseArgs and its parse* helpers, ConfigTokenizer
in AllocatorConfig.h) for the device-independent keys, and
c10/cuda/CUDAAllocatorConfig.cpp (CUDAAllocatorConfig::parseArgs) for the CUDA
ones and for unknown keys. What PyTorch accepts, torchmem accepts; what it
rejects, torchmem rejects, with a message that names the key and what it
takes. test_grammar_agrees_with_the_installed_pytorch runs c10's own parser on
the same strings. Where torchmem knowingly differs, the case says "torchmem:".
"""
import json
import os
import re
import shutil
import subprocess

import pytest

import torchmem
from torchmem import _core
from torchmem.runtime.devices import resolve_conf

from tests.support.sim import GiB, MiB

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tests/, whose cpp/ holds the probe


def test_empty_config_is_default():
    assert _core.parse_config("") == ""


@pytest.mark.parametrize(
    "text, normalised",
    [
        # parseMaxSplitSize: MB, at least large_segment_size / 1 MiB = 20, inclusive (val_env >= min).
        ("max_split_size_mb:128", "max_split_size_mb:128"),
        ("max_split_size_mb:20", "max_split_size_mb:20"),
        # parseGarbageCollectionThreshold: std::stod, so ".5" and "5e-1" are numbers.
        ("garbage_collection_threshold:0.6", "garbage_collection_threshold:0.600000"),
        ("garbage_collection_threshold:.5", "garbage_collection_threshold:0.500000"),
        ("garbage_collection_threshold:5e-1", "garbage_collection_threshold:0.500000"),
        ("expandable_segments:True", "expandable_segments:True"),
        ("expandable_segments:False", ""),
        # parseMaxNonSplitRoundingSize: same bounds; its default is large_segment_size (20 MiB), so 20 is
        # the default and normalises away.
        ("max_non_split_rounding_mb:64", "max_non_split_rounding_mb:64"),
        ("max_non_split_rounding_mb:20", ""),
        # parseLargeSegmentSize: MB, greater than kMinLargeAlloc / 1 MiB = 10. It is read before the other
        # keys, wherever it stands, and raises the least max_split_size_mb to itself.
        ("large_segment_size_mb:11", "large_segment_size_mb:11"),
        ("max_split_size_mb:40,large_segment_size_mb:40", "large_segment_size_mb:40,max_split_size_mb:40"),
        # ConfigTokenizer drops whitespace; one trailing comma ends the list.
        (" max_split_size_mb : 64 , expandable_segments:True ", "max_split_size_mb:64,expandable_segments:True"),
        ("max_split_size_mb:64,", "max_split_size_mb:64"),
        # A later key wins (each parse* overwrites).
        ("max_split_size_mb:64,max_split_size_mb:128", "max_split_size_mb:128"),
        # CUDAAllocatorConfig::parsePerProcessMemoryFraction: [0.0, 1.0]; 1.0 (the default) is no limit.
        ("per_process_memory_fraction:0.5", "per_process_memory_fraction:0.500000"),
        ("per_process_memory_fraction:0", "per_process_memory_fraction:0.000000"),
        ("per_process_memory_fraction:1.0", ""),
        # parseRoundUpPower2Divisions: an empty list is no rounding.
        ("roundup_power2_divisions:[]", ""),
        ("backend:native", ""),
        # CUDAAllocatorConfig keys of PyTorch's pinned host allocator, CUDA graphs and lock handling:
        # torchmem checks them as PyTorch does and has nothing to set (no pinned allocator; it holds its
        # lock on device calls).
        ("release_lock_on_cudamalloc:True", ""),
        ("pinned_use_cuda_host_register:False", ""),
        ("pinned_num_register_threads:8", ""),
        ("pinned_reserve_segment_size_mb:64", ""),
        ("pinned_free_catch_all:True", ""),
        ("graph_capture_record_stream_reuse:True", ""),
        ("throw_on_cudamalloc_oom:False", ""),
        ("pinned_use_background_threads:True,pinned_max_round_threshold_mb:0,pinned_max_cached_size_mb:64", ""),
        # torchmem's own key (PyTorch has none): the simulated or host device's capacity.
        ("capacity:1GiB", f"capacity:{GiB}"),
    ],
)
def test_valid_configs(text, normalised):
    assert _core.parse_config(text) == normalised


@pytest.mark.parametrize(
    "text, fragments",
    [
        # parseMaxSplitSize / parseMaxNonSplitRoundingSize: "too small, must be >= 20".
        ("max_split_size_mb:10", ["max_split_size_mb", "at least 20"]),
        ("max_split_size_mb:19", ["max_split_size_mb", "at least 20"]),
        ("max_non_split_rounding_mb:19", ["max_non_split_rounding_mb", "at least 20"]),
        ("large_segment_size_mb:40,max_split_size_mb:30", ["max_split_size_mb", "at least 40"]),
        ("large_segment_size_mb:40,max_non_split_rounding_mb:30", ["max_non_split_rounding_mb", "at least 40"]),
        # parseLargeSegmentSize: "must be > 10 MB".
        ("large_segment_size_mb:10", ["large_segment_size_mb", "greater than 10"]),
        # std::stoull throws on these in PyTorch too.
        ("max_split_size_mb:abc", ["max_split_size_mb"]),
        ("max_split_size_mb:99999999999999999999999", ["max_split_size_mb"]),
        # torchmem: stricter than PyTorch, which reads a prefix with std::stoull (-5 wraps to 2^64 - 5, an
        # unlimited max_split_size; "64MB" is 64) or std::stod ("0.6x" is 0.6).
        ("max_split_size_mb:-5", ["max_split_size_mb", "whole number"]),
        ("max_split_size_mb:64MB", ["max_split_size_mb", "whole number"]),
        ("garbage_collection_threshold:0.6x", ["garbage_collection_threshold"]),
        # parseGarbageCollectionThreshold: (0.0, 1.0), both ends open.
        ("garbage_collection_threshold:1.5", ["garbage_collection_threshold", "strictly between 0.0 and 1.0"]),
        ("garbage_collection_threshold:0", ["garbage_collection_threshold"]),
        ("garbage_collection_threshold:1", ["garbage_collection_threshold"]),
        # parseRoundUpPower2Divisions: one value must be a power of two (isPowerOf2_64(0) is false); list
        # divisions 0 or a power of two; list intervals a power of two.
        ("roundup_power2_divisions:3", ["roundup_power2_divisions", "power of two"]),
        ("roundup_power2_divisions:0", ["roundup_power2_divisions", "power of two"]),
        ("roundup_power2_divisions:[256:3]", ["roundup_power2_divisions"]),
        ("roundup_power2_divisions:[300:2]", ["roundup_power2_divisions", "powers of two"]),
        ("roundup_power2_divisions:[0:4]", ["roundup_power2_divisions", "powers of two"]),
        ("roundup_power2_divisions:[256:1", ["unbalanced"]),  # PyTorch: "Expected closing bracket ']'"
        # ConfigTokenizer::toBool takes exactly "True" and "False".
        ("expandable_segments:maybe", ["expandable_segments", "True or False"]),
        ("expandable_segments:true", ["expandable_segments", "True or False"]),
        ("expandable_segments:1", ["expandable_segments", "True or False"]),
        ("release_lock_on_cudamalloc:yes", ["release_lock_on_cudamalloc", "True or False"]),
        # torchmem: PyTorch also takes backend:cudaMallocAsync; torchmem is the native policy only.
        ("backend:cudaMallocAsync", ["backend", "native"]),
        # CUDAAllocatorConfig::parseArgs: "Unrecognized key"; an empty item is the key ",".
        ("no_such_key:1", ["unknown key 'no_such_key'", "max_split_size_mb", "expandable_segments"]),
        ("max_split_size_mb:64,,expandable_segments:True", ["empty item"]),
        (",max_split_size_mb:64", ["empty item"]),
        ("max_split_size_mb", ["not key:value"]),
        # parsePerProcessMemoryFraction: [0.0, 1.0].
        ("per_process_memory_fraction:2", ["per_process_memory_fraction", "[0.0, 1.0]"]),
        ("per_process_memory_fraction:-0.1", ["per_process_memory_fraction", "[0.0, 1.0]"]),
        # parsePinnedNumRegisterThreads: a power of two, at most pinned_max_register_threads() = 128.
        ("pinned_num_register_threads:3", ["pinned_num_register_threads", "power of two"]),
        ("pinned_num_register_threads:256", ["pinned_num_register_threads", "at most 128"]),
        # parsePinnedReserveSegmentSize: greater than 0.
        ("pinned_reserve_segment_size_mb:0", ["pinned_reserve_segment_size_mb", "greater than 0"]),
        ("capacity:lots", ["size"]),  # torchmem's own key
    ],
)
def test_bad_configs_name_key_and_allowed_values(text, fragments):
    with pytest.raises(ValueError) as info:
        _core.parse_config(text)
    for fragment in fragments:
        assert fragment in str(info.value)


def divisions(conf: str) -> list:
    """The 16 per-interval divisions torchmem parsed (intervals 1 MiB, 2 MiB, ... 32 GiB and above)."""
    m = re.search(r"roundup_power2_divisions:\[([^\]]*)\]", _core.parse_config(conf))
    if not m:
        return [0] * 16
    pairs = [item.split(":") for item in m.group(1).split(",")]
    assert [int(mb) for mb, _ in pairs] == [1 << i for i in range(16)]
    return [int(d) for _, d in pairs]


@pytest.mark.parametrize(
    "conf, expected",
    [
        # Hand-derived from parseRoundUpPower2Divisions (index = log2(MB), clamped to 15):
        # one value fills every interval.
        ("roundup_power2_divisions:4", [4] * 16),
        # the first entry also fills the intervals below it; ">" fills from after the last one named.
        ("roundup_power2_divisions:[256:1,512:2,>:8]", [1] * 9 + [2] + [8] * 6),
        ("roundup_power2_divisions:[256:1,>:8]", [1] * 9 + [8] * 7),
        # ">" first: nothing named yet, last_index is 0, so it fills from interval 1; interval 0 keeps 0.
        ("roundup_power2_divisions:[>:8]", [0] + [8] * 15),
        ("roundup_power2_divisions:[2048:4,1:8]", [8] + [4] * 11 + [0] * 4),
        ("roundup_power2_divisions:[128:4]", [4] * 8 + [0] * 8),
        ("roundup_power2_divisions:[1048576:4]", [4] * 16),  # 2^20 MB: index 20 clamps to 15
        ("roundup_power2_divisions:[256:1,]", [1] * 9 + [0] * 7),  # one trailing comma in the list
    ],
)
def test_roundup_divisions_list_semantics(conf, expected):
    assert divisions(conf) == expected


def test_roundup_divisions_list_form():
    # [256:1,512:2,>:8]: below 512 MB no rounding (1 division), the 512 MB interval in halves, above it
    # in eighths (roundup_power2_divisions(size) picks interval log2(size) - 20).
    conf = "roundup_power2_divisions:[256:1,512:2,>:8]"
    a = _core.CachingAllocator(_core.SimDevice(100 * GiB), conf)
    p = a.allocate(600 * MiB)  # 512 MiB interval, two divisions: 512 + 256 -> 768 MiB
    assert a.segments()[0]["blocks"][0]["size"] == 768 * MiB
    a.deallocate(p)
    a.allocate(1100 * MiB)  # 1 GiB interval, eight divisions of 128 MiB: 1152 MiB
    assert [b["size"] for s in a.segments() for b in s["blocks"] if b["allocated"]] == [1152 * MiB]
    # [>:8]: interval 0 (up to 2 MiB) keeps no rounding: 1_300_000 -> 512 B multiple 1_300_480; interval
    # 1 (2 to 4 MiB) in eighths of 2 MiB: 2_600_000 -> 2 MiB + 2 x 256 KiB = 2_621_440.
    b = _core.CachingAllocator(_core.SimDevice(100 * GiB), "roundup_power2_divisions:[>:8]")
    sizes = []
    for request in (1_300_000, 2_600_000):
        p = b.allocate(request)
        sizes.append(next(blk["size"] for s in b.segments() for blk in s["blocks"] if blk["address"] == p))
    assert sizes == [1_300_480, 2_621_440]


# --- the same strings through PyTorch's own parser -----------------------------------------

# Device-independent keys only: a CPU-only libc10 has no CUDA parser hook, so it skips unknown keys and
# CUDA keys unchecked. Strings PyTorch reads by prefix (torchmem: rejected) are left out; they are above.
DIFFERENTIAL = [
    "",
    "max_split_size_mb:128", "max_split_size_mb:20", "max_split_size_mb:19", "max_split_size_mb:abc",
    "max_split_size_mb:100000000000000000", "max_split_size_mb:99999999999999999999999",
    "max_non_split_rounding_mb:64", "max_non_split_rounding_mb:20", "max_non_split_rounding_mb:19",
    "large_segment_size_mb:11", "large_segment_size_mb:10", "large_segment_size_mb:40,max_split_size_mb:40",
    "max_split_size_mb:30,large_segment_size_mb:40", "large_segment_size_mb:40,max_non_split_rounding_mb:30",
    "large_segment_size_mb:64,max_non_split_rounding_mb:100",
    "garbage_collection_threshold:0.6", "garbage_collection_threshold:.5", "garbage_collection_threshold:5e-1",
    "garbage_collection_threshold:0", "garbage_collection_threshold:1", "garbage_collection_threshold:1.5",
    "garbage_collection_threshold:nan", "garbage_collection_threshold:inf",
    "expandable_segments:True", "expandable_segments:False", "expandable_segments:true",
    "expandable_segments:1", "expandable_segments:maybe",
    "roundup_power2_divisions:4", "roundup_power2_divisions:1", "roundup_power2_divisions:0",
    "roundup_power2_divisions:3", "roundup_power2_divisions:[256:1,512:2,>:8]", "roundup_power2_divisions:[>:8]",
    "roundup_power2_divisions:[256:1,>:8]", "roundup_power2_divisions:[2048:4,1:8]",
    "roundup_power2_divisions:[1048576:4]", "roundup_power2_divisions:[128:4]", "roundup_power2_divisions:[]",
    "roundup_power2_divisions:[256:1,]", "roundup_power2_divisions:[256:0]", "roundup_power2_divisions:[>:0]",
    "roundup_power2_divisions:[0:4]", "roundup_power2_divisions:[300:2]", "roundup_power2_divisions:[256:3]",
    "roundup_power2_divisions:[256:1",
    " max_split_size_mb : 64 , expandable_segments:True ", "max_split_size_mb:64,",
    "max_split_size_mb:100,max_non_split_rounding_mb:20,garbage_collection_threshold:0.5,"
    "roundup_power2_divisions:[64:8,256:4,1024:4,>:1],expandable_segments:True",
    "pinned_use_background_threads:True", "pinned_use_background_threads:1",
    "pinned_max_round_threshold_mb:0", "pinned_max_cached_size_mb:abc",
]


@pytest.fixture(scope="module")
def c10_parser(tmp_path_factory):
    """tests/cpp/c10_config_probe.cpp built against the installed torch's c10 (skips without a compiler)."""
    torch = pytest.importorskip("torch")
    compiler = shutil.which("c++") or shutil.which("g++")
    if compiler is None:
        pytest.skip("no C++ compiler")
    torch_dir = os.path.dirname(torch.__file__)
    binary = str(tmp_path_factory.mktemp("c10probe") / "c10_config_probe")
    build = subprocess.run(
        [compiler, "-std=c++17", "-O0", "-I", os.path.join(torch_dir, "include"),
         os.path.join(TESTS, "cpp", "c10_config_probe.cpp"), "-L", os.path.join(torch_dir, "lib"), "-lc10",
         "-Wl,-rpath," + os.path.join(torch_dir, "lib"), "-o", binary],
        capture_output=True, text=True)
    if build.returncode != 0:  # a torch without AcceleratorAllocatorConfig (before 2.9)
        pytest.skip("cannot build against this torch's c10: " + build.stderr[-300:])
    keys = subprocess.run([binary], capture_output=True, text=True, check=True).stdout.split()[1:]
    return binary, set(keys)


def native_decisions(binary: str, conf: str):
    out = subprocess.run([binary, conf], capture_output=True, text=True, check=True).stdout.split()
    if out[0] == "REJECT":
        return None
    large, split, rounding = (int(v) for v in out[1:4])
    return {"large": large, "split": split, "rounding": rounding, "gc": float(out[4]),
            "expandable": out[5] == "1", "divisions": [int(v) for v in out[6:22]]}


def torchmem_decisions(conf: str):
    try:
        text = _core.parse_config(conf)
    except ValueError:
        return None
    values = dict(re.findall(r"(\w+):(\[[^\]]*\]|[^,]*)", text))
    large = int(values.get("large_segment_size_mb", 20)) * MiB
    return {
        "large": large,
        "split": int(values["max_split_size_mb"]) * MiB if "max_split_size_mb" in values else 2**64 - 1,
        "rounding": int(values["max_non_split_rounding_mb"]) * MiB if "max_non_split_rounding_mb" in values else large,
        "gc": float(values.get("garbage_collection_threshold", 0.0)),
        "expandable": values.get("expandable_segments") == "True",
        "divisions": divisions(conf),
    }


def test_grammar_agrees_with_the_installed_pytorch(c10_parser):
    binary, keys = c10_parser
    checked = 0
    for conf in DIFFERENTIAL:
        if "large_segment_size_mb" in conf and "large_segment_size_mb" not in keys:
            continue  # a torch from before the key
        native, ours = native_decisions(binary, conf), torchmem_decisions(conf)
        assert (ours is None) == (native is None), f"{conf!r}: PyTorch {'rejects' if native is None else 'accepts'} it"
        if native is not None:
            assert ours.pop("gc") == pytest.approx(native.pop("gc")), conf
            assert ours == native, conf
        checked += 1
    assert checked >= len(DIFFERENTIAL) - 6


# --- torchmem's own parts: sizes, the environment variable, install() ------------------------

@pytest.mark.parametrize(
    "text, size",
    [("80GiB", 80 * GiB), ("512MB", 512_000_000), ("1.5 GiB", 3 * GiB // 2), ("4096", 4096), ("2M", 2 * MiB)],
)
def test_parse_size(text, size):
    # torchmem's capacity grammar (PyTorch has none): decimal MB/GB, binary MiB/GiB and M/G.
    assert _core.parse_size(text) == size


@pytest.mark.parametrize("text", ["", "GiB", "12 parsecs", "-1GiB", "1e30"])
def test_parse_size_rejects(text):
    with pytest.raises(ValueError):
        _core.parse_size(text)


def test_environment_variable_is_read(monkeypatch):
    # torchmem reads TORCHMEM_ALLOC_CONF (not PyTorch's variables, which configure PyTorch's own allocator).
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


# --- PyTorch's two settings variables (torchmem/pytorch_env.py) ------------------------------

@pytest.mark.parametrize("env", [
    {"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:64"},
    {"PYTORCH_ALLOC_CONF": "expandable_segments:True"},
    {"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:64", "PYTORCH_ALLOC_CONF": "expandable_segments:True"},
])
def test_pytorch_variables_are_read_in_pytorchs_order(env):
    """The installed torch says which variable it runs with; torchmem names the same one."""
    from torchmem.pytorch_env import pytorch_conf

    from tests.support.subprocess_runner import ok, run_python

    proc = ok(run_python("import torch; f = getattr(torch._C, '_accelerator_getAllocatorSettings', None); "
                         "print('MISSING' if f is None else f())", env, 120,
                         drop_env=[k for k in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF") if k not in env]))
    if proc.stdout.strip() == "MISSING":
        pytest.skip("this torch does not report its allocator settings (_accelerator_getAllocatorSettings)")
    assert pytorch_conf(env) is not None and pytorch_conf(env)[1] == proc.stdout.strip()


def test_recorded_settings_are_read_under_either_name():
    from torchmem.replay import recorded_conf

    assert recorded_conf({"PYTORCH_CUDA_ALLOC_CONF": "max_non_split_rounding_mb:64"}) == "max_non_split_rounding_mb:64"
    assert recorded_conf({"PYTORCH_ALLOC_CONF": "max_non_split_rounding_mb:64"}) == "max_non_split_rounding_mb:64"
    both = {"PYTORCH_CUDA_ALLOC_CONF": "max_non_split_rounding_mb:64", "PYTORCH_ALLOC_CONF": "large_segment_size_mb:40"}
    assert recorded_conf(both) == "max_non_split_rounding_mb:64"


def test_replay_notes_the_variable_it_does_not_use(tmp_path, monkeypatch, capsys):
    import pickle

    from torchmem.cli import main

    path = tmp_path / "s.pickle"
    path.write_bytes(pickle.dumps({"segments": [], "device_traces": [[
        {"action": "alloc", "addr": 2**40, "size": 512, "stream": 0},
        {"action": "free_requested", "addr": 2**40, "size": 512, "stream": 0},
        {"action": "free_completed", "addr": 2**40, "size": 512, "stream": 0}]]}))
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    monkeypatch.setenv("PYTORCH_ALLOC_CONF", "expandable_segments:True")
    assert main(["replay", str(path), "--no-progress"]) == 0
    assert "Note: PYTORCH_ALLOC_CONF=expandable_segments:True is set here" in capsys.readouterr().out
    assert main(["replay", str(path), "--no-progress", "--conf", "expandable_segments:True"]) == 0
    assert "is set here" not in capsys.readouterr().out


# Keys of PyTorch's CUDA parser (c10/cuda/CUDAAllocatorConfig.cpp), checked on torch 2.14.1+cu130 with
# torch._C._accelerator_setAllocatorSettings: every one it accepts, torchmem accepts (and checks its value).
# expandable_segments_handle_type appears in libc10_cuda only in an error message's advice; the parser
# rejects it ("Unrecognized key"), and so does torchmem. A CPU torch accepts any key, so no oracle here.
@pytest.mark.parametrize("conf, accepted", [
    ("graph_capture_record_stream_reuse:True", True), ("throw_on_cudamalloc_oom:True", True),
    ("pinned_reserve_segment_size_mb:64", True), ("pinned_free_catch_all:True", True),
    ("pinned_use_background_threads:True", True), ("release_lock_on_hipmalloc:True", True),
    ("expandable_segments_handle_type:posix_fd", False), ("release_expandable_segment:True", False),
    ("free_safe_blocks_in_capture:True", False),
])
def test_cuda_parser_keys_as_pytorch_2_14(conf, accepted):
    if accepted:
        _core.parse_config(conf)
        with pytest.raises(ValueError, match=conf.split(":")[0]):
            _core.parse_config(conf.split(":")[0] + ":maybe")
    else:
        with pytest.raises(ValueError, match=f"unknown key '{conf.split(':')[0]}'"):
            _core.parse_config(conf)


def test_a_cpu_install_names_the_pytorch_variable_it_does_not_apply():
    """install() on the CPU reads TORCHMEM_ALLOC_CONF; PyTorch's variable (either name, PyTorch's order) is
    named as not applied, with torchmem's variable to use instead, and nothing is said once that one is set."""
    from tests.support.subprocess_runner import run_python_json

    code = """
        import json, warnings, torchmem
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torchmem.install()
        print(json.dumps([str(w.message) for w in caught if "is not applied" in str(w.message)]))
    """
    keys = ("TORCHMEM_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")
    cases = [({"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:64"}, "PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:64"),
             ({"PYTORCH_ALLOC_CONF": "expandable_segments:True"}, "PYTORCH_ALLOC_CONF=expandable_segments:True"),
             ({"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:64", "PYTORCH_ALLOC_CONF": "expandable_segments:True"},
              "PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:64"),
             # the user chose torchmem's variable: no warning
             ({"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:64", "TORCHMEM_ALLOC_CONF": "max_split_size_mb:128"}, None)]
    for env, named in cases:
        messages = run_python_json(code, env, 120, drop_env=[key for key in keys if key not in env])
        if named is None:
            assert messages == [], env
            continue
        [message] = messages
        assert message.startswith(f"torchmem.install(): {named} is not applied"), message
        assert "torchmem reads TORCHMEM_ALLOC_CONF" in message, message
