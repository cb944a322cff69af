"""``evtfuse run``, ``show`` and ``verify``: one epilogue, operands made from its flags.

Layer: tools (cli). The options ``run``, ``show`` and ``profile`` share are defined here
once. ``choose_kernel`` is looked up in ``report`` at call time, so that replacing it there
(as the tests do) takes effect here too; ``verify`` runs ``run`` through ``app.main``.
"""

from __future__ import annotations

import subprocess
from typing import Annotated, Optional

import typer

from ..runtime.autograd import caller_reductions  # a gated kernel's sums go to torch
from . import draw, report
from .app import main
from .base import EXIT_VERIFY, CliError, _fail, _user_errors
from .device import Device, pick_device
from .problem import (BuiltProblem, ProblemSpec, allocation_errors, build_problem,
                      problem_spec_from_flags, short_dtype)
from .report import eager_of, format_report, run_and_report
from .sources import resolve_epilogue, resolve_positional


# the options run, show and profile share
EpilogueOpt = Annotated[Optional[str], typer.Option(
    "--epilogue", "-e", help='epilogue source, e.g. "def epi(accum, C, alpha): D = alpha * accum '
                             '+ C; return D"')]
EpilogueFileOpt = Annotated[Optional[str], typer.Option(
    "--epilogue-file", "-f", help="path.py:fn (parsed with ast, never imported)")]
MnklOpt = Annotated[Optional[str], typer.Option(
    help="M,N,K,L (default 4096,4096,4096,1 on a GPU, 128,96,64,1 on the CPU)")]
AbOpt = Annotated[Optional[str], typer.Option("--ab-dtype", help="A and B (default bf16 GPU, f16 CPU)")]
COpt = Annotated[Optional[str], typer.Option("--c-dtype", help="full-tensor operands (default: ab)")]
DOpt = Annotated[Optional[str], typer.Option("--d-dtype", help="full outputs (default: c)")]
AccOpt = Annotated[str, typer.Option("--acc-dtype", help="accumulator")]
AMajorOpt = Annotated[str, typer.Option("--a-major", help="k: A row-major (M,K); m: column-major")]
BMajorOpt = Annotated[str, typer.Option("--b-major", help="n: B row-major (K,N); k: column-major")]
ScalarOpt = Annotated[Optional[list[str]], typer.Option(
    "--scalar", "-s", help="NAME=VALUE: a runtime scalar (repeatable)")]
AlphaOpt = Annotated[Optional[float], typer.Option(help="shortcut for --scalar alpha=VALUE")]
BetaOpt = Annotated[Optional[float], typer.Option(help="shortcut for --scalar beta=VALUE")]
OperandOpt = Annotated[Optional[list[str]], typer.Option(
    "--operand", help="NAME=KIND[:DTYPE], KIND one of full, row (M,1), col (N,), scalar (0-d), "
                      "batch-scalar (L,1,1). Default: full, but alpha/beta are runtime scalars and "
                      "bias is col")]
OutputOpt = Annotated[Optional[list[str]], typer.Option(
    "--output", help="NAME=KIND[:DTYPE], KIND one of full, row, col, scalar (reductions), none")]
SeedOpt = Annotated[int, typer.Option(help="random seed of the operands")]
Tf32Opt = Annotated[bool, typer.Option("--tf32", help="let fp32 inputs use TF32")]
Fp8AccOpt = Annotated[bool, typer.Option(
    "--fp8-fast-accum/--fp8-promote",
    help="fp8 inputs: the tensor cores' fast accumulation over all of K (default), or "
         "promotion to fp32 every k-step (slower; an error that does not grow with K)")]
KernelOpt = Annotated[Optional[str], typer.Option("--kernel", help="use the first kernel whose name "
                                                                   "contains this")]


def _spec(device, mnkl, ab_dtype, c_dtype, d_dtype, acc_dtype, a_major, b_major, scalar, alpha,
          beta, operand, output, seed, tf32, fp8_fast_accum=True) -> ProblemSpec:
    return problem_spec_from_flags(mnkl=mnkl, ab_dtype=ab_dtype, c_dtype=c_dtype, d_dtype=d_dtype,
                                   acc_dtype=acc_dtype, a_major=a_major, b_major=b_major,
                                   scalar=scalar or [], alpha=alpha, beta=beta,
                                   operand=operand or [], output=output or [], seed=seed,
                                   tf32=tf32, fp8_fast_accum=fp8_fast_accum, device=device)


def _describe(spec: ProblemSpec, where: str, built: BuiltProblem, device: Device) -> list[str]:
    lines = [f"device:   {device.description}",
             f"epilogue: {where}",
             f"problem:  M={spec.M} N={spec.N} K={spec.K} L={spec.L}, A {short_dtype(spec.ab_dtype)} "
             f"{spec.a_major}-major, B {short_dtype(spec.ab_dtype)} {spec.b_major}-major, "
             f"accumulator {short_dtype(spec.acc_dtype)}"]
    lines += ["  " + t for t in built.table]
    return lines


