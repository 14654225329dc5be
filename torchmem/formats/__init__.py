"""The files torchmem reads: snapshots, traces and their checks, with no torch and no runtime.

- ``input_files``: opening what users give (a file, a folder, compressed or not) and telling its format.
- ``safe_pickle``: unpickling a stranger's snapshot as data only.
- ``snapshot_format``: PyTorch's snapshot format, read, checked and built.
- ``snapshot_devices``: which device of a snapshot a command describes.
- ``annotations``: a trace's annotations and user metadata.
- ``traces`` and ``trace_types``: allocation traces as chunks of events, and their types and errors.

The layer sits above the core (``torchmem._core``) and below the tools: replay, viz, preflight and the
command line import it; it imports none of them (tests/package/test_layers.py).
"""
