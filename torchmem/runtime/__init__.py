"""The runtime: what a training job loads with `import torchmem` and `torchmem.install()`.

- ``_install``: install() and uninstall(), on the CPU and on CUDA (``cuda``), with ``devices`` saying which
  allocator serves which device and ``cpu_settings`` the CPU's settings.
- ``memory``, ``summary`` and ``snapshot``: statistics, their table, and snapshots in PyTorch's format.
- ``arena``, ``paged``, ``planned`` and ``compact``: the scratch arena, the paged KV cache, planned steps and
  compaction.
- ``oom``: what is written when memory runs out (``dump_on_oom``).

The runtime imports the core, its glue (``torchmem._C``) and the formats, never a tool
(tests/package/test_layers.py). Users reach it through the face, ``torchmem.NAME``.
"""