def run(
    epilogue: EpilogueOpt = None, epilogue_file: EpilogueFileOpt = None, mnkl: MnklOpt = None,
    ab_dtype: AbOpt = None, c_dtype: COpt = None, d_dtype: DOpt = None, acc_dtype: AccOpt = "f32",
    a_major: AMajorOpt = "k", b_major: BMajorOpt = "n", scalar: ScalarOpt = None,
    alpha: AlphaOpt = None, beta: BetaOpt = None, operand: OperandOpt = None,
    output: OutputOpt = None,
    verify: Annotated[bool, typer.Option(
        "--verify/--no-verify", help="compare every output with evtfuse.reference")] = False,
    iterations: Annotated[Optional[int], typer.Option(
        help="timed runs (default 20 GPU, 1 CPU); 0: no timing")] = None,
    warmup: Annotated[Optional[int], typer.Option(help="untimed runs first")] = None,
    eager: Annotated[bool, typer.Option(
        "--eager/--no-eager", help="also time unfused PyTorch")] = True,
    kernel: KernelOpt = None, seed: SeedOpt = 0, tf32: Tf32Opt = False,
    fp8_fast_accum: Fp8AccOpt = True,
    tune: Annotated[str, typer.Option(help="fast | exhaustive | none: autotune the kernel "
                                           "choice (kept in the cache) or take the first")] = "fast",
):
    """Run one epilogue fused into a GEMM: operands are made from its parameters and the flags.

    Example: evtfuse run -e "def epi(accum, C, alpha): D = alpha * accum + C; return D"
    --mnkl 4096,4096,4096,1 --ab-dtype bf16 --alpha 1.5 --verify
    """
    try:
        device = pick_device()
        source, where = resolve_epilogue(epilogue, epilogue_file)
        spec = _spec(device, mnkl, ab_dtype, c_dtype, d_dtype, acc_dtype, a_major, b_major, scalar,
                     alpha, beta, operand, output, seed, tf32, fp8_fast_accum)
        built = build_problem(source, spec, device)
        for line in _describe(spec, where, built, device):
            typer.echo(line)
        k = report.choose_kernel(built.args, kernel, tune)
        iters = iterations if iterations is not None else (1 if device.interpreter else 20)
        warm = warmup if warmup is not None else (0 if device.interpreter else 5)
        with allocation_errors(spec):  # the reference and eager PyTorch allocate more
            rep = run_and_report(built.args, k, device,
                                 eager=eager_of(built.args) if eager else None,
                                 verify=verify, iterations=iters, warmup=warm)
        for line in format_report(rep, spec.flops, device):
            typer.echo(line)
        if rep.ok is False:
            raise typer.Exit(EXIT_VERIFY)
    except CliError as exc:
        _fail(exc)
    except _user_errors() as exc:
        _fail(CliError(str(exc)))


def show(
    target: Annotated[str, typer.Argument(help='path.py:fn, or the epilogue source as a string')],
    mnkl: MnklOpt = None, ab_dtype: AbOpt = None, c_dtype: COpt = None, d_dtype: DOpt = None,
    acc_dtype: AccOpt = "f32", a_major: AMajorOpt = "k", b_major: BMajorOpt = "n",
    scalar: ScalarOpt = None, alpha: AlphaOpt = None, beta: BetaOpt = None,
    operand: OperandOpt = None, output: OutputOpt = None, kernel: KernelOpt = None,
    source_code: Annotated[bool, typer.Option("--source/--no-source",
                                              help="print the generated kernel")] = True,
    backward: Annotated[bool, typer.Option(
        "--backward/--no-backward",
        help="print the backward epilogue (the gradients of A, B and every float tensor "
             "operand) and its DAG")] = True,
    png: Annotated[Optional[str], typer.Option(
        "--png", help="also draw the DAG (after the passes) to this file: .png, .svg or "
                      ".pdf (Graphviz's dot if installed, else matplotlib)")] = None,
):
    """Print the epilogue's DAG, its EVT view (as CUTLASS would nest it), its backward
    epilogue (in the mode evtfuse.gemm's backward="auto" picks for this K, and the other
    mode's source) and the generated Triton kernel for a given shape and dtypes; --png
    draws the DAG."""
    from .. import ir
    from ..passes import optimize

    try:
        device = pick_device()
        source, where = resolve_positional(target)
        spec = _spec(device, mnkl, ab_dtype, c_dtype, d_dtype, acc_dtype, a_major, b_major, scalar,
                     alpha, beta, operand, output, 0, False)
        built = build_problem(source, spec, device)
        for line in _describe(spec, where, built, device):
            typer.echo(line)
        dag = built.args.dag
        typer.echo("\n== DAG ==")
        typer.echo(ir.format_dag(dag))
        opt = optimize(dag)
        if ir.format_dag(opt) != ir.format_dag(dag):
            typer.echo("\n== DAG after the passes ==")
            typer.echo(ir.format_dag(opt))
        typer.echo("\n== EVT ==")
        typer.echo(ir.format_evt(opt))
        if png:
            try:
                how = draw.draw(opt, png)
            except (ValueError, RuntimeError, OSError, subprocess.CalledProcessError) as exc:
                raise CliError(f"--png: {exc}") from None
            typer.echo(f"\n(the DAG drawn to {png} by {how})")
        if backward:
            for line in backward_lines(built.args):
                typer.echo(line)
        if source_code:
            k = report.choose_kernel(built.args, kernel)
            typer.echo(f"\n== kernel {k.name} ==")
            typer.echo(k.source(built.args))
    except CliError as exc:
        _fail(exc)
    except _user_errors() as exc:
        _fail(CliError(str(exc)))


