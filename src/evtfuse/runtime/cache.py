"""On-disk caches: generated kernel modules and autotuning choices.

Layer: runtime. Everything lives under ``cache_dir()`` (``EVTFUSE_CACHE_DIR``, else
``~/.cache/evtfuse``), in a sub-folder named by a version key (evtfuse, Triton and torch
versions), so an upgrade never reads stale entries. Writes are atomic (temp file in the
same folder, then ``os.replace``), so concurrent processes see a whole file or none.
Keys fail closed: ``make_key`` refuses values it cannot represent exactly.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

log = logging.getLogger("evtfuse")


def _version_key() -> str:
    import triton

    from .. import __version__
    return f"v{__version__}-triton{triton.__version__}-torch{torch.__version__.split('+')[0]}"


def cache_dir() -> Path:
    root = os.environ.get("EVTFUSE_CACHE_DIR")
    base = Path(root) if root else Path.home() / ".cache" / "evtfuse"
    return base / _version_key()


def atomic_write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _canon(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return float(value).hex()
    if isinstance(value, torch.dtype):
        return str(value)
    if isinstance(value, (tuple, list)):
        return [_canon(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _canon(v) for k, v in sorted(value.items())}
    raise TypeError(f"cannot build a cache key from {type(value).__name__} {value!r}")


def make_key(*parts: Any) -> str:
    """A stable hash of ``parts``; raises TypeError for a value it cannot represent."""
    text = json.dumps(_canon(list(parts)), sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


# ---------------------------------------------------------------- kernel modules

_loaded: dict[str, Any] = {}


def load_module(key: str, source: str):
    """Write ``source`` as ``kernels/<key>.py`` (once) and import it; a module that does
    not import is removed again, so the cache never holds one."""
    mod = _loaded.get(key)
    if mod is not None:
        return mod
    path = cache_dir() / "kernels" / f"k{key}.py"
    if not path.exists() or path.read_text() != source:
        atomic_write(path, source)
    try:
        mod = import_path(f"evtfuse_generated_k{key}", path)
    except BaseException:
        sys.modules.pop(f"evtfuse_generated_k{key}", None)
        path.unlink(missing_ok=True)
        raise
    _loaded[key] = mod
    return mod


def import_path(name: str, path) -> Any:
    """Import the Python file ``path`` as module ``name`` (registered in sys.modules:
    Triton's JIT reads its functions' source through it)."""
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


# ---------------------------------------------------------------- tuning choices

def _tuning_path(key: str) -> Path:
    return cache_dir() / "tuning" / f"{key}.json"


def load_choice(key: str) -> dict | None:
    path = _tuning_path(key)
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def store_choice(key: str, record: dict) -> None:
    atomic_write(_tuning_path(key), json.dumps(record, indent=1, sort_keys=True))
    log.debug("tuning choice stored: %s -> %s", key, record.get("kernel"))


def list_entries() -> list[dict]:
    """Tuning choices on disk (one dict each, with its file)."""
    out = []
    folder = cache_dir() / "tuning"
    if folder.is_dir():
        for p in sorted(folder.glob("*.json")):
            try:
                rec = json.loads(p.read_text())
            except (OSError, ValueError):
                continue
            rec["file"] = str(p)
            out.append(rec)
    return out


def clear() -> int:
    """Remove every evtfuse cache entry (all versions); returns how many files were removed.

    Only evtfuse's own version folders (``v*-triton*``) are touched, whatever the root is.
    """
    root = cache_dir().parent
    if not root.is_dir():
        return 0
    count = 0
    for folder in root.glob("v*-triton*"):
        if folder.is_dir():
            count += sum(1 for p in folder.rglob("*") if p.is_file())
            shutil.rmtree(folder, ignore_errors=True)
    _loaded.clear()
    return count
