"""Two (or more) CPU processes joined by a gloo process group, each running a test's body
on Triton's interpreter (imported by name by the distributed test modules)."""

from __future__ import annotations

import os
import socket
import sys
import tempfile

import pytest
import torch.distributed as dist
import torch.multiprocessing as mp


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(rank: int, world: int, init: str, failures: str, body, args: tuple) -> None:
    from evtfuse.runtime.device import use_interpreter

    use_interpreter()
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    try:
        body(rank, world, *args)
    except BaseException as exc:  # reported to the parent through a file per rank
        with open(os.path.join(failures, f"rank{rank}.txt"), "w") as f:
            f.write(f"{type(exc).__name__}: {exc}")
        raise
    finally:
        dist.destroy_process_group()
    # passed: leave without the interpreter's shutdown, where the threads of a gloo group
    # that torch's DTensor and FSDP internals still hold after destroy_process_group can
    # abort the process ("terminate called without an active exception": once in four CI
    # runs, after the test had passed; evtfuse's own cache keyed on a group is weak,
    # test_distributed_lce checks it)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def run_ranks(body, *args, world: int = 2) -> None:
    """``body(rank, world, *args)`` in ``world`` processes (a module-level function: it is
    pickled by name); fails the test with each failing rank's error."""
    with tempfile.TemporaryDirectory() as failures:
        init = f"tcp://127.0.0.1:{_free_port()}"
        try:
            mp.spawn(_entry, args=(world, init, failures, body, args), nprocs=world, join=True)
        except Exception:
            texts = [open(os.path.join(failures, f)).read() for f in sorted(os.listdir(failures))]
            pytest.fail("\n".join(texts) or "a worker failed")
