"""Module-level workloads for torchmem.preflight.run (importable by name in the child interpreter).

`measure(kind, device)` builds a small model, runs one training (or
inference) step on `device`, and returns the bytes its live tensors need on
a card (each storage rounded up to PyTorch's 512-byte allocation unit) and,
on CUDA, what PyTorch's allocator says is allocated beyond the cuBLAS
workspaces a warm-up created. The same call on the CPU gives the live
tensors the model needs there, to hold the fake GPU's numbers to.
"""
from __future__ import annotations

from typing import Any, Callable

import torch


def allocate(n_bytes: int) -> dict:
    """Allocates n_bytes on the device: what it allocated, seen from inside."""
    x = torch.empty(n_bytes, dtype=torch.uint8, device="cuda")
    return {"allocated": torch.cuda.memory_allocated(), "is_fake": x.device.type == "cuda"}


def card_bytes(tensors: list[torch.Tensor], device: str) -> int:
    """The device memory the tensors' distinct storages take, each rounded up to 512 bytes."""
    seen: dict[int, int] = {}
    for t in tensors:
        if t is None or t.device.type != torch.device(device).type:
            continue
        storage = t.untyped_storage()
        seen[storage.data_ptr()] = (storage.nbytes() + 511) // 512 * 512
    return sum(seen.values())


def state_tensors(*objects: Any) -> list[torch.Tensor]:
    """Parameters, gradients, buffers, optimizer and scaler state: what a training step keeps."""
    out: list[torch.Tensor] = []
    for obj in objects:
        if isinstance(obj, torch.nn.Module):
            for p in obj.parameters():
                out += [p, p.grad]
            out += list(obj.buffers())
        elif isinstance(obj, torch.optim.Optimizer):
            for state in obj.state.values():
                out += [v for k, v in state.items() if torch.is_tensor(v) and k != "step"]
        elif isinstance(obj, torch.amp.GradScaler):
            out += [t for t in (getattr(obj, "_scale", None), getattr(obj, "_growth_tracker", None)) if t is not None]
        elif torch.is_tensor(obj):
            out.append(obj)
    return out


def _warm_up(device: str) -> None:
    """Creates the cuBLAS and cuBLASLt workspaces (this thread's and the autograd engine's) before the count starts.

    torch 2.11 keeps a separate 1 MiB cuBLASLt workspace, made by the first
    matmul that takes the cuBLASLt path (gemm_and_bias) on a thread's handle:
    the warm-up runs the workloads' own layer shapes, plain and checkpointed
    (recomputed on the autograd thread), so that both threads have theirs.
    """
    from torch.utils.checkpoint import checkpoint

    lin = _mlp(device)
    lin(torch.ones(32, 64, device=device)).sum().backward()
    checkpoint(lin, torch.ones(32, 64, device=device, requires_grad=True), use_reentrant=False).sum().backward()
    with torch.autocast(device_type=torch.device(device).type, dtype=torch.bfloat16):
        lin(torch.ones(32, 64, device=device)).float().sum().backward()
    del lin


def _mlp(device: str) -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 64)).to(device)


def autocast_gradscaler(device: str) -> list[Any]:
    torch.manual_seed(0)
    model = _mlp(device)
    opt = torch.optim.AdamW(model.parameters())
    scaler = torch.amp.GradScaler(torch.device(device).type)
    with torch.autocast(device_type=torch.device(device).type, dtype=torch.bfloat16):
        loss = model(torch.randn(32, 64, device=device)).float().pow(2).mean()
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
    return [model, opt, scaler]


def checkpointing(device: str) -> list[Any]:
    from torch.utils.checkpoint import checkpoint

    torch.manual_seed(0)
    blocks = torch.nn.ModuleList([_mlp(device) for _ in range(3)])
    opt = torch.optim.SGD(blocks.parameters(), lr=0.1, momentum=0.9)
    x = torch.randn(32, 64, device=device)
    for block in blocks:
        x = checkpoint(block, x, use_reentrant=False)
    x.pow(2).mean().backward()
    opt.step()
    return [blocks, opt]


