"""The on-disk cache holds no trap: what is run is what was generated, a broken entry is absent.

Kernel modules run from the source evtfuse generated, never from bytecode found beside
the cached file; a tuning record that is not one evtfuse wrote (wrong JSON shape, missing
or mistyped fields, not a regular file, a FIFO that would block a reader) is ignored with
a log line, in ``evtfuse.gemm`` and in ``evtfuse cache list``; an unusable
``EVTFUSE_CACHE_DIR`` is an error that names it.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import sys
from importlib._bootstrap_external import _code_to_timestamp_pyc
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

import evtfuse
from evtfuse import EpilogueArguments, GemmArguments
from evtfuse.cli import app
from evtfuse.runtime import cache, tuner

from blocking import finishes

pytestmark = [pytest.mark.skipif(torch.cuda.is_available(),
                                 reason="CPU-interpreter tier (the cache itself is the same on a GPU)"),
              pytest.mark.usefixtures("own_cache")]  # conftest.py


def _record(**changes):
    rec = {"kernel": "portable_32x32x32", "M": 64, "N": 64, "K": 64, "L": 1,
           "dtype": "torch.float32", "epilogue": "epi", "tune": "fast", "device": "cpu"}
    rec.update(changes)
    return rec


# ------------------------------------------------------------------ kernel modules

def test_planted_bytecode_beside_a_cached_module_is_not_run():
    """A ``__pycache__/*.pyc`` whose header matches the cached ``.py`` (its mtime and size)
    is what Python's import system runs in place of the source; the cache runs the
    source it generated instead."""
    key, source = "plantedbytecode", "VALUE = 1\n"
    path = cache.cache_dir() / "kernels" / f"k{key}.py"
    path.parent.mkdir(parents=True)
    path.write_text(source)
    st = path.stat()
    evil = compile("VALUE = 666\n", str(path), "exec")
    pyc = Path(importlib.util.cache_from_source(str(path)))
    pyc.parent.mkdir()
    pyc.write_bytes(_code_to_timestamp_pyc(evil, int(st.st_mtime), st.st_size))
    assert cache.load_module(key, source).VALUE == 1


def test_cached_modules_leave_no_bytecode_behind(monkeypatch):
    monkeypatch.setattr(sys, "dont_write_bytecode", False)  # as without PYTHONDONTWRITEBYTECODE
    cache.load_module("nobytecode", "VALUE = 2\n")
    kernels = cache.cache_dir() / "kernels"
    assert (kernels / "knobytecode.py").read_text() == "VALUE = 2\n"
    assert not (kernels / "__pycache__").exists()


def test_module_file_changed_on_disk_runs_the_generated_source():
    """Whatever sits in the cached file (another text, a FIFO), the module runs the source
    evtfuse generated, and the file is rewritten with it."""
    kernels = cache.cache_dir() / "kernels"
    kernels.mkdir(parents=True)
    (kernels / "kedited.py").write_text("VALUE = 666\n")
    assert cache.load_module("edited", "VALUE = 3\n").VALUE == 3
    assert (kernels / "kedited.py").read_text() == "VALUE = 3\n"
    os.mkfifo(kernels / "kfifo.py")
    mod = finishes(lambda: cache.load_module("fifo", "VALUE = 4\n"), [kernels / "kfifo.py"])
    assert mod.VALUE == 4 and (kernels / "kfifo.py").read_text() == "VALUE = 4\n"


def test_generated_kernels_still_run_from_the_cache():
    """Triton reads a kernel's source through ``inspect`` (the interpreter rewrites it):
    modules loaded without the import system still compile and run."""
    A, B = torch.randn(16, 8), torch.randn(8, 16)
    out = evtfuse.gemm(A, B, "def epi(accum): D = relu(accum) * 0.5; return D")
    torch.testing.assert_close(out, torch.relu(A @ B) * 0.5, rtol=1e-4, atol=1e-4)


# ------------------------------------------------------------------ tuning records

BAD_RECORDS = {
    "kernel is a list": '{"kernel": []}',
    "a list": json.dumps([_record()]),
    "a number": "3",
    "a string": '"portable_32x32x32"',
    "null": "null",
    "empty object": "{}",
    "missing fields": json.dumps({"kernel": "portable_32x32x32"}),
    "kernel is a number": json.dumps(_record(kernel=5)),
    "M is text": json.dumps(_record(M="64")),
    "L is a bool": json.dumps(_record(L=True)),
    "not JSON": "{kernel",
    "not UTF-8": b"\xff\xfe{}",
}


def _write_raw(path: Path, text) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)


@pytest.mark.parametrize("name", list(BAD_RECORDS))
def test_malformed_tuning_record_is_absent(name, caplog):
    path = cache.cache_dir() / "tuning" / "bad.json"
    _write_raw(path, BAD_RECORDS[name])
    with caplog.at_level(logging.DEBUG, logger="evtfuse"):
        assert cache.load_choice("bad") is None
        assert cache.list_entries() == []
    assert any("bad.json" in r.getMessage() for r in caplog.records)


def test_valid_records_are_listed_beside_malformed_ones():
    cache.store_choice("good", _record(kernel="hopper_128x256x64"))
    _write_raw(cache.cache_dir() / "tuning" / "bad.json", '{"kernel": []}')
    entries = cache.list_entries()
    assert [e["kernel"] for e in entries] == ["hopper_128x256x64"]
    assert cache.load_choice("good")["kernel"] == "hopper_128x256x64"


def test_the_tuners_records_are_well_formed():
    """The tuner stores its choices only on a GPU; the record it would store is one the
    cache reads back (``cache.TUNING_FIELDS``)."""
    A, B, D = torch.randn(16, 8), torch.randn(8, 16), torch.empty(16, 16)
    args = GemmArguments(A, B, D)
    kernel = evtfuse.get_kernels(args)[0]
    record = tuner.tuning_record(args, kernel, "fast")
    assert cache.record_problem(record) is None
    cache.store_choice("tuned", record)
    assert cache.load_choice("tuned") == record


def test_store_choice_refuses_a_record_it_could_not_read_back():
    with pytest.raises(ValueError, match="tuning record"):
        cache.store_choice("x", {"kernel": "portable_32x32x32"})


def _gemm_case(scale: float):
    """A gemm call with an epilogue of its own, and the tuning key gemm will look up."""
    src = f"def epi(accum, C): D = accum * {scale} + C; return D"
    A, B, C, D = torch.randn(16, 8), torch.randn(8, 16), torch.randn(16, 16), torch.empty(16, 16)
    args = GemmArguments(A, B, D, torch.float32, EpilogueArguments(src, C=C, D=D))
    key = tuner.tuning_key(args, "fast", None)

    def call():
        return evtfuse.gemm(A, B, src, C=C, D=D)

    return call, key, A @ B * scale + C


@pytest.mark.parametrize("name", ["kernel is a list", "a list", "a number", "L is a bool"])
def test_gemm_runs_past_a_malformed_tuning_record(name):
    call, key, expected = _gemm_case(1.0 + list(BAD_RECORDS).index(name))
    _write_raw(cache.cache_dir() / "tuning" / f"{key}.json", BAD_RECORDS[name])
    torch.testing.assert_close(call(), expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("kind", ["fifo", "directory"])
def test_gemm_does_not_hang_on_a_record_that_is_not_a_file(kind):
    call, key, expected = _gemm_case(2.5 if kind == "fifo" else 3.5)
    path = cache.cache_dir() / "tuning" / f"{key}.json"
    path.parent.mkdir(parents=True)
    if kind == "fifo":
        os.mkfifo(path)
    else:
        path.mkdir()
    out = finishes(call, [path], timeout=120)
    torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-4)


# ------------------------------------------------------------------ evtfuse cache list

runner = CliRunner()


def test_cache_list_skips_malformed_records_and_fifos():
    folder = cache.cache_dir() / "tuning"
    cache.store_choice("good", _record())
    for i, text in enumerate(BAD_RECORDS.values()):
        _write_raw(folder / f"bad{i}.json", text)
    os.mkfifo(folder / "fifo.json")
    (folder / "dir.json").mkdir()
    res = finishes(lambda: runner.invoke(app, ["cache", "list"], catch_exceptions=False),
                    [folder / "fifo.json"])
    assert res.exit_code == 0, res.output
    assert "portable_32x32x32" in res.output and "1 entry" in res.output


# ------------------------------------------------------------------ EVTFUSE_CACHE_DIR

def _unwritable_dir(tmp_path: Path) -> Path:
    """A folder that cannot be written: read-only permissions, or for root (whom
    permissions do not stop) a path in sysfs."""
    if os.geteuid() != 0:
        d = tmp_path / "read-only"
        d.mkdir()
        d.chmod(0o555)
        return d
    return Path("/sys/evtfuse-test-cache")


@pytest.mark.parametrize("where", ["a file", "below a file", "not writable"])
def test_unusable_cache_dir_is_a_clear_error_naming_the_variable(where, tmp_path, monkeypatch):
    from evtfuse.errors import ConfigError

    afile = tmp_path / "afile"
    afile.write_text("not a folder")
    root = {"a file": afile, "below a file": afile / "sub",
            "not writable": _unwritable_dir(tmp_path)}[where]
    monkeypatch.setenv("EVTFUSE_CACHE_DIR", str(root))
    call, _, _ = _gemm_case(100.5 + ["a file", "below a file", "not writable"].index(where))
    with pytest.raises(ConfigError, match=f"EVTFUSE_CACHE_DIR={root} is not a usable directory") as e:
        call()
    assert e.value.variable == "EVTFUSE_CACHE_DIR"
    with pytest.raises(ConfigError, match="EVTFUSE_CACHE_DIR"):
        cache.store_choice("k", _record())


@pytest.mark.parametrize("command", ["list", "clear"])
def test_cache_commands_report_an_unusable_cache_dir(command, tmp_path, monkeypatch):
    afile = tmp_path / "afile"
    afile.write_text("not a folder")
    monkeypatch.setenv("EVTFUSE_CACHE_DIR", str(afile))
    res = runner.invoke(app, ["cache", command])
    assert res.exit_code == 2, res.output
    assert f"error: EVTFUSE_CACHE_DIR={afile} is not a usable directory" in res.output
    assert afile.read_text() == "not a folder"
