"""The paged block pool (torchmem._core.PagedBlockPool) and torchmem.runtime.paged.PagedKVCache."""
import pytest
import torch

from torchmem import _core
from torchmem.runtime.paged import OutOfBlocksError, PagedKVCache, _block_hash

# --------------------------------------------------------------- block pool


def test_issue_scenario_on_8_blocks():
    pool = _core.PagedBlockPool(8)
    a = pool.allocate_n(3)  # sequence A takes 3 blocks
    assert a == [0, 1, 2] and pool.num_free == 5
    pool.retain_n(a)  # B forks from A
    assert [pool.ref_count(b) for b in a] == [2, 2, 2] and pool.num_free == 5
    b = list(a)
    copies = []
    b[-1] = pool.make_writable(b[-1], lambda src, dst: copies.append((src, dst)))  # B writes its last block
    assert copies == [(2, 3)] and b == [0, 1, 3] and pool.num_free == 4
    assert pool.ref_count(2) == 1 and pool.ref_count(3) == 1
    pool.check_invariants()
    pool.release_n(a)  # A ends
    assert pool.num_free == 5
    pool.release_n(b)  # B ends
    assert pool.num_free == 8
    pool.check_invariants()


def test_pool_errors_leave_it_unchanged():
    pool = _core.PagedBlockPool(4)
    ids = pool.allocate_n(2)
    before = (pool.num_free, [pool.ref_count(i) for i in range(4)])
    with pytest.raises(ValueError, match="out of range"):
        pool.release(4)
    with pytest.raises(ValueError, match="out of range"):
        pool.release_n([ids[0], -1])
    with pytest.raises(ValueError, match="not in use"):
        pool.release(3)  # a free block
    with pytest.raises(ValueError, match="more times"):
        pool.release_n([ids[0], ids[1], ids[0]])  # twice in one batch
    with pytest.raises(ValueError, match="not in use"):
        pool.retain(3)
    assert (pool.num_free, [pool.ref_count(i) for i in range(4)]) == before
    pool.release(ids[0])
    with pytest.raises(ValueError, match="not in use"):
        pool.release(ids[0])  # released twice
    pool.check_invariants()


def test_pool_exhaustion_is_all_or_nothing():
    pool = _core.PagedBlockPool(3)
    pool.allocate_n(2)
    with pytest.raises(OutOfBlocksError, match="3 requested, 1 free of 3"):
        pool.allocate_n(3)
    assert pool.try_allocate_n(2) is None
    assert pool.num_free == 1
    assert isinstance(OutOfBlocksError("x"), MemoryError)
    last = pool.allocate()
    assert pool.try_allocate() == -1
    with pytest.raises(OutOfBlocksError):
        pool.allocate()
    pool.retain(last)
    with pytest.raises(OutOfBlocksError):
        pool.allocate_and_make_writable(0, [last])  # a copy needs a block
    assert pool.ref_count(last) == 2
    pool.check_invariants()


def test_pool_batch_step_copies_in_order():
    pool = _core.PagedBlockPool(8)
    x = pool.allocate()
    pool.retain_n([x, x])  # three holders
    fresh, last, copies = pool.allocate_and_make_writable(2, [x, x, x])
    assert len(fresh) == 2 and len(copies) == 2
    assert last[2] == x and {last[0], last[1]}.isdisjoint({x}) and last[0] != last[1]
    assert copies == [(x, last[0]), (x, last[1])]
    assert pool.ref_count(x) == 1 and pool.num_free == 8 - 5
    assert pool.stats()["copies"] == 2
    pool.check_invariants()


def test_pool_prefix_cache_lru():
    pool = _core.PagedBlockPool(4)
    a = pool.allocate_n(3)
    for i, b in enumerate(a):
        assert pool.set_hash(b, 100 + i)
    assert not pool.set_hash(a[2], 100)  # another block holds 100
    pool.release_n(a)  # parked in this order: a[0] least recently
    assert pool.num_free == 4 and pool.num_parked == 3
    assert pool.acquire_cached(101) == a[1] and pool.num_parked == 2
    assert pool.acquire_cached(555) == -1
    assert pool.allocate() == 3  # the never-used block first
    assert pool.allocate() == a[0]  # then evict the least recently parked
    assert pool.lookup(100) == -1 and pool.lookup(102) == a[2]
    s = pool.stats()
    assert (s["cache_hits"], s["cache_misses"], s["evictions"]) == (1, 1, 1)
    pool.check_invariants()


