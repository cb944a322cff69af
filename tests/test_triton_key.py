"""``runtime.triton_key``: Triton's key of itself read from evtfuse's cache instead of
hashing Triton's files again in every process (0.40 s of a second process's first call on
an H200), the same value as Triton's own, computed again when a covered file changes; found
in a thread while the call goes on, Triton's function waiting for it."""

from __future__ import annotations

import os

import pytest
import triton
import triton.runtime.cache as triton_cache

from evtfuse.runtime import triton_key


@pytest.fixture
def fresh(monkeypatch, tmp_path):
    """A process's state: nothing installed, Triton's own function, an empty cache."""
    monkeypatch.setenv("EVTFUSE_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(triton_key, "_installed", False)
    monkeypatch.setattr(triton_cache, "triton_key", triton_cache.triton_key)
    return tmp_path


def _stored(root) -> list:
    return sorted(root.rglob("triton_key/*.txt"))


def test_first_process_stores_tritons_key_and_a_second_reads_it(fresh, monkeypatch):
    want = triton_cache.triton_key()
    triton_key.install()
    assert triton_cache.triton_key() == want
    (path,) = _stored(fresh)
    assert path.read_text() == want
    # a second process: Triton's own function would hash its files again
    monkeypatch.setattr(triton_key, "_installed", False)

    def hashed():
        raise AssertionError("hashed Triton's files again")

    monkeypatch.setattr(triton_cache, "triton_key", hashed)
    triton_key.install()
    assert triton_cache.triton_key() == want


def test_a_changed_file_or_a_bad_entry_computes_the_key_again(fresh, monkeypatch):
    triton_key.install()
    triton_cache.triton_key()  # waits for the thread that finds and stores it
    (first,) = _stored(fresh)
    want = first.read_text()
    real = triton_key.covered_files
    extra = fresh / "edited.py"
    extra.write_text("x = 1\n")
    monkeypatch.setattr(triton_key, "covered_files", lambda d: real(d) + [str(extra)])
    for case in ("new stamp", "bad entry"):
        monkeypatch.setattr(triton_key, "_installed", False)
        calls = []
        monkeypatch.setattr(triton_cache, "triton_key", lambda: calls.append(1) or want)
        if case == "bad entry":
            (path,) = [p for p in _stored(fresh) if p != first]
            path.write_text("not a key")
        triton_key.install()
        assert triton_cache.triton_key() == want
        assert calls == [1], case  # computed by Triton, once
    os.utime(extra, ns=(1, 1))  # another modification time: another stamp
    assert len({triton_key.stamp(os.path.dirname(triton.__file__), triton.__version__)}
               | {p.stem for p in _stored(fresh)}) == 3


def test_turned_off(fresh, monkeypatch):
    monkeypatch.setenv("EVTFUSE_TRITON_KEY_CACHE", "0")
    own = triton_cache.triton_key
    triton_key.install()
    assert triton_cache.triton_key is own and not _stored(fresh)


def test_the_key_is_found_in_a_thread_and_triton_waits_for_it(fresh, monkeypatch):
    """``install`` returns at once; Triton's function waits for the thread's key; a
    failure in the thread leaves Triton's own function to compute it."""
    import threading

    gate = threading.Event()
    want = triton_cache.triton_key()
    monkeypatch.setattr(triton_cache, "triton_key", lambda: gate.wait(10) and want)
    triton_key.install()  # the thread is blocked in Triton's hash (gate closed)
    assert not _stored(fresh)
    gate.set()
    assert triton_cache.triton_key() == want and len(_stored(fresh)) == 1
    monkeypatch.setattr(triton_key, "_installed", False)
    monkeypatch.setattr(triton_key, "_stored_or_computed", lambda own: 1 / 0)
    monkeypatch.setattr(triton_cache, "triton_key", lambda: "own")
    triton_key.install()
    assert triton_cache.triton_key() == "own"
