"""A paged KV cache: one tensor cut into fixed-size blocks, handed out to
sequences by the C++ block pool (``torchmem._core.PagedBlockPool``).

    cache = PagedKVCache(num_blocks=1024, block_size=16, num_heads=8, head_dim=64,
                         dtype=torch.float16, device="cuda")
    seq = cache.add_sequence(prompt_tokens)        # reuses cached prefix blocks
    cache.write(layer, seq.slot_mapping, k, v)     # the prompt's KV (uncached part)
    slots = cache.append_tokens([seq.seq_id], [t])  # one decode step, any batch
    child = cache.fork(seq.seq_id)                 # shares every block
    cache.free(seq.seq_id)

Layout: ``cache.kv`` has shape ``[num_layers, 2, num_blocks, block_size,
num_heads, head_dim]`` (2 = key, value), allocated once. A token's *slot* is
``block * block_size + offset``; ``key_cache(layer)`` / ``value_cache(layer)``
view a layer as ``[num_blocks * block_size, num_heads, head_dim]`` so a kernel
(or ``index_copy_``) writes row ``slot``.

Copy-on-write: a forked sequence shares its parent's blocks; the first append
to a shared, partly filled last block copies that block (all layers, keys and
values, one tensor copy per step for the whole batch) and writes the copy.

Prefix caching: when a block fills, it is registered under a hash of its
tokens chained with the previous block's hash. ``add_sequence(tokens)`` reuses
the registered blocks of the longest cached prefix (at most ``len(tokens) - 1``
tokens, so the model always has a token to run). Blocks of freed sequences stay
registered ("parked"): they count as free, and are evicted least recently
released first (a sequence's tail before its head) only when the pool needs
them. A block is registered as soon as its slots are handed out: write the KV
of returned slots before the next call that could reuse that prefix.

Exhaustion: when the pool cannot serve a call, it raises ``OutOfBlocksError``
(a ``MemoryError``) or, with ``raise_on_exhausted=False``, returns ``None``;
either way nothing changed (no block taken, no sequence touched).

Not thread safe: one scheduler thread drives a cache.
"""
from __future__ import annotations

from array import array
from typing import NamedTuple, Sequence

import torch

from torchmem import _core

__all__ = ["NewSequence", "OutOfBlocksError", "PagedKVCache"]

OutOfBlocksError = _core.OutOfBlocksError

_HASH_MASK = (1 << 64) - 1


class NewSequence(NamedTuple):
    seq_id: int
    slot_mapping: torch.Tensor  # slots of tokens[num_cached_tokens:], int64
    num_cached_tokens: int      # leading tokens whose KV is already cached


class _Seq:
    __slots__ = ("blocks", "num_tokens", "partial", "last_hash")

    def __init__(self, blocks, num_tokens, partial, last_hash):
        self.blocks = blocks        # block table: list of block ids
        self.num_tokens = num_tokens
        self.partial = partial      # tokens of the unfilled last block (prefix caching)
        self.last_hash = last_hash  # chained hash of the last full block; None: not hashable


def _token_ids(tokens) -> list[int]:
    """Token ids as Python ints: a tensor element hashes by identity, which
    would make prefix keys meaningless."""
    ids = tokens.tolist() if hasattr(tokens, "tolist") else list(tokens)
    for t in ids:
        if isinstance(t, bool) or not isinstance(t, int):
            raise TypeError(f"token ids must be integers, got {t!r}")
    return ids


def _block_hash(prev: int, tokens) -> int:
    return hash((prev, tuple(tokens))) & _HASH_MASK