# ------------------------------------------------------------ KV cache


def make_cache(**kw):
    args = dict(num_blocks=8, block_size=4, num_heads=2, head_dim=3, dtype=torch.float32, device="cpu")
    args.update(kw)
    return PagedKVCache(**args)


def token_kv(cache, values):
    """Distinct K/V rows for token values: K = v, V = -v on every head and dim."""
    v = torch.tensor(values, dtype=torch.float32).view(-1, 1, 1)
    k = v.expand(-1, cache.num_heads, cache.head_dim)
    return k, -k


def write_tokens(cache, slots, values):
    for layer in range(cache.num_layers):
        k, v = token_kv(cache, [x + 1000 * layer for x in values])
        cache.write(layer, slots, k, v)


def assert_kv(cache, seq_id, values):
    for layer in range(cache.num_layers):
        k, v = cache.gather(layer, seq_id)
        ek, ev = token_kv(cache, [x + 1000 * layer for x in values])
        assert torch.equal(k, ek) and torch.equal(v, ev), f"layer {layer}"


def test_kv_cache_shape_and_single_allocation():
    cache = make_cache(num_layers=3)
    assert cache.kv.shape == (3, 2, 8, 4, 2, 3)
    ptr = cache.kv.data_ptr()
    s = cache.add_sequence(list(range(10)))
    cache.append_tokens([s.seq_id], [1])
    cache.fork(s.seq_id)
    assert cache.kv.data_ptr() == ptr
    assert cache.key_cache(1).shape == (32, 2, 3)


def test_issue_scenario_through_the_cache():
    cache = make_cache(num_blocks=8, block_size=4, enable_prefix_caching=False)
    a = cache.add_sequence(list(range(10)))  # 3 blocks, the last one half full
    assert cache.block_table(a.seq_id) == [0, 1, 2] and cache.num_free_blocks == 5
    b = cache.fork(a.seq_id)
    assert [cache.pool.ref_count(x) for x in (0, 1, 2)] == [2, 2, 2] and cache.num_free_blocks == 5
    slots = cache.append_tokens([b], [99])  # B writes its last block: copied
    assert cache.block_table(b) == [0, 1, 3] and cache.num_free_blocks == 4
    assert slots.tolist() == [3 * 4 + 2]
    cache.free(a.seq_id)
    assert cache.num_free_blocks == 5
    cache.free(b)
    assert cache.num_free_blocks == 8
    cache.check_invariants()


def test_copy_on_write_copies_kv_contents():
    cache = make_cache(num_layers=2, block_size=4)
    a = cache.add_sequence([1, 2, 3, 4, 5, 6])
    write_tokens(cache, a.slot_mapping, [10, 11, 12, 13, 14, 15])
    child = cache.fork(a.seq_id)
    child2 = cache.fork(a.seq_id)
    # One step: parent, child and child2 each append their own token.
    slots = cache.append_tokens([a.seq_id, child, child2], [7, 8, 9])
    write_tokens(cache, slots, [16, 17, 18])
    assert_kv(cache, a.seq_id, [10, 11, 12, 13, 14, 15, 16])
    assert_kv(cache, child, [10, 11, 12, 13, 14, 15, 17])
    assert_kv(cache, child2, [10, 11, 12, 13, 14, 15, 18])
    tables = [cache.block_table(s) for s in (a.seq_id, child, child2)]
    assert tables[0][0] == tables[1][0] == tables[2][0]  # the full block stays shared
    assert len({t[1] for t in tables}) == 3  # the partial block was copied twice
    assert cache.stats()["copies"] == 2
    # Multi-token append into a shared block, then across a block boundary.
    c3 = cache.fork(child)
    s3 = cache.append(c3, [1, 2, 3])
    write_tokens(cache, s3, [20, 21, 22])
    assert_kv(cache, child, [10, 11, 12, 13, 14, 15, 17])
    assert_kv(cache, c3, [10, 11, 12, 13, 14, 15, 17, 20, 21, 22])
    cache.check_invariants()


