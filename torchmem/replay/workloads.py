"""Synthetic allocation traces of training workloads, for replays and demos.

`transformer_training` writes the allocation sequence of a decoder-only
transformer trained with mixed precision and Adam, step after step, with a
sequence length that changes every step (as with packed or bucketed data).
Sizes follow the tensors such a step creates: weights and optimizer state
that live for the whole run; per layer, the activations saved for backward;
the logits and their gradient; per-layer weight gradients that live from
backward until the optimizer step. The changing lengths are what fragments
a caching allocator's fixed-size segments.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Sequence

from torchmem.formats.traces import from_events
from torchmem.formats.trace_types import Trace


@dataclass(frozen=True)
class TransformerShape:
    hidden: int = 4096
    layers: int = 12
    vocab: int = 50304
    batch: int = 8
    ffn_mult: int = 4
    # Where gradients die: "never" (zero_grad(set_to_none=False)), "after_step"
    # (zero_grad right after optimizer.step()), or "before_backward" (the
    # common `loss = model(x); opt.zero_grad(); loss.backward(); opt.step()`,
    # where last step's gradients live through this step's forward).
    grads_freed: str = "before_backward"
    # Cache an fp16 causal mask per sequence length, as many model codes do.
    cache_masks: bool = True


class _Ids:
    def __init__(self) -> None:
        self.next = 0
        self.events: list[dict] = []

    def alloc(self, size: int) -> int:
        i = self.next
        self.next += 1
        self.events.append({"op": "alloc", "id": i, "size": int(size), "stream": 0})
        return i

    def free(self, *ids: int) -> None:
        for i in ids:
            self.events.append({"op": "free", "id": i})


def transformer_training_events(shape: TransformerShape, seq_lengths: Sequence[int], eval_tokens: int = 0) -> list[dict]:
    """Events of len(seq_lengths) training steps, one sequence length per step,
    then, if eval_tokens, an evaluation forward pass over that many tokens."""
    ev = _Ids()
    weights = _layer_weights(shape)
    _alloc_parameters(ev, shape, weights)
    grads: list[int] = []
    masks: dict[int, int] = {}
    for step, s in enumerate(seq_lengths):
        tokens = shape.batch * s
        saved, x = _training_forward(ev, shape, s, masks)
        grad_x = _loss_gradient(ev, shape, tokens, x)
        if shape.grads_freed == "before_backward":
            ev.free(*grads)
            grads = []
        _training_backward(ev, shape, tokens, weights, saved, grad_x, grads)
        if step == 0:                                  # Adam creates its state at the first step()
            _alloc_adam_state(ev, shape, weights)
        if shape.grads_freed == "after_step":
            ev.free(*grads)
            grads = []
    if eval_tokens:
        _evaluation(ev, shape, eval_tokens)
    return ev.events


def _layer_weights(shape: TransformerShape) -> list[int]:
    """The sizes of each layer's weight matrices, in elements."""
    h, f = shape.hidden, shape.ffn_mult
    return [(3 * h * h), (h * h), (f * h * h), (f * h * h)]  # qkv, out, fc1, fc2 (elements)


def _alloc_parameters(ev: _Ids, shape: TransformerShape, weights: list[int]) -> None:
    """The bf16 weights and fp32 master copies that live for the whole run: each layer's, then the embedding's."""
    h, V = shape.hidden, shape.vocab
    for _ in range(shape.layers):
        for n in weights:
            ev.alloc(2 * n)   # bf16 weights
            ev.alloc(4 * n)   # fp32 master copy
    ev.alloc(2 * V * h)       # embedding
    ev.alloc(4 * V * h)       # its master copy


