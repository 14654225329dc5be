"""Random add/fork/append/step/free sequences on PagedKVCache, checked against
a reference model: every sequence's KV (gathered through its block table)
equals the values written for its tokens, pool invariants hold after every
operation, and an exhausted call changes nothing."""
import pytest
import torch
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from torchmem.runtime.paged import OutOfBlocksError, PagedKVCache


def kv_value(tokens):
    """The KV of a token depends on the token and everything before it (as in
    a transformer), so a prefix hit must find exactly these values."""
    return float(hash(tuple(tokens)) % 1_000_003)


def write(cache, slots, values):
    v = torch.tensor(values, dtype=torch.float32).view(-1, 1, 1).expand(-1, cache.num_heads, cache.head_dim)
    for layer in range(cache.num_layers):
        cache.write(layer, slots, v + layer, -v - layer)


def check(cache, model):
    cache.check_invariants()
    assert sorted(cache.sequences) == sorted(model)
    for sid, tokens in model.items():
        assert cache.num_tokens(sid) == len(tokens)
        expected = torch.tensor([kv_value(tokens[: i + 1]) for i in range(len(tokens))], dtype=torch.float32)
        for layer in range(cache.num_layers):
            k, v = cache.gather(layer, sid)
            assert torch.equal(k[:, 0, 0], expected + layer), (sid, layer)
            assert torch.equal(v[:, -1, -1], -expected - layer), (sid, layer)


def snapshot(cache):
    return ({s: cache.block_table(s) for s in cache.sequences}, cache.num_free_blocks, cache.num_cached_blocks)


tokens_st = st.lists(st.integers(0, 2), min_size=0, max_size=9)
ops_st = st.lists(
    st.one_of(
        st.tuples(st.just("add"), tokens_st),
        st.tuples(st.just("fork"), st.integers(0, 100)),
        st.tuples(st.just("append"), st.integers(0, 100), st.lists(st.integers(0, 2), min_size=1, max_size=5)),
        st.tuples(st.just("step"), st.lists(st.integers(0, 100), max_size=6), st.integers(0, 2)),
        st.tuples(st.just("free"), st.integers(0, 100)),
    ),
    max_size=40,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=ops_st, num_blocks=st.integers(3, 12), block_size=st.sampled_from([1, 2, 3]),
       prefix=st.booleans())
def test_random_operations_match_the_reference_model(ops, num_blocks, block_size, prefix):
    cache = PagedKVCache(num_blocks, block_size, num_heads=2, head_dim=2, dtype=torch.float32, device="cpu",
                         num_layers=2, enable_prefix_caching=prefix)
    model: dict[int, list[int]] = {}
    for op in ops:
        live = sorted(model)
        before = snapshot(cache)
        try:
            if op[0] == "add":
                toks = op[1]
                new = cache.add_sequence(toks)
                assert new.num_cached_tokens % block_size == 0 and new.num_cached_tokens < max(len(toks), 1)
                if not prefix:
                    assert new.num_cached_tokens == 0
                elif new.num_cached_tokens:
                    event("prefix hit")
                write(cache, new.slot_mapping, [kv_value(toks[: i + 1]) for i in range(new.num_cached_tokens, len(toks))])
                model[new.seq_id] = list(toks)
            elif not live:
                continue
            elif op[0] == "fork":
                parent = live[op[1] % len(live)]
                model[cache.fork(parent)] = list(model[parent])
            elif op[0] == "append":
                sid = live[op[1] % len(live)]
                toks = model[sid]
                slots = cache.append(sid, op[2])
                n0 = len(toks)
                toks_after = toks + op[2]
                write(cache, slots, [kv_value(toks_after[: i + 1]) for i in range(n0, len(toks_after))])
                model[sid] = toks_after
            elif op[0] == "step":
                sids = sorted({live[i % len(live)] for i in op[1]})
                if not sids:
                    continue
                slots = cache.append_tokens(sids, [op[2]] * len(sids))
                values = []
                for sid in sids:
                    model[sid] = model[sid] + [op[2]]
                    values.append(kv_value(model[sid]))
                write(cache, slots, values)
            elif op[0] == "free":
                sid = live[op[1] % len(live)]
                cache.free(sid)
                del model[sid]
        except OutOfBlocksError:
            event("exhausted")
            assert snapshot(cache) == before  # nothing half-done
        check(cache, model)
    for sid in list(model):
        cache.free(sid)
    assert cache.num_free_blocks == num_blocks
    cache.check_invariants()


@pytest.mark.parametrize("batch", [1, 7, 64])
def test_long_decode_with_forks(batch):
    """Many steps on a batch with periodic forks and frees; the pool never leaks."""
    cache = PagedKVCache(1024, 4, num_heads=1, head_dim=1, dtype=torch.float32, device="cpu")
    seqs = [cache.add_sequence([i % 3]).seq_id for i in range(batch)]
    for step in range(40):
        cache.append_tokens(seqs, [step % 5] * len(seqs))
        if step % 10 == 3:
            seqs.append(cache.fork(seqs[step % len(seqs)]))
        if step % 10 == 7:
            cache.free(seqs.pop(0))
    cache.check_invariants()
    for s in seqs:
        cache.free(s)
    assert cache.num_free_blocks == 1024
