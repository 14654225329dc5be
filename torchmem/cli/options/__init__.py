"""The arguments of each command, one module per command: each defines ``register(subparsers)``.

`torchmem --help` reads these alone. The command itself (torchmem/cli/NAME.py, its ``run(args)``) is
imported only when it runs, so the help loads no tool.
"""