def _backend(device: str) -> str:
    """inductor on the card; aot_eager on the CPU, whose live tensors are the same and which compiles no C++."""
    return "inductor" if torch.device(device).type == "cuda" else "aot_eager"


def compiled(device: str) -> list[Any]:
    torch.manual_seed(0)
    model = _mlp(device)
    opt = torch.optim.Adam(model.parameters())
    step = torch.compile(model, backend=_backend(device))
    step(torch.randn(32, 64, device=device)).pow(2).mean().backward()
    opt.step()
    return [model, opt]


class _Attention(torch.nn.Module):
    def __init__(self, width: int, heads: int):
        super().__init__()
        self.heads = heads
        self.qkv = torch.nn.Linear(width, 3 * width)
        self.proj = torch.nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in self.qkv(x).split(c, dim=2))
        y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).contiguous().view(b, t, c))


class _GPTBlock(torch.nn.Module):
    def __init__(self, width: int, heads: int):
        super().__init__()
        self.ln1, self.ln2 = torch.nn.LayerNorm(width), torch.nn.LayerNorm(width)
        self.attn = _Attention(width, heads)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(width, 4 * width), torch.nn.GELU(),
                                       torch.nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class TinyGPT(torch.nn.Module):
    """A GPT in nanoGPT's shape: token and position embeddings, pre-norm blocks with causal SDPA attention and
    a GELU MLP, a final LayerNorm, and a head tied to the token embedding."""

    def __init__(self, vocab: int = 512, width: int = 128, layers: int = 2, heads: int = 4, context: int = 64):
        super().__init__()
        self.tokens, self.positions = torch.nn.Embedding(vocab, width), torch.nn.Embedding(context, width)
        self.blocks = torch.nn.ModuleList([_GPTBlock(width, heads) for _ in range(layers)])
        self.ln = torch.nn.LayerNorm(width)
        self.head = torch.nn.Linear(width, vocab, bias=False)
        self.head.weight = self.tokens.weight

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        x = self.tokens(idx) + self.positions(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln(x))
        return torch.nn.functional.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def nanogpt_compiled(device: str) -> list[Any]:
    """A nanoGPT-shaped training step, compiled (inductor on the card), with AdamW."""
    torch.manual_seed(0)
    model = TinyGPT().to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1)
    step = torch.compile(model, backend=_backend(device))
    idx = torch.randint(0, 512, (8, 64), device=device)
    step(idx, torch.roll(idx, -1, dims=1)).backward()
    opt.step()
    opt.zero_grad(set_to_none=False)
    return [model, opt]


