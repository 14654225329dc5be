"""Which card the fake GPU pretends to be: a size, or a card from the catalog of cards users rent.

A catalog card sets four things, each from a cited public figure:

- ``memory``: the ``total_memory`` that ``torch.cuda.get_device_properties()``
  reports on the real card (CUDA's ``totalGlobalMem``, as deviceQuery prints
  it). It is less than the marketed size and less than nvidia-smi's "Total".
  The fake card reports exactly this figure.
- ``capability`` and ``multiprocessors``: PyTorch sizes some workspaces by them.
- ``outside``: device memory a PyTorch process holds outside PyTorch's caching
  allocator: the CUDA context (driver state, loaded kernels) plus the
  libraries' own memory (cuBLAS, cuBLASLt and NVRTC modules). Preflight takes
  it from the card before the script runs, and its verdict counts it.

A bare size (``80GiB``) is a card of that total with no known outside
memory: nothing is assumed outside the allocator (``outside`` is None).

Sources of ``memory`` (bytes exact where the source prints bytes; to the MiB
where it prints torch's ``total_memory=...MB``, which is whole MiB rounded down):

=========  ===========================  =====================================================================
card       total_memory                 source
=========  ===========================  =====================================================================
h100-sxm   85,045,477,376 (81,106 MiB)  deviceQuery, driver 12.7: github.com/thamada/nvidia-smi
                                        gls/H100SXMx8_deviceQuery.py
h100-pcie  81,008 MiB                   torch's repr "NVIDIA H100 PCIe ... total_memory=81008MB,
                                        multi_processor_count=114" in a public script's comment
h200       143,156 MiB                  torch's repr "NVIDIA H200 ... total_memory=143156MB" in a public
                                        Modal example's comment (src/llm/vllm/vlm/skywork_r1v.py)
b200       182,642 MiB                  same file: "NVIDIA B200', major=10, minor=0, total_memory=182642MB,
                                        multi_processor_count=148"
a100-80gb  85,100,068,864 (81,158 MiB)  deviceQuery, driver 12.5: thamada/nvidia-smi gls/A100SXMx4_deviceQuery.py
a100-40gb  42,298,834,944 (40,339 MiB)  deviceQuery, driver 12.2: github.com/bottlerocket-os/bottlerocket
                                        pull 3873 ("NVIDIA A100-SXM4-40GB")
l40s       47,803,596,800 (45,589 MiB)  deviceQuery, driver 12.4: thamada/nvidia-smi gls/L40S_deviceQuery.py
l4         23,570,219,008 (22,478 MiB)  deviceQuery, driver 12.4: thamada/nvidia-smi gls/L4_deviceQuery.py
a10g       22,587 MiB                   torch 2.15 (cu130) repr "NVIDIA A10G ... total_memory=22587MB,
                                        multi_processor_count=80" in a public notebook
rtx4090    25,386,352,640 (24,210 MiB)  deviceQuery, driver 12.4: thamada/nvidia-smi gls/RTX4090_deviceQuery.py
rtx3090    25,327,697,920 (24,154 MiB)  deviceQuery, driver 12.6: thamada/nvidia-smi gls/RTX3090_deviceQuery.py
t4         15,095 MiB                   torch repr "Tesla T4 ... total_memory=15095MB", driver 550.54.15:
                                        github.com/mryab/efficient-dl-systems week01_intro/seminar.ipynb
=========  ===========================  =====================================================================

The same card reports a few hundred MiB more or less under other drivers
(H100 SXM: 81,079 to 81,106 MiB under drivers 12.7 to 13.0; RTX 4090: 24,081
to 24,564 MiB).

Sources of ``outside`` (no source measured every card; each figure is the
nearest cited measurement, so every ``outside`` is an estimate):

- libraries: 0.16 GiB (164 MiB), vLLM's "non_torch_memory" of a one-GPU run
  on an H100 (github.com/vllm-project/vllm pull 12126): memory outside the
  allocator that grew after the CUDA context existed.
- CUDA context, Ada (and, for want of a figure, Hopper and Blackwell, whose
  multiprocessor counts are close): 426 MiB on an RTX 6000 Ada (142
  multiprocessors, AD102 like the RTX 4090 and L40S), torch 2.10.0+cu130,
  with nothing allocated (github.com/unslothai/unsloth-zoo pull 1053).
- CUDA context, GA102 (RTX 3090, A10G): 256 MiB on an RTX 3090, torch
  2.7.1+cu128 (github.com/invoke-ai/InvokeAI issue 9413).
- CUDA context, A100: "~300MB" since CUDA 11.7's lazy loading, over 1000 MB
  before (github.com/pytorch/pytorch issue 107667).
- CUDA context, T4: 118 MiB: nvidia-smi's 150 MiB used less torch's 32 MiB
  reserved, driver 550.54.15 (the T4 notebook above).

Not counted here: NCCL's buffers (the NCCL stand-in takes its own estimate
from the device, fakegpu/nccl/nccl.c). Not counted anywhere: cuDNN's modules
(cuDNN is off under preflight), and CUDA graphs' memory outside the pools.
"""
from __future__ import annotations

