"""``evtfuse precompile``: choose (on a GPU: tune) and compile a list of problems into the cache.

Layer: cli. The problems come from the flags (one epilogue, one problem per ``--mnkl``) and
from a JSON file of entries, each an object with ``run``'s flags as keys (``epilogue`` or
``epilogue_file``, ``mnkl``, ``ab_dtype``, ``c_dtype``, ``d_dtype``, ``acc_dtype``,
``operand``, ``output``, ``scalar``); operands are built as ``run`` builds them and handed
to ``evtfuse.precompile``. A line per problem as it ends, then a summary. Exit status 0
when every problem was precompiled, 3 when a kernel supports none of some, 2 on bad input.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from .base import EXIT_UNSUPPORTED, CliError, _fail, _user_errors
from .commands import (AbOpt, AccOpt, COpt, DOpt, EpilogueFileOpt, EpilogueOpt, OperandOpt,
                       OutputOpt, ScalarOpt, _spec)
from .device import Device, pick_device
from .problem import build_problem
from .sources import resolve_epilogue

ENTRY_KEYS = ("epilogue", "epilogue_file", "mnkl", "ab_dtype", "c_dtype", "d_dtype",
              "acc_dtype", "operand", "output", "scalar")
_LISTS = ("operand", "output", "scalar")
FILE_LIMIT = 1 << 20  # bytes of a problems file


def read_entries(path: str) -> list[dict[str, Any]]:
    """The entries of a JSON file: a list of objects with keys among ``ENTRY_KEYS``;
    ``CliError`` naming the file and the entry for anything else."""
    from ..runtime.cache import read_regular

    try:
        text = read_regular(Path(path), FILE_LIMIT)
    except FileNotFoundError:
        raise CliError(f"problems file '{path}' does not exist") from None
    except (OSError, ValueError) as exc:  # not a regular file, too large, not UTF-8
        raise CliError(f"problems file '{path}' cannot be read: {exc}") from None
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise CliError(f"{path} is not JSON: {exc}") from None
    if not isinstance(data, list):
        raise CliError(f"{path}: expected a JSON list of problems, got a {type(data).__name__}")
    for i, entry in enumerate(data):
        _check_entry(entry, f"{path}, entry {i}")
    return data


def _check_entry(entry: Any, where: str) -> None:
    if not isinstance(entry, dict):
        raise CliError(f"{where}: expected an object, got {type(entry).__name__}")
    unknown = sorted(set(entry) - set(ENTRY_KEYS))
    if unknown:
        raise CliError(f"{where}: unknown key {unknown[0]!r}; the keys are "
                       f"{', '.join(ENTRY_KEYS)}")
    for key, value in entry.items():
        wanted = list if key in _LISTS else str
        if not isinstance(value, wanted) or (wanted is list and
                                              not all(isinstance(v, str) for v in value)):
            raise CliError(f"{where}: {key} must be "
                           f"{'a list of strings' if wanted is list else 'a string'}, "
                           f"got {value!r}")


def _flag_entries(epilogue, epilogue_file, mnkl, common: dict) -> list[dict[str, Any]]:
    """The problems the flags give: the epilogue at each ``--mnkl`` (its default if none)."""
    if not (epilogue or epilogue_file):
        return []
    head = {"epilogue": epilogue} if epilogue else {"epilogue_file": epilogue_file}
    return [{**head, **common, **({"mnkl": m} if m else {})} for m in (mnkl or [None])]


def _build(entry: dict[str, Any], device: Device):
    source, _ = resolve_epilogue(entry.get("epilogue"), entry.get("epilogue_file"))
    spec = _spec(device, entry.get("mnkl"), entry.get("ab_dtype"), entry.get("c_dtype"),
                 entry.get("d_dtype"), entry.get("acc_dtype") or "f32", "k", "n",
                 entry.get("scalar"), None, None, entry.get("operand"), entry.get("output"),
                 0, False)
    return build_problem(source, spec, device).args


def precompile(
    entries: Annotated[Optional[str], typer.Argument(
        help="a JSON file: a list of problems, each an object with run's flags as keys "
             "(epilogue or epilogue_file, mnkl, ab_dtype, c_dtype, d_dtype, acc_dtype, "
             "and lists operand, output, scalar)")] = None,
    epilogue: EpilogueOpt = None, epilogue_file: EpilogueFileOpt = None,
    mnkl: Annotated[Optional[list[str]], typer.Option(
        help="M,N,K[,L] of a problem of the --epilogue (repeatable: one problem each)")] = None,
    ab_dtype: AbOpt = None, c_dtype: COpt = None, d_dtype: DOpt = None,
    acc_dtype: AccOpt = "f32", scalar: ScalarOpt = None, operand: OperandOpt = None,
    output: OutputOpt = None,
    tune: Annotated[str, typer.Option(help="fast | exhaustive | none: how each kernel is "
                                           "chosen on a GPU (kept in the cache)")] = "fast",
):
    """Compile (on a GPU: tune) problems ahead of time into the cache, so that a job's first
    calls, in any of its processes, find their kernels chosen and compiled.

    Example: evtfuse precompile -e "def epi(accum, bias): D = relu(accum + bias); return D"
    --mnkl 8192,8192,1024 --mnkl 4096,4096,4096 --ab-dtype bf16; or evtfuse precompile
    problems.json
    """
    import evtfuse
    from ..runtime import cache

    common = {k: v for k, v in (("ab_dtype", ab_dtype), ("c_dtype", c_dtype),
                                ("d_dtype", d_dtype), ("acc_dtype", acc_dtype),
                                ("scalar", scalar), ("operand", operand),
                                ("output", output)) if v}
    try:
        todo = (read_entries(entries) if entries else []) + \
            _flag_entries(epilogue, epilogue_file, mnkl, common)
        if not todo:
            raise CliError("nothing to precompile: give a JSON file of problems, or "
                           "--epilogue (or --epilogue-file) and --mnkl")
        if tune not in ("fast", "exhaustive", "none"):
            raise CliError(f"--tune is one of fast, exhaustive, none, not '{tune}'")
        device = pick_device()
        typer.echo(f"device: {device.description}")
        problems = [_build(entry, device) for entry in todo]
        t0 = time.perf_counter()
        results = evtfuse.precompile(
            problems, tune=tune,
            progress=lambda i, n, r: typer.echo(f"[{i}/{n}] {r.line()}"))
        folder = cache.cache_dir()
    except CliError as exc:
        _fail(exc)
    except _user_errors() as exc:
        _fail(CliError(str(exc)))
    done = [r for r in results if r.kernel is not None]
    hows = ", ".join(f"{sum(r.how == h for r in done)} {h}"
                     for h in ("tuned", "cached", "compiled") if any(r.how == h for r in done))
    typer.echo(f"precompiled {len(done)} of {len(results)} problems into {folder} in "
               f"{time.perf_counter() - t0:.1f} s{f' ({hows})' if hows else ''}")
    if len(done) < len(results):
        raise typer.Exit(EXIT_UNSUPPORTED)
