"""Where dump_on_oom() writes its snapshots.

The path is a template: ``{rank}`` becomes the process's rank (from
torch.distributed once it is initialised, else the ``RANK`` environment
variable that torchrun sets, else 0) and ``{pid}`` its process id, both
read when the OOM happens. A file that exists is never overwritten: the
next free name among ``NAME``, ``NAME-2``, ``NAME-3`` ... (before the
extension) is taken, atomically (``O_CREAT | O_EXCL``), so a second OOM in
the same process, or another process given the same path, gets its own
file. A write that fails (a full disk) removes what it wrote.
"""
from __future__ import annotations

import errno
import os
import string
import tempfile
from typing import BinaryIO, Callable, Iterator

PLACEHOLDERS = ("rank", "pid")
DEFAULT_PATH = "oom_rank{rank}_pid{pid}.pickle"
MAX_CANDIDATES = 10_000


def check_template(template: str | os.PathLike) -> str:
    """The template as a string; ValueError for an empty one, a directory, or an unknown placeholder."""
    if not isinstance(template, (str, os.PathLike)):
        raise TypeError(f"path must be a str or os.PathLike like {DEFAULT_PATH!r}, not {type(template).__name__}")
    text = os.fspath(template)
    if not isinstance(text, str):
        raise TypeError(f"path must be a text path, not {type(text).__name__}")
    if not text.strip():
        raise ValueError("path is empty; give a file name such as " + repr(DEFAULT_PATH))
    if text.endswith(("/", os.sep)):
        raise ValueError(f"path {text!r} names a directory; give a file name in it, such as {text}{DEFAULT_PATH}")
    try:
        fields = [f for _, f, _, _ in string.Formatter().parse(text) if f is not None]
    except ValueError as e:
        raise ValueError(f"path {text!r} is not a valid template ({e}); use {{rank}} and {{pid}}, and {{{{ }}}} for braces") from None
    for field in fields:
        if field not in PLACEHOLDERS:
            raise ValueError(f"path {text!r} has an unknown placeholder {{{field}}}; the placeholders are "
                             + ", ".join("{" + p + "}" for p in PLACEHOLDERS))
    return text


def current_rank() -> int:
    """torch.distributed's rank when it is initialised, else $RANK, else 0."""
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return int(dist.get_rank())
    except Exception:  # a broken process group must not stop the snapshot
        pass
    value = os.environ.get("RANK", "").strip()
    return int(value) if value.isdigit() else 0


def format_path(template: str, rank: int | None = None, pid: int | None = None) -> str:
    """The template filled in with this process's (or the given) rank and pid, as an absolute path (~ expanded)."""
    rank = current_rank() if rank is None else rank
    pid = os.getpid() if pid is None else pid
    return os.path.abspath(os.path.expanduser(template.format(rank=rank, pid=pid)))


def prepare_directory(path: str) -> None:
    """Make the file's directory if missing and check a file can be created there.

    Raises the OSError subclass that says why not (PermissionError,
    NotADirectoryError, FileNotFoundError, OSError for a read-only file
    system ...), its message naming the directory.
    """
    directory = os.path.dirname(os.path.abspath(path))
    existing = directory
    while not os.path.exists(existing) and os.path.dirname(existing) != existing:
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        raise NotADirectoryError(errno.ENOTDIR, f"cannot write OOM snapshots in {directory}: {existing} is a file, "
                                                "not a directory")
    try:
        os.makedirs(directory, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=directory, prefix=".torchmem-probe-"):
            pass
    except OSError as e:
        reason = e.strerror or str(e)
        raise type(e)(e.errno, f"cannot write OOM snapshots in {directory}: {reason}") from None


def candidates(path: str) -> Iterator[str]:
    """path, then path with -2, -3, ... before its extension."""
    yield path
    base, ext = os.path.splitext(path)
    for n in range(2, MAX_CANDIDATES + 1):
        yield f"{base}-{n}{ext}"


def write_new(path: str, write: Callable[[BinaryIO], None]) -> str:
    """Write a new file at the first free name of candidates(path); returns its name.

    write(f) fills the file. The file is flushed to disk before this returns.
    On failure the partial file is removed and the OSError (or write's own
    exception) propagates; no existing file is ever opened for writing.
    """
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    for name in candidates(path):
        try:
            fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            continue
        except IsADirectoryError:
            continue
        try:
            with os.fdopen(fd, "wb") as f:
                write(f)
                f.flush()
                os.fsync(f.fileno())
        except BaseException:
            try:
                os.unlink(name)
            except OSError:
                pass
            raise
        return name
    raise OSError(errno.EEXIST, f"{MAX_CANDIDATES} files named like {path} exist already; not writing another")
