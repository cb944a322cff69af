"""Triton's key of itself, kept on disk between processes.

Layer: runtime.host (beside ``runtime.cache``, whose folder it writes in). Before a process's
first compile or cached-kernel lookup, Triton computes ``triton_key()``
(``triton.runtime.cache``): a SHA-256 of its compiler, backend and language sources and of
its ``libtriton`` library, hundreds of MB. On an H200 that was 0.40 s of a second process's
0.83 s first call (``benchmarks/cold_start.py --profile``, BENCHMARKS.md "First calls").

``install`` reads the key a previous process computed where every file it covers has the
size and modification time it had then (their ``stat``, not their bytes: milliseconds), and
puts it in Triton's place, as Triton's own compile-warmup pool does; else it computes
Triton's key once and stores it; either in a thread, beside the first call's other work.
The value is Triton's own, so Triton's cache keys are unchanged; a Triton whose files
changed (another release, an edited source) gets a stamp of its own. Any failure leaves
Triton to compute its key itself (logged at debug level).
``EVTFUSE_TRITON_KEY_CACHE=0`` turns it off.
"""

from __future__ import annotations

import hashlib
import logging
import os
import sysconfig
import threading

from . import cache

log = logging.getLogger("evtfuse")

_lock = threading.Lock()
_installed = False
KEY_LIMIT = 1 << 20  # bytes of a stored key read back (Triton's: about 20 KB)


def enabled() -> bool:
    return os.environ.get("EVTFUSE_TRITON_KEY_CACHE", "1") != "0"


def covered_files(triton_dir: str) -> list[str]:
    """Every file ``triton_key`` reads (a superset: every ``.py`` under the folders it walks,
    and ``runtime/cache.py``, where it is defined), and the ``libtriton`` library."""
    files = [os.path.join(triton_dir, "runtime", "cache.py")]
    for sub in ("compiler", "backends", "language"):
        for root, dirs, names in os.walk(os.path.join(triton_dir, sub)):
            dirs.sort()
            files += [os.path.join(root, n) for n in sorted(names) if n.endswith(".py")]
    ext = sysconfig.get_config_var("EXT_SUFFIX").split(".")[-1]
    files.append(os.path.join(triton_dir, "_C", f"libtriton.{ext}"))
    return files


def stamp(triton_dir: str, version: str) -> str:
    """A name for the state of ``covered_files``: the version, each file's path, size and
    modification time."""
    h = hashlib.sha256(version.encode())
    for path in covered_files(triton_dir):
        st = os.stat(path)
        h.update(f"\n{path}\t{st.st_size}\t{st.st_mtime_ns}".encode())
    return h.hexdigest()[:32]


def _stored_or_computed(own) -> str:
    """The key stored for Triton's files as they are, else Triton's own (``own()``: its
    hash of them), stored for the next process."""
    import triton

    path = cache.cache_dir() / "triton_key" / (
        stamp(os.path.dirname(triton.__file__), triton.__version__) + ".txt")
    try:
        key = cache.read_regular(path, KEY_LIMIT)
    except (OSError, ValueError):
        key = ""
    if not (key.startswith(triton.__version__) and len(key) > len(triton.__version__) + 64):
        # none, or not a key Triton wrote (its version, then SHA-256s)
        key = own()
        cache.atomic_write(path, key)
    return key


def install() -> None:
    """Once per process, at a CUDA problem's first plan: put in Triton's place a function
    that waits for the key, and find the key (``_stored_or_computed``) in a thread of its
    own, so that the rest of a first call (imports, code generation) runs while Triton's
    files are hashed (C code that releases the GIL) or the stored key is read; a failure
    there leaves Triton's own function to compute it. A no-op when turned off or after the
    first call."""
    global _installed
    if _installed or not enabled():
        return
    with _lock:
        if _installed:
            return
        _installed = True
        try:
            import triton.runtime.cache as triton_cache
        except ImportError:
            return
        own = triton_cache.triton_key
        found: list[str] = []
        done = threading.Event()

        def find() -> None:
            try:
                found.append(_stored_or_computed(own))
            except Exception as exc:  # Triton computes its key itself
                log.debug("evtfuse: Triton's key not taken from the cache: %s", exc)
            finally:
                done.set()

        def waiting() -> str:
            done.wait()
            return found[0] if found else own()

        triton_cache.triton_key = waiting
        threading.Thread(target=find, name="evtfuse-triton-key", daemon=True).start()


__all__ = ["install", "enabled", "stamp", "covered_files"]
