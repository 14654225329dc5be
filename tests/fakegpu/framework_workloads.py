"""Training steps through the common frameworks, for torchmem.preflight.run (tests/fakegpu/test_frameworks.py).

Each `measure(kind, device)` builds a tiny Hugging Face model from a config (nothing downloaded), trains it one
step through the framework, and returns the bytes its live tensors take on `device` (parameters, gradients,
buffers, optimizer state; each storage rounded up to 512 bytes). The packages come from
requirements-frameworks.txt; a kind whose package is missing raises ModuleNotFoundError.
"""
from __future__ import annotations

import os
import tempfile
from typing import Any, Callable

import torch

from tests.fakegpu.preflight_workloads import card_bytes, state_tensors


def _llama(device: str) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    return LlamaForCausalLM(config).to(device)


def _batch(device: str) -> dict[str, torch.Tensor]:
    ids = torch.randint(0, 512, (4, 64), generator=torch.Generator().manual_seed(1)).to(device)
    return {"input_ids": ids, "labels": ids}


def peft_lora(device: str) -> list[Any]:
    """PEFT's LoRA on the attention projections; AdamW over the adapters only."""
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(_llama(device), LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"]))
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad])
    model(**_batch(device)).loss.backward()
    opt.step()
    return [model, opt]


def liger(device: str) -> list[Any]:
    """liger-kernel's Triton kernels patched into the Llama modules (RMSNorm, RoPE, SwiGLU, fused linear
    cross-entropy) on the card; the plain modules on the CPU, where Triton does not run. The live tensors are
    the same."""
    if torch.device(device).type == "cuda":
        from liger_kernel.transformers import apply_liger_kernel_to_llama

        apply_liger_kernel_to_llama()
    model = _llama(device)
    opt = torch.optim.AdamW(model.parameters())
    model(**_batch(device)).loss.backward()
    opt.step()
    return [model, opt]


def _dataset() -> Any:
    from datasets import Dataset

    rows = torch.randint(0, 512, (8, 64), generator=torch.Generator().manual_seed(1)).tolist()
    return Dataset.from_dict({"input_ids": rows})


def _tokenizer() -> Any:
    """A word-level tokenizer of the model's 512 ids, built here (nothing downloaded)."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    vocab = {f"w{i}": i for i in range(509)} | {"<unk>": 509, "<pad>": 510, "</s>": 511}
    return PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token="<unk>")),
                                   unk_token="<unk>", pad_token="<pad>", eos_token="</s>")


def trl_sft(device: str) -> list[Any]:
    """TRL's SFTTrainer, one step on pre-tokenised rows; its own AdamW."""
    from trl import SFTConfig, SFTTrainer

    with tempfile.TemporaryDirectory() as out:
        args = SFTConfig(output_dir=out, max_steps=1, per_device_train_batch_size=4, report_to=[], save_strategy="no",
                         logging_strategy="no", use_cpu=torch.device(device).type == "cpu", dataloader_num_workers=0)
        trainer = SFTTrainer(model=_llama(device), args=args, train_dataset=_dataset(), processing_class=_tokenizer())
        trainer.train()
    return [trainer.model, trainer.optimizer.optimizer if hasattr(trainer.optimizer, "optimizer")
            else trainer.optimizer]


def trainer_fsdp(device: str) -> list[Any]:
    """The Hugging Face Trainer with Accelerate's FSDP plugin (FSDP2, full sharding), one step. On the card it
    runs as one rank of a distributed job (preflight --world-size); on the CPU as one process, unsharded."""
    from transformers import Trainer, TrainingArguments

    cuda = torch.device(device).type == "cuda"
    with tempfile.TemporaryDirectory() as out:
        args = TrainingArguments(output_dir=out, max_steps=1, per_device_train_batch_size=4, report_to=[],
                                 save_strategy="no", logging_strategy="no", use_cpu=not cuda,
                                 dataloader_num_workers=0,
                                 **({"fsdp": "full_shard", "fsdp_config": {"fsdp_version": 2,
                                                                          "transformer_layer_cls_to_wrap":
                                                                              ["LlamaDecoderLayer"]}}
                                    if cuda else {}))
        rows = _dataset().map(lambda row: {"labels": row["input_ids"]})
        trainer = Trainer(model=_llama("cpu"), args=args, train_dataset=rows)
        trainer.train()
    optimizer = trainer.optimizer.optimizer if hasattr(trainer.optimizer, "optimizer") else trainer.optimizer
    return [trainer.model_wrapped, optimizer]


