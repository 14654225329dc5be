"""Where torchmem's CUDA allocator takes its settings from (Note [Settings on CUDA] in torchmem/runtime/cuda.py), and
which variable each torch release's CUDA allocator reads (Note [PyTorch's settings variables] in
torchmem/pytorch_env.py). Pure functions of an environment: no GPU needed. The fake-GPU tier runs the same
precedence against PyTorch's own allocator (tests/cuda/test_install_honours_settings.py)."""
from __future__ import annotations

import os
import re
import warnings

import pytest
import torch

from torchmem.runtime import cuda as tmcuda
from torchmem.pytorch_env import conf_items, cuda_conf_vars, cuda_pytorch_conf


@pytest.fixture(autouse=True)
def fresh_process(monkeypatch):
    """Each test is a fresh process as far as the once-only messages go."""
    monkeypatch.setattr(tmcuda, "_SAID", set())


def settings(conf: str | None, environ: dict[str, str]) -> tuple[str, list[str]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        text = tmcuda.cuda_settings(conf, environ)
    return text, [str(w.message) for w in caught]


def test_installed_torch_reads_the_variables_in_the_order_its_header_says():
    """The installed torch ships c10/cuda/CUDAAllocatorConfig.h, whose CUDAAllocatorConfig::instance() reads
    the variables (PYTORCH_HIP_ALLOC_CONF only on ROCm): its order is cuda_conf_vars()'s."""
    header = os.path.join(os.path.dirname(torch.__file__), "include", "c10", "cuda", "CUDAAllocatorConfig.h")
    if not os.path.exists(header):
        pytest.skip("this torch ships no c10/cuda headers")
    text = open(header, encoding="utf-8").read()
    start = text.index("CUDAAllocatorConfig& instance()")
    body = text[start:text.index("return *s_instance;", start)]
    body = re.sub(r"#ifdef USE_ROCM.*?#endif", "", body, flags=re.S)
    read = tuple(re.findall(r'(?:get_env|getenv)\("(PYTORCH_\w+_CONF)"\)', body))
    assert read == cuda_conf_vars()


@pytest.mark.parametrize("version, variables", [
    ("2.6.0+cu124", ("PYTORCH_CUDA_ALLOC_CONF",)),
    ("2.9.1+cu128", ("PYTORCH_CUDA_ALLOC_CONF",)),
    ("2.10.0+cu128", ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")),
    ("2.14.1", ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")),
])
def test_releases_before_2_10_read_only_the_cuda_variable(version, variables):
    assert cuda_conf_vars(version) == variables
    both = {"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:64", "PYTORCH_ALLOC_CONF": "expandable_segments:True"}
    assert cuda_pytorch_conf(both, version) == ("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:64")
    only_new = {"PYTORCH_ALLOC_CONF": "expandable_segments:True"}
    found = cuda_pytorch_conf(only_new, version)
    assert found == (("PYTORCH_ALLOC_CONF", "expandable_segments:True") if len(variables) == 2 else None)
    # An empty PYTORCH_CUDA_ALLOC_CONF is set: PyTorch reads it, and not the other.
    assert cuda_pytorch_conf({"PYTORCH_CUDA_ALLOC_CONF": "", **only_new}, version) == ("PYTORCH_CUDA_ALLOC_CONF", "")


def test_conf_items_keep_lists_whole():
    assert conf_items("a:1, roundup_power2_divisions:[256:1,>:4],b:2,") == \
        ["a:1", "roundup_power2_divisions:[256:1,>:4]", "b:2"]
    assert conf_items("  ") == []


@pytest.mark.parametrize("text", ["a:1,,b:2", "roundup_power2_divisions:[256:1", "a:1]"])
def test_conf_items_refuse_what_pytorch_refuses(text):
    with pytest.raises(ValueError, match="empty item|unbalanced"):
        conf_items(text)


def test_the_argument_then_torchmem_variable_then_pytorchs():
    both = {"TORCHMEM_ALLOC_CONF": "max_split_size_mb:128", "PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:64"}
    text, said = settings("max_split_size_mb:32", both)
    assert text == "max_split_size_mb:32"
    [message] = said
    assert "PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:64 is not applied" in message
    assert "install(conf=...) takes precedence" in message

    tmcuda._SAID.clear()
    text, said = settings(None, both)
    assert text == "max_split_size_mb:128"
    [message] = said
    assert "TORCHMEM_ALLOC_CONF takes precedence" in message

    tmcuda._SAID.clear()
    text, said = settings(None, {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"})
    assert text == "expandable_segments:True"
    [message] = said
    assert "takes its settings from PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True" in message

    text, said = settings(None, {})
    assert (text, said) == ("", [])


def test_an_empty_torchmem_variable_is_unset():
    text, said = settings(None, {"TORCHMEM_ALLOC_CONF": "", "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"})
    assert text == "expandable_segments:True" and len(said) == 1


def test_the_same_setting_in_both_is_not_reported():
    same = {"TORCHMEM_ALLOC_CONF": "expandable_segments:True", "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
    assert settings(None, same) == ("expandable_segments:True", [])


def test_where_the_settings_came_from_is_said_once_per_process():
    env = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True,release_lock_on_cudamalloc:True"}
    _, first = settings(None, env)
    _, second = settings(None, env)
    assert len(first) == 2 and second == []


@pytest.mark.parametrize("item", ["release_lock_on_cudamalloc:True", "graph_capture_record_stream_reuse:True",
                                  "throw_on_cudamalloc_oom:True"])
def test_a_key_torchmem_ignores_is_named_from_either_source(item):
    for conf, env, source in ((f"max_split_size_mb:64,{item}", {}, "install(conf=...)"),
                              (None, {"TORCHMEM_ALLOC_CONF": item}, "TORCHMEM_ALLOC_CONF"),
                              (None, {"PYTORCH_CUDA_ALLOC_CONF": item}, "PYTORCH_CUDA_ALLOC_CONF")):
        tmcuda._SAID.clear()
        _, said = settings(conf, env)
        [named] = [m for m in said if "not honoured" in m]
        assert f"{source}: not honoured by torchmem's CUDA allocator: {item} (" in named


def test_pinned_keys_are_honoured_by_pytorch_only_from_its_variable():
    _, said = settings(None, {"PYTORCH_CUDA_ALLOC_CONF": "pinned_use_background_threads:True"})
    assert not [m for m in said if "not honoured" in m]
    _, said = settings("pinned_use_background_threads:True", {})
    [named] = said
    assert "pinned_use_background_threads:True (PyTorch's pinned-memory allocator" in named


def test_from_pytorchs_variable_an_other_backend_or_unknown_key_is_named_and_skipped():
    env = {"PYTORCH_CUDA_ALLOC_CONF": "backend:cudaMallocAsync,expandable_segments:True,future_key:1"}
    text, said = settings(None, env)
    assert text == "expandable_segments:True"
    [named] = [m for m in said if "not honoured" in m]
    assert "backend:cudaMallocAsync (torchmem is a caching allocator" in named
    assert "future_key:1 (torchmem does not know this key)" in named


def test_given_to_torchmem_an_other_backend_or_unknown_key_is_an_error():
    with pytest.raises(ValueError, match="install\\(conf=...\\): .*backend"):
        settings("backend:cudaMallocAsync", {})
    with pytest.raises(ValueError, match="TORCHMEM_ALLOC_CONF: .*unknown key 'future_key'"):
        settings(None, {"TORCHMEM_ALLOC_CONF": "future_key:1"})


def test_a_bad_value_in_pytorchs_variable_is_an_error_naming_it():
    with pytest.raises(ValueError, match="PYTORCH_CUDA_ALLOC_CONF: .*expandable_segments"):
        settings(None, {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:maybe"})


def test_a_conf_that_is_not_a_string_is_refused():
    with pytest.raises(TypeError):
        tmcuda.cuda_settings(128, {})  # type: ignore[arg-type]