def test_block_tables_and_slots():
    cache = make_cache(block_size=4)
    a = cache.add_sequence(list(range(5)))
    b = cache.add_sequence(list(range(100, 102)))
    assert a.slot_mapping.tolist() == [0, 1, 2, 3, 4] and a.num_cached_tokens == 0
    assert b.slot_mapping.tolist() == [8, 9]
    bt = cache.block_tables([a.seq_id, b.seq_id])
    assert bt.dtype == torch.int32 and bt.tolist() == [[0, 1], [2, 0]]
    assert cache.context_lens([a.seq_id, b.seq_id]).tolist() == [5, 2]
    slots = cache.append_tokens([a.seq_id, b.seq_id], [0, 0])
    assert slots.tolist() == [5, 10]


def test_prefix_cache_hits_share_blocks_and_kv():
    cache = make_cache(num_blocks=8, block_size=4)
    prompt = list(range(1, 11))  # 2 full blocks + 2 tokens
    a = cache.add_sequence(prompt)
    write_tokens(cache, a.slot_mapping, [100 + t for t in prompt])
    b = cache.add_sequence(prompt[:8] + [77, 78, 79])
    assert b.num_cached_tokens == 8
    assert cache.block_table(b.seq_id)[:2] == cache.block_table(a.seq_id)[:2]
    assert b.slot_mapping.numel() == 3
    write_tokens(cache, b.slot_mapping, [177, 178, 179])
    assert_kv(cache, b.seq_id, [100 + t for t in prompt[:8]] + [177, 178, 179])
    # A different first block: no hit at all (hashes are chained).
    c = cache.add_sequence([0] + prompt[1:8] + [5])
    assert c.num_cached_tokens == 0
    cache.free(c.seq_id)
    # Blocks of freed sequences stay cached.
    cache.free(a.seq_id)
    cache.free(b.seq_id)
    assert cache.num_cached_blocks >= 2 and cache.num_free_blocks == 8
    d = cache.add_sequence(prompt[:4] + [9, 9])
    assert d.num_cached_tokens == 4
    write_tokens(cache, d.slot_mapping, [9, 9])
    assert_kv(cache, d.seq_id, [100 + t for t in prompt[:4]] + [9, 9])
    # The whole prompt cached: the last block is recomputed so one token runs.
    e = cache.add_sequence(prompt[:4])
    assert e.num_cached_tokens == 0
    cache.check_invariants()


def test_prefix_blocks_registered_by_decode():
    cache = make_cache(block_size=2)
    a = cache.add_sequence([5])
    cache.append_tokens([a.seq_id], [6])  # fills block 0 with [5, 6]
    cache.append(a.seq_id, [7, 8, 9])  # fills block 1 with [7, 8]
    b = cache.add_sequence([5, 6, 7, 8, 1])
    assert b.num_cached_tokens == 4
    assert cache.block_table(b.seq_id)[:2] == cache.block_table(a.seq_id)[:2]


def test_eviction_least_recently_released_first():
    cache = make_cache(num_blocks=6, block_size=2)
    a = cache.add_sequence([1, 2, 3, 4, 9])  # blocks: [1 2] [3 4] [9]
    b = cache.add_sequence([5, 6, 7, 8, 9])
    ta, tb = cache.block_table(a.seq_id), cache.block_table(b.seq_id)
    cache.free(a.seq_id)  # parks a's [3 4] then [1 2]
    cache.free(b.seq_id)  # then b's [7 8], [5 6]
    assert cache.num_cached_blocks == 4 and cache.num_free_blocks == 6
    x = cache.add_sequence([0] * 7)  # 4 blocks: 2 free ones, then evicts a's [3 4] and [1 2]
    assert set(cache.block_table(x.seq_id)) >= {ta[0], ta[1]}
    assert cache.num_cached_blocks == 2
    h_a0 = _block_hash(0, [1, 2])
    h_b0 = _block_hash(0, [5, 6])
    h_b1 = _block_hash(h_b0, [7, 8])
    assert cache.pool.lookup(h_a0) == -1
    assert cache.pool.lookup(h_b0) == tb[0] and cache.pool.lookup(h_b1) == tb[1]
    cache.free(x.seq_id)  # x's full blocks are parked after b's
    hit = cache.add_sequence([5, 6, 7, 8, 9])
    assert hit.num_cached_tokens == 4 and cache.block_table(hit.seq_id)[:2] == tb[:2]
    assert cache.add_sequence([1, 2, 3, 4, 9]).num_cached_tokens == 0
    cache.check_invariants()


