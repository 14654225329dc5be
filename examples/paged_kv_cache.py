"""A paged KV cache with a shared prompt prefix and forked samples.

    .venv/bin/python examples/paged_kv_cache.py

Two requests share a system prompt: the second reuses the first one's cached
prefix blocks. Each request is then forked into two samples (parallel
sampling): the samples share every block until they write, when the shared
last block is copied. Attention over the paged cache is checked against
attention over the sequence's own dense keys and values.
"""
import torch

from torchmem.runtime.paged import PagedKVCache

HEADS, DIM, BLOCK = 4, 16, 8


def kv_for(tokens: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Stand-in for a layer's K/V projections: a deterministic function of each
    token's prefix (as a transformer's would be)."""
    ks, vs = [], []
    for i in range(len(tokens)):
        g = torch.Generator().manual_seed(hash(tuple(tokens[: i + 1])) % (2**31))
        ks.append(torch.randn(HEADS, DIM, generator=g))
        vs.append(torch.randn(HEADS, DIM, generator=g))
    return torch.stack(ks), torch.stack(vs)


def paged_attention(cache: PagedKVCache, seq_id: int, q: torch.Tensor) -> torch.Tensor:
    """Attention of one query over a sequence, reading K/V through its block table."""
    table = torch.tensor(cache.block_table(seq_id))
    n = cache.num_tokens(seq_id)
    pos = torch.arange(n)
    slots = table[pos // cache.block_size] * cache.block_size + pos % cache.block_size
    k, v = cache.key_cache()[slots], cache.value_cache()[slots]  # [n, heads, dim]
    w = torch.softmax(torch.einsum("hd,nhd->hn", q, k) / DIM**0.5, dim=-1)
    return torch.einsum("hn,nhd->hd", w, v)


def main() -> None:
    cache = PagedKVCache(num_blocks=32, block_size=BLOCK, num_heads=HEADS, head_dim=DIM, dtype=torch.float32)
    system = list(range(100, 124))  # 24 tokens: 3 full blocks
    tokens = {}

    for user in ([1, 2, 3], [7, 8, 9, 10]):
        prompt = system + user
        new = cache.add_sequence(prompt)
        k, v = kv_for(prompt)
        cache.write(0, new.slot_mapping, k[new.num_cached_tokens:], v[new.num_cached_tokens:])
        tokens[new.seq_id] = prompt
        print(f"request {new.seq_id}: {len(prompt)} tokens, {new.num_cached_tokens} from the prefix cache, "
              f"blocks {cache.block_table(new.seq_id)}")

    for parent in list(tokens):
        child = cache.fork(parent)
        tokens[child] = list(tokens[parent])
        print(f"fork {parent} -> {child}: shares {cache.block_table(child)}")

    free_before = cache.num_free_blocks
    for step in range(10):
        seqs = list(tokens)
        new_tokens = [(sid * 31 + step) % 50 for sid in seqs]  # each sample picks its own token
        slots = cache.append_tokens(seqs, new_tokens)
        ks, vs = [], []
        for sid, t in zip(seqs, new_tokens):
            tokens[sid].append(t)
            k, v = kv_for(tokens[sid])
            ks.append(k[-1])
            vs.append(v[-1])
        cache.write(0, slots, torch.stack(ks), torch.stack(vs))
    print(f"10 decode steps: {cache.stats()['copies']} copy-on-write block copies, "
          f"{free_before - cache.num_free_blocks} blocks taken")

    q = torch.randn(HEADS, DIM)
    for sid, toks in tokens.items():
        k, v = kv_for(toks)
        w = torch.softmax(torch.einsum("hd,nhd->hn", q, k) / DIM**0.5, dim=-1)
        dense = torch.einsum("hn,nhd->hd", w, v)
        assert torch.allclose(paged_attention(cache, sid, q), dense, atol=1e-5)
        print(f"sequence {sid}: {len(toks)} tokens, blocks {cache.block_table(sid)}: paged == dense attention")

    for sid in list(tokens):
        cache.free(sid)
    print(f"all freed: {cache.num_free_blocks} free, {cache.num_cached_blocks} kept for prefix hits")
    again = cache.add_sequence(system + [5])
    print(f"a new request with the system prompt: {again.num_cached_tokens} tokens cached")
    cache.check_invariants()


if __name__ == "__main__":
    main()
