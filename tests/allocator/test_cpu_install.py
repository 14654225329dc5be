"""torchmem.install() on the CPU. Each test swaps PyTorch's allocator in a
fresh interpreter, so a failure cannot take the test runner down with it."""
import json

import pytest

from tests.support.subprocess_runner import run_ok, run_python


def test_install_routes_torch_allocations_and_uninstall_restores():
    out = run_ok(
        """
        import json, torch, torchmem
        before = torch.empty(0).untyped_storage()  # made by PyTorch's own allocator
        old = torch.ones(1000)
        torchmem.install()
        assert torchmem.installed()
        x = torch.empty(1000, 1000)
        r = {"allocated": torchmem.memory_allocated(), "reserved": torchmem.memory_reserved()}
        owner = torchmem.caching_allocator()
        r["owned"] = owner.owns(x.data_ptr())
        del old  # made before install: freed by the previous allocator
        del x
        r["after_free"] = torchmem.memory_allocated()
        torchmem.uninstall()
        y = torch.empty(1000, 1000)
        r["owned_after_uninstall"] = owner.owns(y.data_ptr())
        owner.check_invariants()
        print(json.dumps(r))
        """
    )
    r = json.loads(out)
    assert r["allocated"] == 4_000_000  # a multiple of 64 (min_block_size:64, the CPU default)
    assert r["reserved"] == 20 * 1024 * 1024
    assert r["owned"] is True
    assert r["after_free"] == 0
    assert r["owned_after_uninstall"] is False


def test_oneDNN_and_raw_deleter_paths_survive():
    run_ok(
        """
        import torch, torchmem
        torchmem.install()
        a = torchmem.caching_allocator()
        x = torch.randn(64, 256)
        before = a.stats()["allocation"]["all"]["allocated"]
        for _ in range(3):
            y = torch.nn.functional.gelu(x)
            z = torch.nn.functional.conv1d(x.unsqueeze(0), torch.randn(8, 64, 3))
        # Routed: the outputs are torchmem's blocks, and every op's allocations were counted.
        assert a.owns(x.data_ptr()) and a.owns(y.data_ptr()) and a.owns(z.data_ptr())
        assert a.stats()["allocation"]["all"]["allocated"] - before >= 9
        a.check_invariants()
        """
    )


def test_tensor_outliving_uninstall_is_freed_by_torchmem():
    run_ok(
        """
        import torch, torchmem
        torchmem.install()
        x = torch.randn(1 << 20)
        owner = torchmem.caching_allocator()
        torchmem.uninstall()
        x.resize_(1 << 21)  # the storage keeps using the allocator that made it
        del x
        assert owner.stats()["allocation"]["all"]["current"] == 0
        owner.check_invariants()
        """
    )


def test_reinstall_with_new_config_keeps_old_tensors_valid():
    run_ok(
        """
        import torch, torchmem
        torchmem.install()
        x = torch.arange(1000.0)
        old = torchmem.caching_allocator()
        torchmem.install(conf="max_split_size_mb:64")
        new = torchmem.caching_allocator()
        assert new is not old and new.config == "max_split_size_mb:64,reuse_order:recent,min_block_size:64"
        assert float(x.sum()) == 499500.0
        del x
        assert old.stats()["allocation"]["all"]["current"] == 0
        """
    )


def test_out_of_memory_raises_torch_error_with_figures():
    out = run_ok(
        """
        import torch, torchmem
        torchmem.install(conf="capacity:256MiB")
        keep = torch.empty(150 * 2**20, dtype=torch.uint8)
        try:
            torch.empty(200 * 2**20, dtype=torch.uint8)
        except torch.OutOfMemoryError as e:
            print(e)
        assert torchmem.memory_stats()["num_ooms"] == 1
        small = torch.empty(10 * 2**20, dtype=torch.uint8)  # the next request that fits succeeds
        torchmem.caching_allocator().check_invariants()
        """
    )
    assert "Tried to allocate 200.00 MiB" in out
    assert "total capacity of 256.00 MiB" in out
    assert "150.00 MiB is allocated by PyTorch" in out
    assert "largest free block" in out


def test_environment_config_applies_to_install():
    out = run_ok(
        """
        import torchmem
        torchmem.install()
        print(torchmem.caching_allocator().config)
        """,
        env={"TORCHMEM_ALLOC_CONF": "max_split_size_mb:128"},
    )
    assert out.strip() == "max_split_size_mb:128,reuse_order:recent,min_block_size:64"  # over the CPU defaults


def test_training_a_transformer_returns_allocated_to_its_start():
    out = run_ok(
        """
        import json, torch, torchmem
        torch.manual_seed(0)
        torchmem.install()
        layer = torch.nn.TransformerEncoderLayer(128, 4, 256, batch_first=True, dropout=0.0)
        model = torch.nn.TransformerEncoder(layer, 2)
        opt = torch.optim.AdamW(model.parameters())
        rows = []
        for step, seq in enumerate([16, 48, 32, 64, 24]):
            if step == 1:  # optimizer state exists from the first step on
                start = torchmem.memory_allocated()
            x = torch.randn(8, seq, 128)
            loss = model(x).pow(2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            del x, loss
            s = torchmem.memory_stats()
            rows.append([s["allocated_bytes.all.current"], s["reserved_bytes.all.current"],
                         s["allocated_bytes.all.peak"], s["reserved_bytes.all.peak"]])
            torchmem.caching_allocator().check_invariants()
        print(json.dumps({"start": start, "rows": rows}))
        """
    )
    r = json.loads(out)
    for allocated, reserved, peak_allocated, peak_reserved in r["rows"][1:]:
        assert allocated == r["start"]
        assert reserved >= allocated
        assert peak_reserved >= peak_allocated > allocated


def test_intra_op_threads_allocate_concurrently():
    run_ok(
        """
        import torch, torchmem
        torch.set_num_threads(2)
        torchmem.install()
        alloc = torchmem.caching_allocator()
        a = torch.randn(512, 512)
        before = alloc.stats()["allocation"]["all"]["allocated"]
        for _ in range(20):
            b = (a @ a).relu().sum(dim=0)
            c = torch.cat([a, a]).sort(dim=0).values
        assert alloc.owns(b.data_ptr()) and alloc.owns(c.data_ptr())
        assert alloc.stats()["allocation"]["all"]["allocated"] - before >= 20 * 4  # matmul, relu, sum, cat, sort...
        del b, c
        alloc.check_invariants()
        """
    )


def test_stats_api_without_install_is_empty():
    out = run_ok(
        """
        import torchmem
        print(len(torchmem.memory_stats()), torchmem.memory_allocated(), torchmem.memory_reserved())
        torchmem.empty_cache()
        """
    )
    assert out.split() == ["0", "0", "0"]


def test_device_argument_is_checked():
    proc = run_python(
        """
        import torchmem
        torchmem.memory_stats("cuda:3")
        """
    )
    assert proc.returncode == 1
    assert "torchmem manages the CPU" in proc.stderr
