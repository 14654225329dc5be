"""Preflight at the shapes people train (tests/fakegpu/users_shapes.py), on a Hopper and an Ada card.

Each workload's bytes are held to what its shapes say, computed here from the configuration alone:
parameter counts by formula, AdamW's two moments per parameter, and the logits or sort outputs that
its step must hold at once. The L4 (compute capability 8.9) takes other sort paths than the H100 in
PyTorch; an embedding's backward sorts its 8,192 token ids, and the MoE and sampling steps sort more.
"""
from __future__ import annotations

import pytest

from tests.fakegpu import users_shapes as shapes
from torchmem import preflight

CARDS = ["h100", "l4"]
FP32 = 4


def rounded(numel_each: list[int], width: int = FP32) -> int:
    """Bytes of tensors of these sizes, each rounded up to PyTorch's 512-byte unit."""
    return sum((n * width + 511) // 512 * 512 for n in numel_each)


def run(fn, *args, card: str) -> tuple[dict, preflight.Report]:
    report = preflight.run(fn, *args, card=card, advise=False, timeout=900)
    assert report.fits, report.warnings
    return report.value, report


def check_adamw(value: dict, numel: int) -> None:
    assert value["numel"] == numel
    assert numel * FP32 <= value["params"] <= numel * FP32 + 512 * value["param_tensors"]
    assert value["moment_tensors"] == 2 * value["param_tensors"]
    assert value["moments"] == 2 * value["params"]


@pytest.mark.parametrize("card", CARDS)
def test_gpt2_at_8_by_1024_tokens_and_a_50k_vocabulary(card):
    value, report = run(shapes.gpt2, card=card)
    d, layers, vocab, context = 768, 2, 50257, shapes.TOKENS
    per_layer = 12 * d * d + 13 * d  # attention 4d² + 4d, MLP 8d² + 5d, two LayerNorms 4d
    check_adamw(value, vocab * d + context * d + layers * per_layer + 2 * d)
    assert value["grads"] == value["params"]
    logits = shapes.BATCH * shapes.TOKENS * vocab * FP32
    # At the loss, the parameters, the gradients' first buffers and the logits are live at once.
    assert report.devices[0].peak_allocated >= value["params"] + logits
    assert value["peak"] == report.devices[0].peak_allocated


@pytest.mark.parametrize("card", CARDS)
def test_the_hf_trainer_with_bf16_checkpointing_and_fused_adamw(card, tmp_path):
    value, report = run(shapes.qwen2_trainer, str(tmp_path), card=card)
    c = shapes.QWEN2
    d, kv = c["hidden_size"], c["hidden_size"] // c["num_attention_heads"] * c["num_key_value_heads"]
    attention = d * d + d + 2 * (d * kv + kv) + d * d  # q with bias, k and v with bias, o without
    mlp = 3 * d * c["intermediate_size"]
    numel = c["vocab_size"] * d + c["num_hidden_layers"] * (attention + mlp + 2 * d) + d  # tied head
    assert 90e6 < numel < 110e6
    check_adamw(value, numel)
    assert value["steps"] == 2 and value["fused"] is True and value["checkpointing"] is True
    bf16_logits = shapes.BATCH * shapes.TOKENS * c["vocab_size"] * 2
    assert report.devices[0].peak_allocated >= value["params"] + value["moments"] + bf16_logits


@pytest.mark.parametrize("card", CARDS)
def test_an_moe_top2_route_over_16k_tokens(card):
    value, report = run(shapes.moe, card=card)
    width, hidden, experts = 512, 1024, 64
    check_adamw(value, width * experts + 2 * experts * width * hidden)
    capacity = 2 * value["tokens"] // experts
    dispatched = experts * capacity * width * FP32
    peak = report.devices[0].peak_allocated
    assert peak >= value["params"] + value["grads"] + value["moments"] + dispatched


@pytest.mark.parametrize("card", CARDS)
def test_a_sampling_step_sorts_a_128k_vocabulary(card):
    value, report = run(shapes.sampling, card=card)
    batch, vocab = value["batch"], value["vocab"]
    assert value["sorted"] == rounded([batch * vocab]) + rounded([batch * vocab], width=8)  # fp32 values, int64 ids
    assert value["token_shape"] == [batch, 1]
    assert report.devices[0].peak_allocated >= value["sorted"] + rounded([batch * vocab])  # and the logits