class PagedKVCache:
    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        num_heads: int,
        head_dim: int,
        dtype: torch.dtype = torch.float16,
        device=None,
        num_layers: int = 1,
        *,
        enable_prefix_caching: bool = True,
        raise_on_exhausted: bool = True,
    ):
        if block_size <= 0 or num_heads <= 0 or head_dim <= 0 or num_layers <= 0:
            raise ValueError("PagedKVCache: block_size, num_heads, head_dim and num_layers must be positive")
        self.block_size = block_size
        self.num_heads = num_heads
        self.head_dim = head_dim
        self.num_layers = num_layers
        self.dtype = dtype
        self.device = torch.device(device if device is not None else "cpu")
        self.enable_prefix_caching = enable_prefix_caching
        self.raise_on_exhausted = raise_on_exhausted
        self.pool = _core.PagedBlockPool(num_blocks)
        self.kv = torch.zeros(
            (num_layers, 2, num_blocks, block_size, num_heads, head_dim), dtype=dtype, device=self.device
        )
        self._seqs: dict[int, _Seq] = {}
        self._next_id = 0

    # ------------------------------------------------------------------ info
    @property
    def num_blocks(self) -> int:
        return self.pool.num_blocks

    @property
    def num_free_blocks(self) -> int:
        """Blocks available to allocation, parked prefix blocks included."""
        return self.pool.num_free

    @property
    def num_cached_blocks(self) -> int:
        """Blocks of freed sequences kept for prefix hits (counted as free)."""
        return self.pool.num_parked

    @property
    def sequences(self) -> list[int]:
        return list(self._seqs)

    def block_table(self, seq_id: int) -> list[int]:
        return list(self._seq(seq_id).blocks)

    def num_tokens(self, seq_id: int) -> int:
        return self._seq(seq_id).num_tokens

    def block_tables(self, seq_ids: Sequence[int], pad: int = 0) -> torch.Tensor:
        """Block tables of a batch as an int32 tensor [batch, max_blocks]."""
        tables = [self._seq(s).blocks for s in seq_ids]
        width = max((len(t) for t in tables), default=0)
        rows = [t + [pad] * (width - len(t)) for t in tables]
        return torch.tensor(rows, dtype=torch.int32, device=self.device).reshape(len(rows), width)

    def context_lens(self, seq_ids: Sequence[int]) -> torch.Tensor:
        return torch.tensor([self._seq(s).num_tokens for s in seq_ids], dtype=torch.int32, device=self.device)

    def stats(self) -> dict:
        s = self.pool.stats()
        s.update(num_blocks=self.num_blocks, num_free=self.pool.num_free, num_cached=self.pool.num_parked,
                 num_sequences=len(self._seqs))
        return s

    def key_cache(self, layer: int = 0) -> torch.Tensor:
        return self.kv[layer, 0].view(-1, self.num_heads, self.head_dim)

    def value_cache(self, layer: int = 0) -> torch.Tensor:
        return self.kv[layer, 1].view(-1, self.num_heads, self.head_dim)

    def write(self, layer: int, slot_mapping: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> None:
        """Store key/value rows [n, num_heads, head_dim] at the given slots."""
        self.key_cache(layer).index_copy_(0, slot_mapping, key.to(self.dtype))
        self.value_cache(layer).index_copy_(0, slot_mapping, value.to(self.dtype))

    def gather(self, layer: int, seq_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        """A sequence's keys and values in token order, [num_tokens, num_heads, head_dim]."""
        slots = self._slots_of(self._seq(seq_id), 0, self._seq(seq_id).num_tokens)
        index = self._index(slots)
        return self.key_cache(layer)[index], self.value_cache(layer)[index]

    # ------------------------------------------------------------ sequences
    def add_sequence(self, tokens: Sequence[int] | int = ()) -> NewSequence | None:
        """A new sequence holding `tokens` (ids, or a count when prefix caching
        is not wanted for it). Full blocks of a cached prefix are shared."""
        bs = self.block_size
        if isinstance(tokens, int):
            if tokens < 0:
                raise ValueError(f"PagedKVCache.add_sequence: a negative token count ({tokens})")
            n, ids, hashable = tokens, None, False
        else:
            ids = _token_ids(tokens)
            n, hashable = len(ids), self.enable_prefix_caching
        hashes = []
        if hashable:
            h = 0
            for i in range(n // bs):
                h = _block_hash(h, ids[i * bs:(i + 1) * bs])
                hashes.append(h)
        hits = []
        for h in hashes[: max(n - 1, 0) // bs]:
            b = self.pool.lookup(h)
            if b < 0:
                break
            hits.append(b)
        parked_hits = sum(1 for b in hits if self.pool.ref_count(b) == 0)
        num_new = -(-n // bs) - len(hits)
        if num_new > self.pool.num_free - parked_hits:
            return self._exhausted(f"add_sequence of {n} tokens needs {num_new} new blocks "
                                   f"({len(hits)} cached), {self.pool.num_free - parked_hits} free")
        for h in hashes[: len(hits)]:
            self.pool.acquire_cached(h)
        blocks = hits + self.pool.allocate_n(num_new)
        for i in range(len(hits), len(hashes)):
            self.pool.set_hash(blocks[i], hashes[i])
        cached = len(hits) * bs
        seq = _Seq(blocks, n, ids[len(hashes) * bs:] if hashable else None,
                   (hashes[-1] if hashes else 0) if hashable else None)
        seq_id = self._new_id()
        self._seqs[seq_id] = seq
        slots = self._slots_of(seq, cached, n)
        return NewSequence(seq_id, self._index(slots), cached)

    def fork(self, seq_id: int) -> int:
        """A child sequence sharing every block of `seq_id` (no copy until written)."""
        parent = self._seq(seq_id)
        self.pool.retain_n(parent.blocks)
        child = _Seq(list(parent.blocks), parent.num_tokens,
                     list(parent.partial) if parent.partial is not None else None, parent.last_hash)
        child_id = self._new_id()
        self._seqs[child_id] = child
        return child_id

    def free(self, seq_id: int) -> None:
        seq = self._seq(seq_id)
        self.pool.release_n(seq.blocks[::-1])  # tail first: it is evicted first
        del self._seqs[seq_id]

    def append(self, seq_id: int, tokens: Sequence[int] | int) -> torch.Tensor | None:
        """Appends tokens (ids, or a count) to one sequence; returns their slots."""
        seq = self._seq(seq_id)
        bs = self.block_size
        if isinstance(tokens, int):
            if tokens < 0:
                raise ValueError(f"PagedKVCache.append: a negative token count ({tokens})")
            n, ids = tokens, None
        else:
            ids = _token_ids(tokens)
            n = len(ids)
        if n == 0:
            return torch.empty(0, dtype=torch.int64, device=self.device)
        start = seq.num_tokens
        num_new = -(-(start + n) // bs) - len(seq.blocks)
        last = [seq.blocks[-1]] if start % bs else []
        try:
            fresh, last, copies = self.pool.allocate_and_make_writable(num_new, last)
        except OutOfBlocksError as e:
            return self._exhausted(f"append of {n} tokens: {e}")
        self._copy_blocks(copies)
        if last:
            seq.blocks[-1] = last[0]
        seq.blocks.extend(fresh)
        seq.num_tokens = start + n
        if seq.last_hash is not None:
            if ids is None:
                seq.last_hash = seq.partial = None
            else:
                first_block = start // bs
                seq.partial.extend(ids)
                while len(seq.partial) >= bs:
                    self._register_full(seq, first_block, seq.partial[:bs])
                    del seq.partial[:bs]
                    first_block += 1
        return self._index(self._slots_of(seq, start, start + n))

    def append_tokens(self, seq_ids: Sequence[int], tokens: Sequence[int] | None = None) -> torch.Tensor | None:
        """One decode step: appends one token to each sequence (token ids, or
        None when prefix caching is not wanted). Returns the slot mapping
        [len(seq_ids)], int64. One call into the pool for the whole batch."""
        bs = self.block_size
        seqs = self._seqs
        try:
            batch = [seqs[s] for s in seq_ids]
        except KeyError as e:
            raise KeyError(f"PagedKVCache: unknown sequence {e.args[0]}") from None
        if len(set(seq_ids)) != len(batch):
            raise ValueError("PagedKVCache.append_tokens: a sequence appears twice in one step")
        if tokens is not None and not isinstance(tokens, list):
            tokens = _token_ids(tokens)
        if tokens is not None and len(tokens) != len(batch):
            raise ValueError("PagedKVCache.append_tokens: one token per sequence")
        at_boundary = [s for s in batch if not s.num_tokens % bs]
        partial = [s for s in batch if s.num_tokens % bs]
        try:
            fresh, last, copies = self.pool.allocate_and_make_writable(
                len(at_boundary), [s.blocks[-1] for s in partial])
        except OutOfBlocksError as e:
            return self._exhausted(f"append_tokens for {len(batch)} sequences: {e}")
        if copies:
            self._copy_blocks(copies)
            for s, b in zip(partial, last):
                s.blocks[-1] = b
        for s, b in zip(at_boundary, fresh):
            s.blocks.append(b)
        slots = []
        add_slot = slots.append
        if tokens is None:
            for s in batch:
                n = s.num_tokens
                add_slot(s.blocks[-1] * bs + n % bs)
                s.num_tokens = n + 1
                s.last_hash = s.partial = None
        else:
            for s, tok in zip(batch, tokens):
                n = s.num_tokens
                add_slot(s.blocks[-1] * bs + n % bs)
                s.num_tokens = n + 1
                p = s.partial
                if p is not None:
                    p.append(tok)
                    if len(p) == bs:
                        self._register_full(s, n // bs, p)
                        s.partial = []
        return self._index(slots)

    def check_invariants(self) -> None:
        """Pool invariants, plus: every sequence holds exactly the blocks its
        length needs, and block reference counts equal the holders seen here."""
        self.pool.check_invariants()
        refs: dict[int, int] = {}
        for sid, s in self._seqs.items():
            if len(s.blocks) != -(-s.num_tokens // self.block_size):
                raise AssertionError(f"sequence {sid}: {len(s.blocks)} blocks for {s.num_tokens} tokens")
            for b in s.blocks:
                refs[b] = refs.get(b, 0) + 1
        for b, r in refs.items():
            if self.pool.ref_count(b) != r:
                raise AssertionError(f"block {b}: ref count {self.pool.ref_count(b)}, held by {r}")
        if self.pool.num_used != len(refs):
            raise AssertionError(f"{self.pool.num_used} blocks used, sequences hold {len(refs)}")

    # -------------------------------------------------------------- helpers
    def _seq(self, seq_id: int) -> _Seq:
        try:
            return self._seqs[seq_id]
        except KeyError:
            raise KeyError(f"PagedKVCache: unknown sequence {seq_id}") from None

    def _new_id(self) -> int:
        self._next_id += 1
        return self._next_id - 1

    def _index(self, values: list[int]) -> torch.Tensor:
        """An int64 tensor on the cache's device (from a buffer: a few times
        cheaper than torch.tensor(list) on the hot path)."""
        if not values:
            return torch.empty(0, dtype=torch.int64, device=self.device)
        t = torch.frombuffer(array("q", values), dtype=torch.int64)
        return t if self.device.type == "cpu" else t.to(self.device, non_blocking=False)

    def _slots_of(self, seq: _Seq, start: int, end: int) -> list[int]:
        bs, blocks = self.block_size, seq.blocks
        return [blocks[p // bs] * bs + p % bs for p in range(start, end)]

    def _register_full(self, seq: _Seq, index: int, tokens) -> None:
        h = _block_hash(seq.last_hash, tokens)
        self.pool.set_hash(seq.blocks[index], h)  # False: an equal block is cached already
        seq.last_hash = h

    def _copy_blocks(self, copies) -> None:
        if not copies:
            return
        src = self._index([c[0] for c in copies])
        dst = self._index([c[1] for c in copies])
        self.kv[:, :, dst] = self.kv[:, :, src]

    def _exhausted(self, what: str):
        if self.raise_on_exhausted:
            raise OutOfBlocksError(
                f"PagedKVCache out of blocks: {what} (pool of {self.num_blocks} blocks, "
                f"{self.pool.num_free} free, {self.pool.num_parked} of them cached prefix blocks); "
                "nothing was changed"
            )
        return None
