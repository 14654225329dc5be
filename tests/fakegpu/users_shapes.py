"""Workloads at the shapes people train, for torchmem.preflight.run (importable by name in the child).

Each returns what its tensors hold on the card, measured from the tensors themselves, so the test can
hold it to what the shapes say. Kernels are skipped on the fake GPU, so a 100M-parameter step takes
seconds; nothing here runs on the CPU.

- ``gpt2``: a GPT-2 language model from Hugging Face (a config, nothing downloaded), 50,257 tokens of
  vocabulary, batch 8 x 1,024 tokens, one AdamW step.
- ``qwen2_trainer``: a Qwen2-shaped model of about 100M parameters, fine-tuned by the HF Trainer at batch
  8 x 1,024 with bf16, activation checkpointing and fused AdamW, two steps.
- ``moe``: a top-2 route over 16,384 tokens and 64 experts, dispatched by a sort into fixed capacity.
- ``sampling``: a sampling step over a 128,256-token vocabulary: sort, top-p, multinomial.
"""
from __future__ import annotations

from typing import Any

import torch

BATCH, TOKENS = 8, 1024


def storage_bytes(tensors: list[torch.Tensor | None]) -> int:
    """The device bytes of the tensors' distinct storages, each rounded up to PyTorch's 512-byte unit."""
    seen: dict[int, int] = {}
    for t in tensors:
        if t is not None and t.is_cuda:
            storage = t.untyped_storage()
            seen[storage.data_ptr()] = (storage.nbytes() + 511) // 512 * 512
    return sum(seen.values())


def training_state(model: torch.nn.Module, opt: torch.optim.Optimizer) -> dict[str, int]:
    """Parameter, gradient and optimizer-state bytes on the card, and the parameter count."""
    params = [p for p in model.parameters() if p.requires_grad]
    moments = [v for s in opt.state.values() for k, v in s.items() if k in ("exp_avg", "exp_avg_sq")]
    return {"numel": sum(p.numel() for p in params), "params": storage_bytes(params),
            "grads": storage_bytes([p.grad for p in params]), "moments": storage_bytes(moments),
            "moment_tensors": len(moments), "param_tensors": len(params)}


def gpt2() -> dict[str, Any]:
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(vocab_size=50257, n_positions=TOKENS, n_embd=768, n_layer=2, n_head=12)
    model = GPT2LMHeadModel(config).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(0, config.vocab_size, (BATCH, TOKENS), device="cuda")
    model(input_ids=ids, labels=ids).loss.backward()
    opt.step()
    return {**training_state(model, opt), "vocab": config.vocab_size, "peak": torch.cuda.max_memory_allocated()}


class _Tokens(torch.utils.data.Dataset):
    """Random token ids of one length, as a tokenized corpus would give them."""

    def __init__(self, vocab: int, rows: int) -> None:
        self.vocab, self.rows = vocab, rows

    def __len__(self) -> int:
        return self.rows

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        ids = torch.randint(0, self.vocab, (TOKENS,), generator=torch.Generator().manual_seed(i))
        return {"input_ids": ids, "labels": ids.clone()}


# About 98M parameters: Qwen2's layout (grouped-query attention with biased q, k and v, a gated MLP, RMSNorm).
QWEN2 = dict(vocab_size=32000, hidden_size=768, intermediate_size=2048, num_hidden_layers=12, num_attention_heads=12,
             num_key_value_heads=2, max_position_embeddings=TOKENS, tie_word_embeddings=True)


def qwen2_trainer(out: str) -> dict[str, Any]:
    from transformers import Qwen2Config, Qwen2ForCausalLM, Trainer, TrainingArguments

    config = Qwen2Config(**QWEN2)
    model = Qwen2ForCausalLM(config)
    args = TrainingArguments(output_dir=out, per_device_train_batch_size=BATCH, max_steps=2, bf16=True,
                             gradient_checkpointing=True, optim="adamw_torch_fused", learning_rate=1e-4,
                             logging_steps=1, save_strategy="no", report_to=[], dataloader_num_workers=0,
                             disable_tqdm=True)
    trainer = Trainer(model=model, args=args, train_dataset=_Tokens(config.vocab_size, 2 * BATCH))
    trainer.train()
    opt = trainer.optimizer
    fused = all(group.get("fused") for group in opt.param_groups)
    return {**training_state(trainer.model, opt), "fused": fused, "steps": trainer.state.global_step,
            "checkpointing": trainer.model.is_gradient_checkpointing, "vocab": config.vocab_size}


class TopTwoMoE(torch.nn.Module):
    """A top-2 mixture of experts whose dispatch has fixed capacity: every size follows from the shapes."""

    def __init__(self, width: int = 512, hidden: int = 1024, experts: int = 64) -> None:
        super().__init__()
        self.experts = experts
        self.router = torch.nn.Linear(width, experts, bias=False)
        self.w1 = torch.nn.Parameter(torch.randn(experts, width, hidden) * 0.02)
        self.w2 = torch.nn.Parameter(torch.randn(experts, hidden, width) * 0.02)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens, width = x.shape
        weights, chosen = self.router(x).softmax(-1).topk(2, dim=-1)           # [tokens, 2]
        flat = chosen.flatten()                                                  # 2 * tokens expert ids
        order = flat.argsort(stable=True)                                        # the sort that groups tokens
        capacity = flat.numel() // self.experts                                  # fixed capacity per expert
        slots = order[: self.experts * capacity].view(self.experts, capacity)
        routed = x[slots // 2]                                                   # [experts, capacity, width]
        y = torch.bmm(torch.nn.functional.gelu(torch.bmm(routed, self.w1)), self.w2)
        out = torch.zeros_like(x).index_add_(0, (slots // 2).flatten(), y.view(-1, width))
        return out * weights.sum(-1, keepdim=True)


def moe(tokens: int = 16384) -> dict[str, Any]:
    model = TopTwoMoE().cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(tokens, 512, device="cuda", requires_grad=True)
    model(x).square().mean().backward()
    opt.step()
    return {**training_state(model, opt), "tokens": tokens, "peak": torch.cuda.max_memory_allocated()}


def sampling(vocab: int = 128256, batch: int = 8, top_p: float = 0.9) -> dict[str, Any]:
    logits = torch.randn(batch, vocab, device="cuda", dtype=torch.bfloat16).float() / 0.7
    values, indices = logits.sort(dim=-1, descending=True)
    probs = values.softmax(-1)
    keep = probs.cumsum(-1) - probs < top_p
    probs = probs.masked_fill(~keep, 0.0)
    choice = torch.multinomial(probs, 1)
    token = indices.gather(-1, choice)
    return {"sorted": storage_bytes([values, indices]), "token_shape": list(token.shape), "vocab": vocab,
            "batch": batch, "peak": torch.cuda.max_memory_allocated()}