from dataclasses import dataclass

from torchmem.sizes import parse_bytes

MiB = 1 << 20


@dataclass(frozen=True)
class Card:
    name: str
    memory: int              # bytes: the total_memory PyTorch reports
    capability: str = "9.0"  # "major.minor"
    multiprocessors: int = 132
    outside: int | None = None   # bytes held outside PyTorch's allocator; None: not known (a bare size)
    key: str | None = None       # the catalog name, None for a bare size
    total_source: str = ""
    outside_source: str = ""

    @property
    def outside_bytes(self) -> int:
        """The memory the verdict counts outside the allocator: 0 when not known."""
        return self.outside or 0

    @property
    def usable(self) -> int:
        """What PyTorch's allocator can get: the total less the memory outside it."""
        return self.memory - self.outside_bytes


_LIBRARIES = 164 * MiB  # vLLM's non_torch_memory on one H100 (0.16 GiB): cuBLAS, cuBLASLt, NVRTC modules
_LIBRARIES_SOURCE = "libraries 164 MiB (vLLM's non_torch_memory on one H100, vllm-project/vllm pull 12126)"
_CONTEXTS = {
    "ada": (426 * MiB, "context 426 MiB (RTX 6000 Ada, torch 2.10.0+cu130, unslothai/unsloth-zoo pull 1053)"),
    "hopper": (426 * MiB, "context 426 MiB as measured on an RTX 6000 Ada (142 multiprocessors): no Hopper or "
                          "Blackwell figure was found (unslothai/unsloth-zoo pull 1053)"),
    "ga102": (256 * MiB, "context 256 MiB (RTX 3090, torch 2.7.1+cu128, invoke-ai/InvokeAI issue 9413)"),
    "a100": (300 * MiB, "context ~300 MiB with lazy loading (pytorch/pytorch issue 107667)"),
    "t4": (118 * MiB, "context 118 MiB (T4, driver 550.54.15: 150 MiB used less 32 MiB reserved, "
                      "mryab/efficient-dl-systems week01_intro/seminar.ipynb)"),
}


def _card(key: str, name: str, memory: int, capability: str, sms: int, context: str, source: str) -> Card:
    size, context_source = _CONTEXTS[context]
    return Card(f"{name} (torchmem fake GPU)", memory, capability, sms, size + _LIBRARIES, key, source,
                f"estimate: {context_source} + {_LIBRARIES_SOURCE}")


_NVSMI = "deviceQuery, github.com/thamada/nvidia-smi gls/"
_MODAL = "torch's repr in a public Modal example (src/llm/vllm/vlm/skywork_r1v.py)"

