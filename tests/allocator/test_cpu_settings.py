"""The CPU settings (Note [CPU settings] in csrc/core/base/alloc_config.h):
reuse_order and min_block_size, their config grammar, what they change, that
the native policy is unchanged without them, and that torchmem.install()
turns them on for the CPU only."""
import json

import pytest

from torchmem import _core
from torchmem.runtime.cpu_settings import CPU_DEFAULTS, with_cpu_defaults

from tests.support.sim import MiB, block_of, sim_allocator
from tests.support.subprocess_runner import run_python


def checked(a, op, *args):
    out = op(*args)
    a.check_invariants()
    return out


# --- config grammar -------------------------------------------------------------

@pytest.mark.parametrize("text, normalised", [
    ("reuse_order:address", ""),
    ("reuse_order:recent", "reuse_order:recent"),
    ("min_block_size:512", ""),
    ("min_block_size:64", "min_block_size:64"),
    ("min_block_size:128,reuse_order:recent", "reuse_order:recent,min_block_size:128"),
    ("reuse_order:recent,reuse_order:address", ""),  # the last one wins, as for every key
])
def test_valid_cpu_settings(text, normalised):
    assert _core.parse_config(text) == normalised


@pytest.mark.parametrize("text, fragment", [
    ("reuse_order:newest", "address"),
    ("reuse_order:", "recent"),
    ("min_block_size:32", "from 64 to 512"),
    ("min_block_size:1024", "from 64 to 512"),
    ("min_block_size:96", "power of two"),
    ("min_block_size:64B", "power of two"),
    ("min_block_size:-64", "power of two"),
])
def test_bad_cpu_settings_name_key_and_allowed_values(text, fragment):
    key = text.split(":")[0]
    with pytest.raises(ValueError, match=key) as info:
        _core.parse_config(text)
    assert fragment in str(info.value)


def test_cpu_defaults_apply_under_the_users_config():
    assert with_cpu_defaults("") == CPU_DEFAULTS
    assert with_cpu_defaults("max_split_size_mb:64") == "max_split_size_mb:64," + CPU_DEFAULTS
    # Keys the user gives win over the CPU defaults: the native policy on the CPU.
    assert with_cpu_defaults("reuse_order:address,min_block_size:512") == ""
    with pytest.raises(ValueError, match="min_block_size"):
        with_cpu_defaults("min_block_size:7")
    with pytest.raises(TypeError):
        with_cpu_defaults(64)


# --- reuse_order ----------------------------------------------------------------

def three_equal_free_blocks(conf):
    """Three free 4 MiB blocks of one 20 MiB segment, kept apart by live
    blocks, freed in the order middle, high, low. Returns the allocator and
    the blocks' addresses, low to high."""
    a = sim_allocator(conf=conf)
    blocks, guards = [], []
    for _ in range(3):
        blocks.append(checked(a, a.allocate, 4 * MiB))
        guards.append(checked(a, a.allocate, 2 * MiB))
    for p in (blocks[1], blocks[2], blocks[0]):
        checked(a, a.deallocate, p)
    sizes = sorted(block_of(a, p)["size"] for p in blocks)
    assert sizes == [4 * MiB, 4 * MiB, 4 * MiB]  # none merged: equal sizes, a real tie
    return a, blocks


def test_native_order_takes_the_lowest_address_among_equal_sizes():
    a, blocks = three_equal_free_blocks("")
    assert checked(a, a.allocate, 4 * MiB) == blocks[0]
    assert checked(a, a.allocate, 4 * MiB) == blocks[1]
    assert checked(a, a.allocate, 4 * MiB) == blocks[2]


def test_recent_order_takes_the_most_recently_freed_among_equal_sizes():
    a, blocks = three_equal_free_blocks("reuse_order:recent")
    assert checked(a, a.allocate, 4 * MiB) == blocks[0]  # freed last
    assert checked(a, a.allocate, 4 * MiB) == blocks[2]
    assert checked(a, a.allocate, 4 * MiB) == blocks[1]  # freed first