class _Block(torch.nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn1 = torch.nn.BatchNorm2d(channels)
        self.conv2 = torch.nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = torch.nn.BatchNorm2d(channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(x + self.bn2(self.conv2(y)))


def resnet(device: str) -> list[Any]:
    """A small ResNet (stem, two residual blocks, pooling, a classifier), one SGD step."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3, padding=1, bias=False), torch.nn.BatchNorm2d(16),
                                torch.nn.ReLU(), _Block(16), _Block(16), torch.nn.AdaptiveAvgPool2d(1),
                                torch.nn.Flatten(), torch.nn.Linear(16, 10)).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    logits = model(torch.randn(8, 3, 32, 32, device=device))
    torch.nn.functional.cross_entropy(logits, torch.randint(0, 10, (8,), device=device)).backward()
    opt.step()
    return [model, opt]


# Hugging Face models built from a config (tiny; nothing is downloaded).

def gpt2_adamw(device: str) -> list[Any]:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_head=2, n_embd=64, vocab_size=512, n_positions=64,
                                       bos_token_id=0, eos_token_id=0)).to(device)
    opt = torch.optim.AdamW(model.parameters())
    ids = torch.randint(0, 512, (2, 32), device=device)
    model(input_ids=ids, labels=ids).loss.backward()
    opt.step()
    return [model, opt, ids]


def bert_inference(device: str) -> list[Any]:
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    model = BertModel(BertConfig(num_hidden_layers=2, num_attention_heads=2, hidden_size=64, intermediate_size=128,
                                 vocab_size=512, max_position_embeddings=64)).to(device).eval()
    ids = torch.randint(0, 512, (2, 32), device=device)
    with torch.no_grad():
        hidden = model(input_ids=ids).last_hidden_state
    return [model, ids, hidden]


def t5_training(device: str) -> list[Any]:
    from transformers import T5Config, T5ForConditionalGeneration

    torch.manual_seed(0)
    model = T5ForConditionalGeneration(T5Config(num_layers=2, num_decoder_layers=2, num_heads=2, d_model=64,
                                                d_kv=32, d_ff=128, vocab_size=512, decoder_start_token_id=0)).to(device)
    opt = torch.optim.AdamW(model.parameters())
    ids = torch.randint(0, 512, (2, 32), device=device)
    labels = torch.randint(0, 512, (2, 16), device=device)
    model(input_ids=ids, labels=labels).loss.backward()
    opt.step()
    return [model, opt, ids, labels]


class MoE(torch.nn.Module):
    """A mixture-of-experts feed-forward layer: a router picks each token's top 2 of 8 experts."""

    def __init__(self, dim: int = 64, experts: int = 8, top: int = 2):
        super().__init__()
        self.top = top
        self.router = torch.nn.Linear(dim, experts, bias=False)
        self.experts = torch.nn.ModuleList(torch.nn.Sequential(torch.nn.Linear(dim, 4 * dim), torch.nn.GELU(),
                                                               torch.nn.Linear(4 * dim, dim))
                                           for _ in range(experts))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        weights, chosen = self.router(x).softmax(-1).topk(self.top, dim=-1)
        load = torch.bincount(chosen.flatten(), minlength=len(self.experts))  # routing: tokens per expert
        out = torch.zeros_like(x)
        for e, expert in enumerate(self.experts):
            token, slot = torch.where(chosen == e)  # routing: the tokens sent to expert e
            out.index_add_(0, token, expert(x[token]) * weights[token, slot, None])
        return out, load


def moe(device: str) -> list[Any]:
    """An MoE layer's training step: which tokens each expert gets, so how much it allocates, follows device
    values (the router's choices), which are garbage on the fake GPU."""
    torch.manual_seed(0)
    model = MoE().to(device)
    opt = torch.optim.AdamW(model.parameters())
    out, load = model(torch.randn(256, 64, device=device))
    (out.pow(2).mean() + load.float().var() * 0).backward()
    opt.step()
    return [model, opt]


# Workloads whose allocations follow device values: preflight must warn where (Note [Data-dependent shapes]).
DATA_DEPENDENT: dict[str, Callable[[str], list[Any]]] = {"moe": moe}

KINDS: dict[str, Callable[[str], list[Any]]] = {
    "autocast_gradscaler": autocast_gradscaler, "checkpointing": checkpointing, "compiled": compiled,
    "nanogpt_compiled": nanogpt_compiled,
    "resnet": resnet, "gpt2_adamw": gpt2_adamw, "bert_inference": bert_inference, "t5_training": t5_training,
}


def measure(kind: str, device: str) -> dict[str, Any]:
    cuda = torch.device(device).type == "cuda"
    if cuda:
        _warm_up(device)
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
    kept = {**KINDS, **DATA_DEPENDENT}[kind](device)
    live = card_bytes(state_tensors(*kept), device)
    out: dict[str, Any] = {"live": live}
    if cuda:
        torch.cuda.synchronize()
        out["allocated"] = torch.cuda.memory_allocated() - base
        out["cudnn"] = torch.backends.cudnn.enabled
    return out