CARDS: dict[str, Card] = {c.key: c for c in [  # type: ignore[misc]
    _card("h100-sxm", "NVIDIA H100 80GB HBM3", 85_045_477_376, "9.0", 132, "hopper",
          _NVSMI + "H100SXMx8_deviceQuery.py, driver 12.7"),
    _card("h100-pcie", "NVIDIA H100 PCIe", 81_008 * MiB, "9.0", 114, "hopper",
          "torch's repr 'total_memory=81008MB, multi_processor_count=114' in a public script (to the MiB)"),
    _card("h200", "NVIDIA H200", 143_156 * MiB, "9.0", 132, "hopper", _MODAL + ", to the MiB"),
    _card("b200", "NVIDIA B200", 182_642 * MiB, "10.0", 148, "hopper", _MODAL + ", to the MiB"),
    _card("a100-80gb", "NVIDIA A100-SXM4-80GB", 85_100_068_864, "8.0", 108, "a100",
          _NVSMI + "A100SXMx4_deviceQuery.py, driver 12.5"),
    _card("a100-40gb", "NVIDIA A100-SXM4-40GB", 42_298_834_944, "8.0", 108, "a100",
          "deviceQuery, driver 12.2, github.com/bottlerocket-os/bottlerocket pull 3873"),
    _card("l40s", "NVIDIA L40S", 47_803_596_800, "8.9", 142, "ada", _NVSMI + "L40S_deviceQuery.py, driver 12.4"),
    _card("l4", "NVIDIA L4", 23_570_219_008, "8.9", 58, "ada", _NVSMI + "L4_deviceQuery.py, driver 12.4"),
    _card("a10g", "NVIDIA A10G", 22_587 * MiB, "8.6", 80, "ga102",
          "torch 2.15 (cu130) repr 'total_memory=22587MB, multi_processor_count=80' in a public notebook "
          "(to the MiB)"),
    _card("rtx4090", "NVIDIA GeForce RTX 4090", 25_386_352_640, "8.9", 128, "ada",
          _NVSMI + "RTX4090_deviceQuery.py, driver 12.4"),
    _card("rtx3090", "NVIDIA GeForce RTX 3090", 25_327_697_920, "8.6", 82, "ga102",
          _NVSMI + "RTX3090_deviceQuery.py, driver 12.6"),
    _card("t4", "Tesla T4", 15_095 * MiB, "7.5", 40, "t4",
          "torch's repr 'total_memory=15095MB', driver 550.54.15, mryab/efficient-dl-systems "
          "week01_intro/seminar.ipynb (to the MiB)"),
]}

# Other names for catalog cards (the first four are the names earlier releases took).
ALIASES: dict[str, str] = {
    "h100": "h100-sxm", "a100": "a100-80gb", "a100-80": "a100-80gb", "a100-40": "a100-40gb",
    "h100-80gb": "h100-sxm", "4090": "rtx4090", "rtx-4090": "rtx4090", "3090": "rtx3090", "rtx-3090": "rtx3090",
    "tesla-t4": "t4",
}



def names() -> list[str]:
    """Every name --card takes, catalog names first."""
    return sorted(CARDS) + sorted(ALIASES)


def parse_memory(text: str) -> int:
    """Bytes from "80GiB", "24GB" (10**9), "512MiB", read by torchmem.sizes.parse_bytes; a unit is required."""
    try:
        value = parse_bytes(text, "card size")
    except ValueError as exc:
        message = str(exc)
        reason = (f"no unit: {message.split(' has no unit: ', 1)[1]}" if " has no unit: " in message
                  else "give a number with a unit (B, KiB, MiB, GiB, TiB, or KB, MB, GB, TB)")
        raise ValueError(f"card size {text!r}: {reason}, or a card: {', '.join(sorted(CARDS))}") from None
    if value < 2 << 20:
        raise ValueError(f"card size {text!r}: at least 2MiB")
    return value


def lookup(name: str) -> Card | None:
    """A catalog card by its name or an alias (case and surrounding blanks ignored), else None."""
    key = name.strip().lower()
    return CARDS.get(ALIASES.get(key, key))


def card(spec: str | int | Card) -> Card:
    """A Card from a catalog name, a size string or a number of bytes."""
    if isinstance(spec, Card):
        return spec
    if isinstance(spec, bool):
        raise TypeError("card must be a size like '80GiB', a byte count or a card name")
    if isinstance(spec, int):
        if spec < 2 << 20:
            raise ValueError(f"card size {spec} bytes: at least 2MiB")
        return Card("torchmem fake GPU", spec)
    if not isinstance(spec, str):
        raise TypeError(f"card must be a size like '80GiB', a byte count or a card name, not {type(spec).__name__}")
    preset = lookup(spec)
    return preset if preset else Card("torchmem fake GPU", parse_memory(spec))
