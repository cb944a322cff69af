"""Does a bias's latency show in the hopper kernels' epilogue? (GPU, development tool.)

The hopper family loads each epilogue piece's slice of a per-column vector right before the
piece's math, after the previous piece's store: one L2 round trip per piece, not hidden.
This probe times the tuned kernel (and any ``--configs``) against variants of its source:
``top`` issues every piece's vector loads at the start of the tile's epilogue, ``ahead``
each piece's before the previous piece's store (``tile``, before the tile's mainloop, is
in ``_moved`` too: it spilled the 128x256 tiles, 2.3x slower). Beside them: cuBLAS's ``A @ B``, cuBLASLt's fused bias epilogue
(``torch._addmm_activation``) and the same kernel without the bias (the identity
epilogue), every system once per round, rounds interleaved. Every variant is verified
against PyTorch first.

    PYTHONPATH=src python3 scripts/vector_probe.py [--shape 4096x4096x4096] [--rounds 7] \
        [--only bias_relu,gelu_bias] [--configs 128x256x64s4w8e4g16] [--guarded]
"""

from __future__ import annotations

import argparse
import re

import torch
from probe_common import edited_launcher, epilogue_args, report_rounds

from evtfuse import EpilogueArguments, GemmArguments
from evtfuse.backends.triton.families import HopperFamily, TileConfig
from evtfuse.runtime.kernel import Kernel
from evtfuse.runtime.tuner import choose_kernel

CASES = {"bias_relu": ("def epi(accum, bias): D = relu(accum + bias); return D", False),
         "gelu_bias": ("def epi(accum, bias): D = gelu_tanh(accum + bias); return D", True)}
# generated names (backends/triton/names.py): bias is operand u0, D output u1 in both cases
_VEC = re.compile(r"^\s+(rn\d+ = off_n_c\b.*|v\d+_\d+ = tl\.load\(u0_ptr.*)$")


def _moved(src: str, where: str) -> str | None:
    """``src`` with the epilogue's vector loads (and their column indices) moved to the
    start of the epilogue (``top``) or before the tile's mainloop (``tile``); None when the
    source has no such loads or no place to put them."""
    if re.search(r"^\s+u\d+_ve\w* = tl\.load\(", src, re.M):
        return None  # loaded at the epilogue's top already (KernelSpec.early_vectors)
    lines = src.splitlines()
    vec = [ln for ln in lines if _VEC.match(ln)]
    if not vec:
        return None
    rest = [ln for ln in lines if not _VEC.match(ln)]
    if where == "ahead":
        return _one_piece_ahead(lines)
    if where == "top":
        anchor = next((i for i, ln in enumerate(rest) if ln.strip().startswith("rm = off_m_c")), None)
        moved = vec
        at = None if anchor is None else anchor + 1
    else:
        anchor = next((i for i, ln in enumerate(rest) if ln.strip().startswith("acc = tl.zeros")), None)
        moved = [re.sub(r"\boff_n_c\b", "off_n", ln) for ln in vec]
        at = anchor
    if at is None:
        return None
    indent = re.match(r"\s*", rest[at if where == "tile" else at - 1]).group(0)
    moved = [indent + ln.strip() for ln in moved]
    return "\n".join(rest[:at] + moved + rest[at:]) + "\n"


def _one_piece_ahead(lines: list[str]) -> str | None:
    """The source with piece s+1's vector loads (and column indices) placed before piece
    s's store: one piece's loads in flight at a time, behind the previous piece's math."""
    by_piece: dict[int, list[str]] = {}
    for ln in lines:
        if _VEC.match(ln):
            by_piece.setdefault(int(re.search(r"(?:rn|_)(\d+) = ", ln).group(1)), []).append(ln)
    out, piece = [], 0
    for ln in lines:
        if _VEC.match(ln) and int(re.search(r"(?:rn|_)(\d+) = ", ln).group(1)) > 0:
            continue  # piece 0's stay; the others move up
        if ln.strip().startswith("u1_desc.store(") and piece + 1 in by_piece:
            out += by_piece[piece + 1]
            piece += 1
        elif ln.strip().startswith("u1_desc.store("):
            piece += 1
        out.append(ln)
    return "\n".join(out) + "\n"


def _check(name: str, fn, args: GemmArguments, expect: torch.Tensor) -> bool:
    D = args.epilogue.values["D"]
    D.fill_(float("nan"))
    fn()
    torch.cuda.synchronize()
    err = ((D.float() - expect).norm() / expect.norm()).item()
    if not err < 2e-2:
        print(f"   {name}: MISMATCH (relative error {err:.3g})", flush=True)
        return False
    return True


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--shape", default="4096x4096x4096")
    p.add_argument("--only", default=",".join(CASES))
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--rep-ms", type=float, default=100)
    p.add_argument("--guarded", action="store_true")
    p.add_argument("--configs", default="",
                   help="hopper tiles MxNxKsS[wW][eE][gG][o2] timed besides the tuned kernel")
    a = p.parse_args()
    M, N, K = (int(x) for x in a.shape.split("x"))
    for name in a.only.split(","):
        src, gelu = CASES[name]
        args = epilogue_args(src, M, N, K)
        A, B, bias = args.A, args.B, args.epilogue.values["bias"]
        expect = (torch.nn.functional.gelu((A @ B).float() + bias.float(), approximate="tanh")
                  if gelu else torch.relu((A @ B).float() + bias.float()))
        D_ident = torch.empty_like(args.epilogue.values["D"])
        ident = GemmArguments(A, B, D_ident, epilogue=EpilogueArguments(
            "def epi(accum): D = accum; return D", D=D_ident))
        tuned = choose_kernel(args)
        kernels = [tuned]
        for c in filter(None, a.configs.split(",")):
            m = re.fullmatch(r"(\d+)x(\d+)x(\d+)s(\d+)(?:w(\d+))?(?:e(\d+))?(?:g(\d+))?(o2)?", c)
            if m is None:
                raise SystemExit(f"config {c!r}: expected MxNxKsS[wW][eE][gG][o2]")
            bm, bn, bk, st = (int(m.group(i)) for i in range(1, 5))
            two = dict(ctas_per_sm=2, flatten=False) if m.group(8) else {}
            kernels.append(Kernel(HopperFamily(), TileConfig(
                bm, bn, bk, int(m.group(7) or 8), int(m.group(5) or 4), st,
                epi_split=int(m.group(6) or 1), **two), tuned.target))
        systems = {"mm": lambda: A @ B,
                   "lt": lambda: torch._addmm_activation(bias, A, B, use_gelu=gelu)}
        for k in kernels:
            systems[k.name] = lambda k=k: k.run(args)
            if k.family.name == "hopper":
                for where in ("top", "ahead"):
                    edited = _moved(k.source(args), where)
                    if edited is None:
                        print(f"   {k.name} {where}: no vector loads to move (or loaded "
                              "at the epilogue's top already)", flush=True)
                        continue
                    fn = edited_launcher(k, args, edited)
                    if _check(f"{k.name} {where}", fn, args, expect):
                        systems[f"{k.name} {where}"] = fn
            if k.family.supports(ident, k.target):
                ik = Kernel(k.family, k.config, k.target)
                systems[f"{k.name} identity"] = lambda ik=ik: ik.run(ident)
        report_rounds(f"{name} {a.shape}", systems, a.rounds, a.guarded, a.rep_ms)


if __name__ == "__main__":
    main()
