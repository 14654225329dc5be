"""Snapshots written at an out-of-memory error: torchmem.dump_on_oom() (dump.py),
the files it writes (files.py), and the allocators it watches (backends.py)."""
from torchmem.runtime.oom.dump import DEFAULT_MAX_ENTRIES, DEFAULT_PATH, METADATA_KEY, dump_on_oom, dumping, written_snapshots

__all__ = ["DEFAULT_MAX_ENTRIES", "DEFAULT_PATH", "METADATA_KEY", "dump_on_oom", "dumping", "written_snapshots"]