def backward_lines(args) -> list[str]:
    """``show``'s backward section: the backward epilogue (``autodiff``) of ``args``'s epilogue
    with respect to A, B and every floating-point tensor operand, from every output that
    carries a gradient, its DAG after the passes, and what the forward keeps for it; in the
    mode "auto" picks for this K and dtype (``runtime.grad_plan.backward_mode``), with the
    rule, and the other mode's source."""
    import torch

    from .. import autodiff, ir
    from ..errors import EpilogueError
    from ..runtime.autograd import backward_mode, save_threshold, saved_accum_dtype

    dag = args.dag
    wrt = autodiff.wrt_of_dag(dag)
    names = ", ".join(["A", "B"] + sorted(w for w in wrt if w != autodiff.ACCUM))
    try:
        plan = autodiff.plan_forward(dag, wrt, args.epilogue.parsed)
    except EpilogueError as exc:
        return ["", "== backward ==", f"not differentiable: {exc}"]
    graded = [o.name for o in plan.differentiable_outputs()]
    if not graded:
        return ["", "== backward ==", "no output carries a gradient"]
    dtype = args.A.dtype
    keep = saved_accum_dtype(dtype)
    threshold = save_threshold(dtype, args.allow_tf32)
    mode = backward_mode("auto", args.K, dtype, args.allow_tf32)
    plans = {"recompute": plan}
    if autodiff.reads_accumulator(plan, args.L):
        plans["save"] = autodiff.plan_forward(dag, wrt, args.epilogue.parsed, save_accum=keep,
                                              batches=args.L)
        rule = (f"# backward mode: {mode} (backward=\"auto\" saves when K >= {threshold} "
                f"for {str(dtype).removeprefix('torch.')} A and B; here K = {args.K}): ")
        kept = plans["save"].saved_accums
        keep = kept[0].dtype if kept else keep  # fp32 beside a reduction the forward took
        rule += (f"the forward stores accum ({str(keep).removeprefix('torch.')}, "
                 "M x N more memory until the backward) and the backward kernel reads it "
                 "and runs no GEMM (K = 0)" if mode == "save" else
                 "the backward kernel recomputes A @ B")
    else:
        mode = "recompute"
        rule = "# the backward reads no accumulator: no GEMM (K = 0) and no accumulator saved, in any mode"
    bps = {m: caller_reductions(autodiff.backward(p, graded, wrt, batches=args.L,
                                                  name=f"{dag.name}_backward"))
           for m, p in plans.items()}
    bp, plan = bps[mode], plans[mode]
    lines = ["", f"== backward: the gradients of {names} from those of {', '.join(graded)} ==",
             rule]
    for s in plan.saved:
        how = "an extra output" if s.hidden else "the output itself"
        if s.role == "value":
            lines.append(f"# the forward keeps the result of {s.of} (a reduction feeding "
                         f"computation) in fp32 for the backward ({how})")
            continue
        if s.role == "decision":
            lines.append(f"# the forward keeps its decision on {s.of} for the backward ("
                         + ("a uint8 mask" if s.dtype == torch.uint8 else "a step's value "
                            "in fp32") + f", {how})")
            continue
        what = {"argument": "its argument", "result": "its result in fp32",
                "ties": "the mask of its ties (uint8)", "accum": "the accumulator"}[s.role]
        lines.append(f"# the forward keeps {what} for "
                     f"{'the' if s.role == 'accum' else s.of + chr(39) + 's'} gradient ({how})")
    lines.append(bp.source.rstrip())
    dacc = ("the gradients of gate and up interleaved (columns 2j and 2j + 1)" if dag.gated
            else "D")
    lines.append(f"# then, with dAccum = {dacc}: dA = dAccum @ B^T and dB = A^T @ dAccum "
                 "(torch matmuls)"
                 + (f"; {', '.join(sorted(bp.batch_summed))}: summed over L"
                    if bp.batch_summed else "")
                 + (f"; {', '.join(n for n, _, _ in bp.caller_sums)}: summed by torch ("
                    + ("a gated kernel computes no reductions" if bp.dag.gated else
                       "a kernel reduces no value computed from its own reduction feeding "
                       "computation") + ")" if bp.caller_sums else ""))
    lines += ["", "== backward DAG ==", ir.format_dag(bp.dag)]
    for other, obp in bps.items():
        if other != mode:
            lines += ["", f"== backward with backward=\"{other}\" ==", obp.source.rstrip()]
    return lines


def verify(ctx: typer.Context):
    """Check the fused kernel of an epilogue against the reference evaluator: `evtfuse run`
    with --verify and no timing (same options). Exit status 1 when an output differs."""
    main(["run", *ctx.args, "--verify", "--iterations", "0", "--no-eager"])