def _zero(stage: int, device: str) -> list[Any]:
    """DeepSpeed ZeRO at `stage`, fp32, torch's AdamW, one step; on the card only (DeepSpeed needs one). Its
    step first checks the gradients for overflow, a device value read on the host: garbage on the fake GPU."""
    import deepspeed

    deepspeed.init_distributed(dist_backend="nccl", verbose=False)
    config = {"train_micro_batch_size_per_gpu": 4, "zero_optimization": {"stage": stage},
              "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "torch_adam": True}}}
    engine, optimizer, _, _ = deepspeed.initialize(model=_llama(device), config=config)
    engine.backward(engine(**_batch(device)).loss)
    engine.step()
    return [engine.module, optimizer.optimizer]


def zero2(device: str) -> list[Any]:
    return _zero(2, device)


def zero3(device: str) -> list[Any]:
    return _zero(3, device)


KINDS: dict[str, Callable[[str], list[Any]]] = {"zero2": zero2, "zero3": zero3, "peft_lora": peft_lora, "liger": liger, "trl_sft": trl_sft,
                                                "trainer_fsdp": trainer_fsdp}
PACKAGES = {"zero2": "deepspeed", "zero3": "deepspeed", "peft_lora": "peft", "liger": "liger_kernel", "trl_sft": "trl", "trainer_fsdp": "datasets"}  # with accelerate, which the fake-GPU tier has too


def local(tensors: list[Any]) -> list[torch.Tensor]:
    """Each DTensor's shard on this rank; other tensors as they are."""
    return [t.to_local() if hasattr(t, "to_local") else t for t in tensors if t is not None]


def shard_bytes(tensors: list[torch.Tensor], world: int) -> int:
    """The bytes one rank holds when each tensor is split in `world` along dimension 0, as FSDP2 does (each part
    padded to ceil(rows / world) rows), each storage rounded up to 512 bytes."""
    total = 0
    for t in tensors:
        rows = -(-t.shape[0] // world) if t.dim() else 1
        nbytes = rows * (t[0].numel() if t.dim() else 1) * t.element_size()
        total += (nbytes + 511) // 512 * 512
    return total


def measure(kind: str, device: str, world: int = 1) -> dict[str, Any]:
    """The live bytes; with `world`, also what one rank of that many would hold if every tensor were sharded;
    for a torch optimizer, how many of its parameters it holds and how many have Adam's moments."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    kept = KINDS[kind](device)
    tensors = local(state_tensors(*kept))
    out: dict[str, Any] = {"live": card_bytes(tensors, device)}
    if world > 1:
        out["shard"] = shard_bytes([t for t in tensors if t.device.type == torch.device(device).type], world)
    optimizer = kept[-1]
    if isinstance(optimizer, torch.optim.Optimizer):  # which parameters have Adam's two moments after the step
        # ZeRO-3 puts each partition into param_groups only while it steps; its state keeps them after.
        params = [p for group in optimizer.param_groups for p in group["params"]] or list(optimizer.state)
        out["optimized"] = len(params)
        out["with_moments"] = sum(1 for p in params if {"exp_avg", "exp_avg_sq"} <= set(optimizer.state.get(p, {})))
    norm = getattr(getattr(kept[0], "model", None), "norm", None)
    out["norm"] = type(norm).__name__ if norm is not None else None
    return out
