"""``evtfuse bench`` (hands its arguments to ``evtfuse.bench.main``) and ``evtfuse cache list | clear``.

Layer: cli. Both reach optional parts of evtfuse and say so (exit status 4) when they are
missing; an unusable cache folder (``EVTFUSE_CACHE_DIR``) is bad input (exit status 2).
"""

from __future__ import annotations

import typer

from ..errors import ConfigError
from .base import EXIT_MISSING, CliError, _fail


def bench(ctx: typer.Context):
    """Benchmarks (evtfuse.bench): every argument is passed on to evtfuse.bench.main.
    Use `evtfuse bench -- --help` for the benchmark's own options."""
    import importlib

    try:
        module = importlib.import_module("evtfuse.bench")
    except ImportError as exc:
        if getattr(exc, "name", None) != "evtfuse.bench":
            typer.echo(f"error: the benchmark module evtfuse.bench cannot be imported ({exc}); "
                       "`pip install -e .[bench]` installs what it needs", err=True)
            raise typer.Exit(EXIT_MISSING) from None
        module = None
    entry = getattr(module, "main", None)
    if entry is None:
        typer.echo("error: the benchmark module evtfuse.bench (with a main(argv) function) is not "
                   "available in this installation of evtfuse", err=True)
        raise typer.Exit(EXIT_MISSING)
    try:
        code = entry(list(ctx.args))
    except SystemExit as exc:  # argparse --help and errors
        code = exc.code
    raise typer.Exit(int(code or 0) if not isinstance(code, str) else 1)


def _cache_module():
    try:
        from ..runtime import cache
    except ImportError as exc:
        raise CliError(f"the kernel cache is not available ({exc})", EXIT_MISSING) from None
    return cache


def _size(n: int | None) -> str:
    if n is None:
        return "?"
    if n < 1024:
        return f"{n} bytes"
    return f"{n / 1024:.1f} KiB" if n < 1 << 20 else f"{n / (1 << 20):.1f} MiB"


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def cache_list():
    """List what the cache holds: the generated kernel modules and the tuning choices, with
    their sizes (the folder is EVTFUSE_CACHE_DIR or ~/.cache/evtfuse)."""
    try:
        cache = _cache_module()
    except CliError as exc:
        _fail(exc)
    try:
        entries = cache.list_entries()  # malformed records are skipped, with a warning
        kernels = cache.list_kernels()
        others = cache.other_versions()
        folder = cache.cache_dir()
    except ConfigError as exc:  # an unusable EVTFUSE_CACHE_DIR
        _fail(CliError(str(exc)))
    typer.echo(f"cache: {folder}")
    if kernels:
        typer.echo("kernel modules (kernels/):")
        for k in kernels:
            name = k["file"].rsplit("/", 1)[-1]
            typer.echo(f"  {name}  {k['family']}  epilogue {k['epilogue']}  {_size(k['bytes'])}")
    if entries:
        typer.echo("tuning choices (tuning/):")
        for e in entries:
            head = e.get("kernel", "?")
            rest = ", ".join(f"{k}={v}" for k, v in sorted(e.items())
                             if k not in ("kernel", "file"))
            typer.echo(f"  {head}  {rest}  ({_size(cache.file_size(e['file']))})".rstrip())
    for name, files, size in others:
        typer.echo(f"other version {name}: {_plural(files, 'file')} ({_size(size)}; "
                   "`evtfuse cache clear` removes them)")
    triton_dir = cache.triton_cache_dir()
    if triton_dir:
        typer.echo(f"(Triton keeps the GPU binaries it compiles from these modules in its own "
                   f"cache, {triton_dir}: TRITON_CACHE_DIR)")
    total = len(entries) + len(kernels)
    if not total:
        typer.echo("no entries")
        return
    kernel_bytes = sum(k["bytes"] for k in kernels)
    parts = ([_plural(len(kernels), "kernel module") + f" ({_size(kernel_bytes)})"]
             if kernels else []) + ([_plural(len(entries), "tuning choice")] if entries else [])
    typer.echo(f"{total} entr{'y' if total == 1 else 'ies'}: {', '.join(parts)}")


def cache_clear():
    """Remove every evtfuse cache entry (generated kernels and tuning choices)."""
    try:
        cache = _cache_module()
    except CliError as exc:
        _fail(exc)
    try:
        n = cache.clear()
        root = cache.cache_dir().parent
    except ConfigError as exc:
        _fail(CliError(str(exc)))
    typer.echo(f"removed {n} file{'s' if n != 1 else ''} from {root}")