def test_revived_block_becomes_most_recent():
    cache = make_cache(num_blocks=5, block_size=2)
    a = cache.add_sequence([1, 2, 0])
    b = cache.add_sequence([3, 4, 0])
    block_12, block_34 = cache.block_table(a.seq_id)[0], cache.block_table(b.seq_id)[0]
    cache.free(a.seq_id)
    cache.free(b.seq_id)  # LRU: [1 2], then [3 4]
    c = cache.add_sequence([1, 2, 5])  # revives [1 2]
    assert c.num_cached_tokens == 2 and cache.block_table(c.seq_id)[0] == block_12
    cache.free(c.seq_id)  # [1 2] is now the most recent
    x = cache.add_sequence([0] * 7)  # 4 blocks: the 3 free ones, then one eviction
    assert block_34 in cache.block_table(x.seq_id)
    assert cache.pool.has_hash(block_12) and cache.num_cached_blocks == 1
    cache.check_invariants()


def test_exhaustion_raises_and_changes_nothing():
    cache = make_cache(num_blocks=4, block_size=2, enable_prefix_caching=False)
    a = cache.add_sequence([1, 2, 3])  # 2 blocks
    b = cache.fork(a.seq_id)
    state = (cache.block_table(a.seq_id), cache.block_table(b), cache.num_free_blocks)
    with pytest.raises(OutOfBlocksError, match="nothing was changed"):
        cache.add_sequence(list(range(6)))  # 3 blocks, 2 free
    with pytest.raises(OutOfBlocksError):
        cache.append(a.seq_id, [1] * 6)  # needs a copy and 3 blocks
    c = cache.add_sequence([1])
    d = cache.fork(c.seq_id)
    # a, b need a copy each (shared partial blocks); c, d too: 2 copies with 0 free.
    with pytest.raises(OutOfBlocksError):
        cache.append_tokens([a.seq_id, b, c.seq_id, d], [1, 1, 1, 1])
    assert (cache.block_table(a.seq_id), cache.block_table(b)) == state[:2]
    assert cache.num_tokens(a.seq_id) == 3 and cache.num_tokens(c.seq_id) == 1
    cache.check_invariants()
    # The step that fits goes through.
    cache.free(d)
    assert cache.append_tokens([a.seq_id, c.seq_id], [1, 1]) is not None
    cache.check_invariants()


def test_exhaustion_returns_none_by_option():
    cache = make_cache(num_blocks=2, block_size=2, raise_on_exhausted=False)
    a = cache.add_sequence([1, 2, 3, 4])
    assert cache.add_sequence([1]) is None
    assert cache.append_tokens([a.seq_id], [5]) is None
    assert cache.append(a.seq_id, [5]) is None
    assert cache.num_tokens(a.seq_id) == 4
    cache.check_invariants()


def test_bad_calls():
    cache = make_cache()
    a = cache.add_sequence([1, 2])
    with pytest.raises(KeyError):
        cache.append_tokens([42], [1])
    with pytest.raises(ValueError, match="twice"):
        cache.append_tokens([a.seq_id, a.seq_id], [1, 2])
    with pytest.raises(ValueError, match="one token per sequence"):
        cache.append_tokens([a.seq_id], [1, 2])
    with pytest.raises(ValueError, match="negative"):
        cache.append(a.seq_id, -1)
    with pytest.raises(ValueError, match="negative"):
        cache.add_sequence(-3)
    cache.free(a.seq_id)
    with pytest.raises(KeyError):
        cache.free(a.seq_id)


def test_token_counts_without_ids():
    cache = make_cache(block_size=4)
    a = cache.add_sequence(6)
    assert a.slot_mapping.tolist() == list(range(6))
    cache.append(a.seq_id, 3)
    cache.append_tokens([a.seq_id])
    assert cache.num_tokens(a.seq_id) == 10
    assert cache.num_cached_blocks == 0
    cache.free(a.seq_id)
    assert cache.num_cached_blocks == 0  # nothing was registered


def test_tensor_token_ids_hash_by_value():
    cache = make_cache(block_size=2)
    a = cache.add_sequence(torch.tensor([3, 4, 5]))
    cache.append_tokens([a.seq_id], torch.tensor([6]))
    b = cache.add_sequence([3, 4, 5, 6, 7])
    assert b.num_cached_tokens == 4
    assert cache.block_table(b.seq_id)[:2] == cache.block_table(a.seq_id)[:2]
