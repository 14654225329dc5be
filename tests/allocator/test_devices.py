"""torchmem/runtime/devices.py: the one rule that names a device and the allocator serving it,
on this machine's CPU build; and install(dump_on_oom=...), which checks before it installs."""

import pytest
import torch

from tests.package.test_import_circles import imports_of, package_modules
from tests.support.subprocess_runner import run_python_json

from torchmem.runtime import devices, snapshot
from torchmem.runtime.planned import device_name as planned_device_name

NAMED = [("cpu", "cpu"), (torch.device("cpu"), "cpu"), (0, "cuda:0"), (3, "cuda:3"), ("cuda:2", "cuda:2"),
         (torch.device("cuda", 1), "cuda:1")]
BAD = ["tpu", "cuda:x", "cuda:", "sim", True, -1, 2.0, torch.device("meta")]


@pytest.mark.parametrize("device, name", NAMED, ids=[repr(d) for d, _ in NAMED])
def test_a_device_is_named_by_one_rule_everywhere(device, name):
    assert devices.device_name(device) == name
    assert planned_device_name(device) == name
    assert snapshot._device_key(device) == (("cpu", 0) if name == "cpu" else ("cuda", int(name[5:])))


@pytest.mark.skipif(devices.cuda_installed(), reason="torchmem is installed on CUDA in this process")
def test_none_is_the_cpu_while_torchmem_is_not_installed_on_cuda():
    assert devices.device_name(None) == "cpu"
    assert devices.caching_allocator(None) is devices.caching_allocator("cpu")


@pytest.mark.parametrize("device", BAD, ids=repr)
def test_what_names_no_device_is_refused_in_words(device):
    with pytest.raises(ValueError, match="expected 'cpu', 'cuda', 'cuda:N'|not negative"):
        devices.device_name(device)
    with pytest.raises(ValueError, match="torchmem manages the CPU"):
        devices.caching_allocator(device)


@pytest.mark.skipif(devices.cuda_installed(), reason="torchmem is installed on CUDA in this process")
@pytest.mark.parametrize("device", [0, "cuda", "cuda:1", torch.device("cuda")], ids=repr)
def test_a_cuda_device_is_refused_while_torchmem_is_not_installed_there(device):
    with pytest.raises(ValueError, match="not installed on CUDA"):
        devices.caching_allocator(device)


def test_install_refuses_a_bad_dump_template_first_and_then_dumps(tmp_path):
    template = str(tmp_path / "oom_{pid}.pickle")
    out = run_python_json(f"""
        import json, torchmem
        from torchmem.runtime import devices
        from torchmem.runtime.oom import dump
        refused = ""
        try:
            torchmem.install(dump_on_oom="oom_{{step}}.pickle")  # the hook's check runs before anything is installed
        except ValueError as e:
            refused = str(e)
        installed_after_refusal = devices.cpu_installed() or devices.cuda_installed()
        torchmem.install(dump_on_oom={template!r})
        print(json.dumps({{"refused": refused, "installed_after_refusal": installed_after_refusal,
                          "dumping": dump.dumping()}}))
    """)
    assert "unknown placeholder {step}" in out["refused"] and not out["installed_after_refusal"]
    assert out["dumping"]["backend"] == ("torchmem-cuda" if torch.cuda.is_available() else "torchmem-cpu")
    assert out["dumping"]["path"] == template


def test_devices_reads_nothing_of_torchmem_but_the_extension():
    modules = package_modules()
    path, is_init = modules["torchmem.runtime.devices"]
    assert imports_of("torchmem.runtime.devices", path, is_init, modules) == {}
