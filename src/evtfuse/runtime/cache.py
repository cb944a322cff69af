"""On-disk caches: generated kernel modules and autotuning choices.

Layer: runtime.host (below everything that loads or records). Everything lives under
``cache_dir()`` (``EVTFUSE_CACHE_DIR``, else ``~/.cache/evtfuse``), in a sub-folder named
by a version key (evtfuse, Triton and torch versions), so an upgrade never reads stale
entries. Writes are atomic (temp file in the same folder, then ``os.replace``), so
concurrent processes see a whole file or none. Keys fail closed: ``make_key`` refuses
values it cannot represent exactly. Nothing read back is trusted: a kernel module runs
from the source evtfuse generated (compiled here, never from bytecode beside the file),
and an entry that is not a regular file holding what evtfuse writes is absent (read
without blocking, so a FIFO cannot hang a reader). A root that cannot be used raises
``ConfigError`` naming ``EVTFUSE_CACHE_DIR``.

Several processes share one cache (a job's torchrun ranks): besides the atomic writes, a
tuning is done by one process at a time per key (``tuning_lock``: a lock file the others
wait on, then read the record it wrote), and threads of one process load a module once
(``load_module`` under a lock). Triton's own binary cache writes its files atomically too.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import linecache
import logging
import os
import shutil
import stat
import sys
import tempfile
import threading
import time
import types
from pathlib import Path
from typing import Any

import torch

from ..errors import ConfigError
from ..version import __version__

log = logging.getLogger("evtfuse")


def _version_key() -> str:
    import triton

    return f"v{__version__}-triton{triton.__version__}-torch{torch.__version__.split('+')[0]}"


def _root() -> tuple[Path, str]:
    """The cache root and how to name it in a message."""
    root = os.environ.get("EVTFUSE_CACHE_DIR")
    if root:
        return Path(root), f"EVTFUSE_CACHE_DIR={root}"
    base = Path.home() / ".cache" / "evtfuse"
    return base, f"the cache folder {base} (EVTFUSE_CACHE_DIR is not set)"


def _unusable(why: str) -> ConfigError:
    _, name = _root()
    return ConfigError(f"{name} is not a usable directory: {why}; set EVTFUSE_CACHE_DIR to a "
                       "folder evtfuse can create and write", variable="EVTFUSE_CACHE_DIR")


def cache_dir() -> Path:
    """This version's cache folder; ``ConfigError`` when the root exists but is not a
    folder (or cannot be looked at)."""
    base, _ = _root()
    try:
        mode = os.stat(base).st_mode
    except FileNotFoundError:
        mode = None  # created on the first write
    except OSError as exc:
        raise _unusable(exc.strerror or str(exc)) from None
    if mode is not None and not stat.S_ISDIR(mode):
        raise _unusable("it exists and is not a folder")
    return base / _version_key()


def _write(path: Path, text: str) -> None:
    """``atomic_write`` into the cache; a failure is the cache folder's ``ConfigError``."""
    try:
        atomic_write(path, text)
    except OSError as exc:
        raise _unusable(f"cannot write {path} ({exc.strerror or exc})") from None


