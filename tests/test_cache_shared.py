"""One cache, several processes (a job's torchrun ranks), on the CPU: a class is tuned by one
process while the others wait on its lock file and take the choice it stored
(``cache.tuning_lock``); records written at once by several processes are read whole."""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import pytest
import torch

from evtfuse.errors import ConfigError
from evtfuse.runtime import cache

pytestmark = pytest.mark.usefixtures("own_cache")  # conftest.py

_TUNE_ONCE = """
import sys, time, torch, evtfuse
from evtfuse import EpilogueArguments, GemmArguments
from evtfuse.runtime import tuner
log = sys.argv[1]
tuner._times_on_device = lambda args: True

def search(args, cands, tune, cost=None):  # a tuning of a second, noted in the log
    with open(log, "a") as f:
        f.write("searched\\n")
    time.sleep(1.0)
    return cands[1]

tuner._search = search
A, B = torch.ones(64, 16), torch.ones(16, 96)
D = torch.empty(64, 96)
args = GemmArguments(A, B, D, epilogue=EpilogueArguments(
    "def e(accum, bias): D = relu(accum + bias); return D", bias=torch.ones(96), D=D))
print("CHOSEN", tuner.choose_kernel(args, "fast").name, flush=True)
"""


def _env() -> dict:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "TRITON_INTERPRET": "1"}


@pytest.mark.slow
def test_two_processes_tune_a_class_once(tmp_path):
    """Two processes started together ask for the same class: one tunes (its lock held),
    the other waits and takes the stored choice (or, started later, reads it): one
    search in all, one kernel for both."""
    log = tmp_path / "searches"
    procs = [subprocess.Popen([sys.executable, "-c", _TUNE_ONCE, str(log)], env=_env(),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err
    chosen = {line for out, _ in outs for line in out.splitlines() if line.startswith("CHOSEN")}
    assert len(chosen) == 1
    assert log.read_text() == "searched\n"


_WRITER = """
import sys
from evtfuse.runtime import cache
name = sys.argv[1]
record = {"kernel": name * 40, "M": 64, "N": 96, "K": 16, "L": 1, "dtype": "torch.float32",
          "epilogue": "e", "tune": "fast", "device": "cpu"}
for i in range(150):
    cache.store_choice("k" * 32, {**record, "M": i})
"""


@pytest.mark.slow
def test_records_written_by_several_processes_at_once_are_read_whole(caplog):
    """Two writers of one record and a reader in this process: every read is a whole
    record of one of them (atomic replace), never a torn or empty file."""
    procs = [subprocess.Popen([sys.executable, "-c", _WRITER, name], env=_env(),
                              stderr=subprocess.PIPE, text=True) for name in ("a", "b")]
    seen = set()
    with caplog.at_level(logging.WARNING, logger="evtfuse"):
        while any(p.poll() is None for p in procs):
            record = cache.load_choice("k" * 32)
            if record is not None:
                seen.add(record["kernel"])
    for p in procs:
        assert p.wait(timeout=300) == 0, p.stderr.read()
    assert "ignored" not in caplog.text  # no malformed record was ever read
    assert cache.load_choice("k" * 32)["kernel"] in ("a" * 40, "b" * 40)
    assert seen <= {"a" * 40, "b" * 40}
    leftovers = [p.name for p in (cache.cache_dir() / "tuning").iterdir()
                 if p.name.endswith(".tmp")]
    assert leftovers == []


def test_the_lock_is_exclusive_and_a_wait_times_out(caplog):
    """A second holder waits; past its timeout it goes on without the lock (logged)."""
    with cache.tuning_lock("x" * 32) as held:
        assert held
        with caplog.at_level(logging.WARNING, logger="evtfuse"):
            with cache.tuning_lock("x" * 32, timeout=0.2, poll_s=0.01) as second:
                assert second is False
        assert "tuning without it" in caplog.text
    with cache.tuning_lock("x" * 32, timeout=0) as again:  # released: taken at once
        assert again


def test_the_lock_timeout_setting_is_checked(monkeypatch):
    monkeypatch.setenv("EVTFUSE_TUNE_LOCK_TIMEOUT_S", "soon")
    with pytest.raises(ConfigError, match="EVTFUSE_TUNE_LOCK_TIMEOUT_S"):
        cache.lock_timeout_s()
    monkeypatch.setenv("EVTFUSE_TUNE_LOCK_TIMEOUT_S", "2.5")
    assert cache.lock_timeout_s() == 2.5


def test_a_module_is_loaded_once_by_threads_asking_at_once():
    """``load_module`` under its lock: threads asking for one module get the same one."""
    import threading

    source = "X = object()\n"
    got, barrier = [], threading.Barrier(4)

    def load():
        barrier.wait()
        got.append(cache.load_module("t" * 32, source))
    threads = [threading.Thread(target=load) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(got) == 4 and len({id(m) for m in got}) == 1
