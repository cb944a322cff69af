"""``evtfuse profile``: ``evtfuse run`` under Nsight Compute, and reading ncu's CSV.

Layer: cli. The problem is run once without ncu (compile, autotune, cache the choice), then
under ``ncu --csv --page raw``; ``parse_ncu_csv`` reads the rows and the metrics in
``NCU_METRICS`` are printed per kernel. Exit status 4 when ncu is not on PATH.
"""

from __future__ import annotations

import csv
import io
import shutil
import subprocess
import sys

import typer

from .base import EXIT_MISSING, EXIT_UNSUPPORTED, log


NCU_METRICS = (
    ("launch__registers_per_thread", "registers per thread"),
    ("launch__shared_mem_per_block_static", "static shared memory per block"),
    ("launch__shared_mem_per_block_dynamic", "dynamic shared memory per block"),
    ("gpu__time_duration.sum", "duration"),
    ("dram__bytes.sum", "DRAM bytes moved"),
    ("dram__bytes.sum.per_second", "achieved DRAM bandwidth"),
    ("dram__throughput.avg.pct_of_peak_sustained_elapsed", "DRAM throughput (% of peak)"),
    ("sm__throughput.avg.pct_of_peak_sustained_elapsed", "SM throughput (% of peak)"),
    ("gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed",
     "memory throughput (% of peak)"),
)


def parse_ncu_csv(text: str) -> list[dict[str, tuple[str, str]]]:
    """Rows of ``ncu --csv --page raw`` output: metric -> (value, unit), one dict per kernel."""
    lines = [ln for ln in text.splitlines() if ln.startswith('"')]
    if len(lines) < 2:
        return []
    rows = list(csv.reader(io.StringIO("\n".join(lines))))
    header, units, data = rows[0], rows[1], rows[2:]
    if not data or "ID" not in header:  # no units row
        header, data, units = rows[0], rows[1:], [""] * len(rows[0])
    out = []
    for row in data:
        out.append({h: (v, u) for h, v, u in zip(header, row, units)})
    return out


def profile(ctx: typer.Context):
    """Run (as `evtfuse run`, same options) under Nsight Compute and print registers, shared
    memory, achieved bandwidth and throughput of the fused kernel. Needs `ncu` on PATH.

    The problem is run once without ncu first (compile, autotune, cache the choice), then
    under ncu, which profiles the first launch of the chosen kernel."""
    ncu = shutil.which("ncu")
    if ncu is None:
        typer.echo("error: Nsight Compute's `ncu` is not on PATH, so nothing can be profiled. "
                   "Install Nsight Compute (it ships with the CUDA toolkit) and put ncu on PATH, "
                   "or use `evtfuse run` for timings.", err=True)
        raise typer.Exit(EXIT_MISSING)
    run_args = [a for a in ctx.args]
    base = [sys.executable, "-m", "evtfuse.cli", "run", *run_args]
    # first without ncu: compiles, autotunes and caches the choice (ncu must profile the
    # chosen kernel, not the tuner's candidates), and reports input errors plainly
    prep = subprocess.run(base + ["--iterations", "0", "--no-eager", "--no-verify"],
                          capture_output=True, text=True)
    if prep.returncode != 0:
        typer.echo(prep.stdout + prep.stderr, nl=False)
        raise typer.Exit(prep.returncode)
    typer.echo(prep.stdout, nl=False)
    cmd = [ncu, "--csv", "--page", "raw", "--kernel-name", "regex:evtfuse", "--launch-count", "1",
           "--metrics", ",".join(m for m, _ in NCU_METRICS),
           *base, "--no-verify", "--no-eager", "--iterations", "1", "--warmup", "0"]
    typer.echo("profiling with: " + " ".join(cmd[:8]) + " ... evtfuse run " + " ".join(run_args))
    log.debug("ncu command: %s", cmd)
    proc = subprocess.run(cmd, capture_output=True, text=True)
    rows = parse_ncu_csv(proc.stdout)
    if proc.returncode != 0 or not rows:
        typer.echo(proc.stdout[-4000:])
        typer.echo(proc.stderr[-4000:], err=True)
        typer.echo(f"error: ncu exited with status {proc.returncode} and "
                   f"{'no' if not rows else len(rows)} profiled kernel(s)", err=True)
        raise typer.Exit(proc.returncode or EXIT_UNSUPPORTED)
    for row in rows:
        name = row.get("Kernel Name", ("?", ""))[0]
        typer.echo(f"kernel: {name}")
        for metric, label in NCU_METRICS:
            if metric in row:
                value, unit = row[metric]
                typer.echo(f"  {label:34s} {value} {unit}".rstrip())