def read_regular_bytes(path: Path, limit: int, prefix: bool = False) -> tuple[int, bytes]:
    """The size of ``path`` and its bytes, if it is a regular file. Opened without blocking
    (a FIFO in its place would block ``open`` until a writer came) and checked before
    reading; OSError when missing or not a regular file. With ``prefix`` its first
    ``limit`` bytes; else all of them, ValueError when there are more than ``limit``."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise OSError(f"{path} is not a regular file")
        if prefix:
            return info.st_size, os.read(fd, limit)
        if info.st_size > limit:
            raise ValueError(f"{path} holds {info.st_size} bytes, more than {limit}")
        chunks, size = [], 0
        while size <= limit:
            chunk = os.read(fd, limit + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > limit:
            raise ValueError(f"{path} holds more than {limit} bytes")
        return size, b"".join(chunks)
    finally:
        os.close(fd)


def read_regular(path: Path, limit: int) -> str:
    """The UTF-8 text of ``path`` if it is a regular file of at most ``limit`` bytes
    (``read_regular_bytes``); ValueError too when it is not UTF-8."""
    return read_regular_bytes(path, limit)[1].decode("utf-8")


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
_load_lock = threading.Lock()  # background tuning generates code in threads


def load_module(key: str, source: str):
    """Write ``source`` as ``kernels/k<key>.py`` (unless the file holds it already) and run
    ``source`` itself as the module (``import_source``): what is on disk is a record
    for people and for Triton's ``inspect``, never what runs. A module that does not
    import is removed again, so the cache never holds one. One thread at a time loads, so
    that two threads asking for one module get the same one."""
    mod = _loaded.get(key)
    if mod is not None:
        return mod
    with _load_lock:
        return _load_module(key, source)


def _load_module(key: str, source: str):
    mod = _loaded.get(key)
    if mod is not None:
        return mod
    path = cache_dir() / "kernels" / f"k{key}.py"
    try:
        same = read_regular(path, len(source.encode()) + 1) == source
    except (OSError, ValueError):
        same = False  # missing, or something else in its place: written anew
    if not same:
        _write(path, source)
    try:
        mod = import_source(f"evtfuse_generated_k{key}", path, source)
    except BaseException:
        sys.modules.pop(f"evtfuse_generated_k{key}", None)
        path.unlink(missing_ok=True)
        raise
    _loaded[key] = mod
    return mod


def import_source(name: str, path, source: str) -> Any:
    """Run ``source`` as module ``name`` whose file is ``path``, without the import system
    (which would run bytecode from ``__pycache__`` when its header matches the file, and
    write some): compiled here, registered in ``sys.modules`` and in ``linecache``, so
    that Triton's JIT, which reads its functions' source through ``inspect``, reads this
    very text whatever the file holds later."""
    filename = str(path)
    code = compile(source, filename, "exec", dont_inherit=True)
    mod = types.ModuleType(name)
    mod.__file__ = filename
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    sys.modules[name] = mod
    exec(code, mod.__dict__)  # noqa: S102 - evtfuse's own generated code, never user text
    return mod


# ---------------------------------------------------------------- tuning choices

# what a tuning record holds (the tuner writes these; other keys may follow): a record
# that lacks one or holds another type is not one evtfuse wrote, and is ignored
TUNING_FIELDS: dict[str, type] = {"kernel": str, "M": int, "N": int, "K": int, "L": int,
                                  "dtype": str, "epilogue": str, "tune": str, "device": str}
RECORD_LIMIT = 1 << 16  # bytes: a record is a few hundred


def record_problem(record: Any) -> str | None:
    """Why ``record`` is not a tuning record evtfuse wrote (None: it is one)."""
    if not isinstance(record, dict):
        return f"a JSON {type(record).__name__}, not an object"
    for field, kind in TUNING_FIELDS.items():
        if field not in record:
            return f"no {field!r}"
        value = record[field]
        if not isinstance(value, kind) or isinstance(value, bool):
            return f"{field!r} is {value!r}, not {kind.__name__}"
    return None


def _tuning_path(key: str) -> Path:
    return cache_dir() / "tuning" / f"{key}.json"


def _read_record(path: Path) -> dict | None:
    """The record in ``path``; None (logged, unless simply missing) when there is none or
    it is unreadable or malformed."""
    try:
        record = json.loads(read_regular(path, RECORD_LIMIT))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        log.warning("tuning record %s ignored: %s", path, exc)
        return None
    why = record_problem(record)
    if why:
        log.warning("tuning record %s ignored: %s", path, why)
        return None
    return record


def load_choice(key: str) -> dict | None:
    return _read_record(_tuning_path(key))


def store_choice(key: str, record: dict) -> None:
    why = record_problem(record)
    if why:  # fail closed: never write what load_choice would ignore
        raise ValueError(f"not a tuning record ({why}): {record!r}")
    _write(_tuning_path(key), json.dumps(record, indent=1, sort_keys=True))
    log.debug("tuning choice stored: %s -> %s", key, record["kernel"])


LOCK_TIMEOUT_S = 300.0  # the longest a process waits for another's tuning of a key


def lock_timeout_s() -> float:
    """``EVTFUSE_TUNE_LOCK_TIMEOUT_S`` (default ``LOCK_TIMEOUT_S``); ``ConfigError`` for a
    value that is not a number of seconds >= 0."""
    text = os.environ.get("EVTFUSE_TUNE_LOCK_TIMEOUT_S")
    if text is None:
        return LOCK_TIMEOUT_S
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0:
        raise ConfigError(f"EVTFUSE_TUNE_LOCK_TIMEOUT_S={text!r} is not a number of seconds "
                          ">= 0", variable="EVTFUSE_TUNE_LOCK_TIMEOUT_S")
    return value


@contextlib.contextmanager
def tuning_lock(key: str, timeout: float | None = None, poll_s: float = 0.05):
    """Hold ``tuning/<key>.lock`` (an exclusive ``flock``) for a tuning of ``key``: another
    process (or thread) tuning the same key waits, at most ``timeout`` seconds
    (``lock_timeout_s``), then reads the record the first one stored instead of tuning
    again. Yields whether the lock is held: False where there is no ``flock`` (not POSIX),
    the lock file cannot be opened, or the wait timed out (logged) - the caller then tunes
    without it, as before. The operating system releases the lock of a process that dies,
    so a crashed tuning never blocks the others."""
    try:
        import fcntl
    except ImportError:  # not POSIX
        yield False
        return
    timeout = lock_timeout_s() if timeout is None else timeout
    path = _tuning_path(key).with_suffix(".lock")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_NONBLOCK", 0)
                     | getattr(os, "O_CLOEXEC", 0), 0o644)
    except OSError as exc:
        log.debug("tuning lock %s not used: %s", path, exc)
        yield False
        return
    try:
        held = _acquire(fcntl, fd, path, timeout, poll_s)
        try:
            yield held
        finally:
            if held:
                fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def _acquire(fcntl, fd: int, path: Path, timeout: float, poll_s: float) -> bool:
    """Take the exclusive lock on ``fd`` within ``timeout`` seconds (polled)."""
    end = time.monotonic() + timeout
    waited = False
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            if waited:
                log.info("evtfuse: tuning lock %s taken after waiting", path.name)
            return True
        except BlockingIOError:
            pass
        except OSError as exc:  # a file system without locks
            log.debug("tuning lock %s not used: %s", path, exc)
            return False
        if time.monotonic() >= end:
            log.warning("evtfuse: another process held the tuning lock %s for over %.0f s "
                        "(EVTFUSE_TUNE_LOCK_TIMEOUT_S); tuning without it", path, timeout)
            return False
        if not waited:
            log.info("evtfuse: another process is tuning this problem; waiting for its "
                     "choice (%s)", path.name)
            waited = True
        time.sleep(poll_s)


def list_entries() -> list[dict]:
    """Tuning choices on disk (one dict each, with its file); malformed ones are skipped."""
    out = []
    folder = cache_dir() / "tuning"
    try:
        paths = sorted(folder.glob("*.json")) if folder.is_dir() else []
    except OSError as exc:
        raise _unusable(f"cannot list {folder} ({exc.strerror or exc})") from None
    for p in paths:
        rec = _read_record(p)
        if rec is not None:
            rec["file"] = str(p)
            out.append(rec)
    return out


KERNEL_HEADER_LIMIT = 4096  # bytes of a kernel module read to describe it


def _head(path: Path, limit: int) -> tuple[int, str] | None:
    """The size of ``path`` and the text of its first ``limit`` bytes, if it is a regular
    file (opened without blocking: a FIFO in its place never holds up a listing)."""
    try:
        size, head = read_regular_bytes(path, limit, prefix=True)
    except OSError:
        return None
    return size, head.decode("utf-8", "replace")


def _describe_kernel(text: str) -> tuple[str, str]:
    """(family, epilogue name) from a generated module's docstring (codegen.generate's
    header: ``evtfuse generated kernel (portable); key ...`` then ``dag epi(...)``)."""
    family = epilogue = "?"
    lines = text.splitlines()
    head = lines[0] if lines else ""
    if head.startswith('"""evtfuse generated kernel (') and ")" in head:
        family = head[len('"""evtfuse generated kernel ('):head.index(")")]
    for line in lines[1:8]:
        if line.strip().startswith("dag "):
            epilogue = line.strip()[4:].split("(")[0].strip() or "?"
            break
    return family, epilogue


def list_kernels() -> list[dict]:
    """The generated kernel modules on disk (``kernels/k<key>.py``), one dict each: its
    ``file``, size in ``bytes``, kernel ``family`` and ``epilogue`` name (from the module's
    docstring; ``?`` when it holds none). What is not a regular file is skipped."""
    folder = cache_dir() / "kernels"
    try:
        paths = sorted(p for p in folder.glob("*.py") if not p.name.startswith(".")) \
            if folder.is_dir() else []
    except OSError as exc:
        raise _unusable(f"cannot list {folder} ({exc.strerror or exc})") from None
    out = []
    for p in paths:
        head = _head(p, KERNEL_HEADER_LIMIT)
        if head is None:
            continue
        size, text = head
        family, epilogue = _describe_kernel(text)
        out.append({"file": str(p), "bytes": size, "family": family, "epilogue": epilogue})
    return out


def file_size(path: str | Path) -> int | None:
    """The size of a regular file (without opening it), else None."""
    try:
        info = os.stat(path)
    except OSError:
        return None
    return info.st_size if stat.S_ISREG(info.st_mode) else None


def other_versions() -> list[tuple[str, int, int]]:
    """The cache folders of other evtfuse / Triton / torch versions under the root (what
    ``clear`` removes too): (folder name, files, bytes) each."""
    here = cache_dir()
    root = here.parent
    out = []
    try:
        folders = sorted(f for f in root.glob("v*-triton*") if f != here and f.is_dir()) \
            if root.is_dir() else []
        for folder in folders:
            sizes = [file_size(p) for p in folder.rglob("*")]
            sizes = [n for n in sizes if n is not None]
            out.append((folder.name, len(sizes), sum(sizes)))
    except OSError as exc:
        raise _unusable(f"cannot list {root} ({exc.strerror or exc})") from None
    return out


def triton_cache_dir() -> str | None:
    """Where Triton keeps the binaries it compiles from evtfuse's modules (its own cache,
    ``TRITON_CACHE_DIR``; neither listed nor cleared by evtfuse)."""
    try:
        import triton

        return str(triton.knobs.cache.dir)
    except Exception:  # noqa: BLE001 - an older Triton without knobs
        return os.environ.get("TRITON_CACHE_DIR") or str(Path.home() / ".triton" / "cache")


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