def _training_forward(ev: _Ids, shape: TransformerShape, s: int, masks: dict[int, int]) -> tuple[list[list[int]], int]:
    """A forward pass at sequence length s: what each layer saves for backward, and the last layer's output."""
    h, b, f = shape.hidden, shape.batch, shape.ffn_mult
    tokens = b * s
    saved: list[list[int]] = []
    x = ev.alloc(2 * tokens * h)
    if shape.cache_masks and s not in masks:       # a causal mask cached per sequence length
        masks[s] = ev.alloc(2 * s * s)
    for _ in range(shape.layers):
        ln = ev.alloc(2 * tokens * h)
        qkv = ev.alloc(6 * tokens * h)
        scores = ev.alloc(4 * b * 32 * s)          # softmax statistics (flash attention)
        attn = ev.alloc(2 * tokens * h)
        tmp = ev.alloc(2 * tokens * h)             # projection output before the residual add
        fc1 = ev.alloc(2 * f * tokens * h)
        act = ev.alloc(2 * f * tokens * h)
        out = ev.alloc(2 * tokens * h)
        ev.free(tmp)
        saved.append([ln, qkv, scores, attn, fc1, act, x])
        x = out
    return saved, x


def _loss_gradient(ev: _Ids, shape: TransformerShape, tokens: int, x: int) -> int:
    """The fp32 logits of the last output x, their gradient, then the gradient of x, the one not freed."""
    h, V = shape.hidden, shape.vocab
    logits = ev.alloc(4 * tokens * V)              # fp32 logits
    grad_logits = ev.alloc(4 * tokens * V)
    ev.free(logits)
    grad_x = ev.alloc(2 * tokens * h)
    ev.free(grad_logits, x)
    return grad_x


def _training_backward(ev: _Ids, shape: TransformerShape, tokens: int, weights: list[int],
                       saved: list[list[int]], grad_x: int, grads: list[int]) -> None:
    """Backward through the layers, last first, freeing what each saved; adds to grads the gradients it creates."""
    h, f = shape.hidden, shape.ffn_mult
    create = not grads                             # backward creates gradients that do not exist
    if create:
        grads.append(ev.alloc(2 * shape.vocab * h))
    for layer in reversed(saved):
        g_act = ev.alloc(2 * f * tokens * h)
        if create:
            grads.extend(ev.alloc(2 * n) for n in weights[::-1])
        g_in = ev.alloc(2 * tokens * h)
        ev.free(g_act, grad_x, *layer)
        grad_x = g_in
    ev.free(grad_x)


def _alloc_adam_state(ev: _Ids, shape: TransformerShape, weights: list[int]) -> None:
    """Adam's two fp32 moments of every parameter: the embedding's, then each layer's."""
    for n in [shape.vocab * shape.hidden] + weights * shape.layers:
        ev.alloc(4 * n)
        ev.alloc(4 * n)


def _evaluation(ev: _Ids, shape: TransformerShape, tokens: int) -> None:
    """A forward pass under torch.no_grad(): activations die as soon as they are used."""
    h, f = shape.hidden, shape.ffn_mult
    x = ev.alloc(2 * tokens * h)
    for _ in range(shape.layers):
        qkv = ev.alloc(6 * tokens * h)
        attn = ev.alloc(2 * tokens * h)
        ev.free(qkv)
        fc1 = ev.alloc(2 * f * tokens * h)
        ev.free(attn)
        out = ev.alloc(2 * tokens * h)
        ev.free(fc1, x)
        x = out
    logits = ev.alloc(4 * tokens * shape.vocab)
    ev.free(logits, x)


# A run that ends in a fragmentation out-of-memory on an 80 GiB device with
# the default config: 11 layers of hidden 4096, gradients kept between steps
# (zero_grad(set_to_none=False)), a causal mask cached per length, and nine
# steps of varying length before one of 2,667 tokens whose fp32 logits need
# 4 GiB in one piece.
FRAGMENTING_SHAPE = TransformerShape(hidden=4096, layers=11, batch=8, grads_freed="never", cache_masks=True)
FRAGMENTING_LENGTHS = (1472, 1728, 2368, 1408, 2176, 1344, 2496, 1408, 1408, 2667)


def fragmenting_training() -> Trace:
    """The demo's trace: fails with the default config, completes with expandable segments."""
    return transformer_training(FRAGMENTING_SHAPE, FRAGMENTING_LENGTHS)


def transformer_training(
    shape: TransformerShape | None = None,
    seq_lengths: Sequence[int] = (1024, 2048, 1536, 2560),
    eval_tokens: int = 0,
) -> Trace:
    shape = shape or TransformerShape()
    return from_events(transformer_training_events(shape, seq_lengths, eval_tokens), name="transformer_training")
