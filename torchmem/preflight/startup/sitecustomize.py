"""Preflight's start-up hook (torchmem/preflight/hook.py): the launcher puts this folder first on PYTHONPATH.

A sitecustomize found further along the path (the environment's own) still
runs, after this one.
"""
import importlib
import os
import sys


def _chain() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    ours = sys.modules.pop("sitecustomize", None)
    path = sys.path[:]
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
    try:
        importlib.import_module("sitecustomize")
    except ImportError:
        pass
    finally:
        sys.path[:] = path
        if ours is not None:
            sys.modules["sitecustomize"] = ours


def _install() -> None:
    # By path, not `import torchmem`: the package's own imports (torch among them) must not run before the script's.
    import importlib.util

    where = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "hook.py")
    spec = importlib.util.spec_from_file_location("_torchmem_preflight_hook", where)
    hook = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = hook
    spec.loader.exec_module(hook)
    hook.install()


_install()
_chain()