def test_recent_order_is_still_best_fit_by_size():
    a = sim_allocator(conf="reuse_order:recent")
    small = checked(a, a.allocate, 3 * MiB)
    guard = checked(a, a.allocate, 2 * MiB)
    large = checked(a, a.allocate, 5 * MiB)
    guard2 = checked(a, a.allocate, 2 * MiB)
    checked(a, a.deallocate, small)
    checked(a, a.deallocate, large)  # freed more recently, but larger than needed
    assert checked(a, a.allocate, 3 * MiB) == small
    assert a.stats()["num_device_alloc"] == 1


# --- min_block_size -------------------------------------------------------------

def test_min_block_size_rounds_tiny_requests_to_the_granule():
    native = sim_allocator()
    cpu = sim_allocator(conf="min_block_size:64")
    for size, native_size, cpu_size in [(1, 512, 64), (16, 512, 64), (65, 512, 128), (600, 1024, 640)]:
        assert block_of(native, checked(native, native.allocate, size))["size"] == native_size
        assert block_of(cpu, checked(cpu, cpu.allocate, size))["size"] == cpu_size


def test_many_tiny_requests_take_less_memory_with_a_small_granule():
    stats = {}
    for conf in ("", "min_block_size:64"):
        a = sim_allocator(conf=conf)
        keep = [a.allocate(16) for _ in range(20000)]
        a.check_invariants()
        assert len(set(keep)) == 20000
        stats[conf] = a.stats()
    # 20,000 blocks of 512 B need 5 small segments (2 MiB each); of 64 B, one.
    assert stats[""]["allocated_bytes"]["all"]["current"] == 20000 * 512
    assert stats["min_block_size:64"]["allocated_bytes"]["all"]["current"] == 20000 * 64
    assert stats[""]["reserved_bytes"]["all"]["current"] == 5 * 2 * MiB
    assert stats["min_block_size:64"]["reserved_bytes"]["all"]["current"] == 2 * MiB


def test_small_blocks_split_and_merge_at_the_granule():
    a = sim_allocator(conf="min_block_size:64")
    p = checked(a, a.allocate, MiB)  # small pool: one 2 MiB segment
    r = checked(a, a.allocate, MiB - 64)  # leaves exactly one 64 B block
    q = checked(a, a.allocate, 64)
    assert q == p + 2 * MiB - 64
    assert len(a.segments()) == 1
    for ptr in (p, q, r):
        checked(a, a.deallocate, ptr)
    assert [b["size"] for b in a.segments()[0]["blocks"]] == [2 * MiB]  # merged back


# --- install on the CPU ---------------------------------------------------------

def test_install_on_cpu_uses_the_cpu_settings_and_conf_can_restore_native():
    out = run_python(
        """
        import json, torch, torchmem
        torchmem.install()
        r = {"default": torchmem.caching_allocator().config}
        x = torch.empty(4)
        r["tiny_bytes"] = torchmem.memory_allocated()
        r["aligned"] = x.data_ptr() % 64 == 0
        del x
        torchmem.install(conf="reuse_order:address,min_block_size:512")
        r["native"] = torchmem.caching_allocator().config
        y = torch.empty(4)
        r["native_tiny_bytes"] = torchmem.memory_allocated()
        print(json.dumps(r))
        """
    )
    assert out.returncode == 0, out.stderr[-3000:]
    r = json.loads(out.stdout)
    assert r["default"] == CPU_DEFAULTS
    assert r["tiny_bytes"] == 64
    assert r["aligned"]
    assert r["native"] == ""
    assert r["native_tiny_bytes"] == 512


def test_simulated_device_keeps_the_native_policy_by_default():
    a = sim_allocator()
    assert a.config == ""
    assert block_of(a, a.allocate(16))["size"] == 512
