"""How fast the combine launch after a kernel (``combine.combine_partials``) reads its
partials at each launch shape (GPU, development tool): row logsumexp partials of T tiles
for EXT rows, read from DRAM (do_bench flushes L2 before each call, as the kernel's output
stream evicts them in a real call), for several results per program (BLOCK), partials per
step (PARTS) and warps, against ``combine.launch_shape``'s choice.

    PYTHONPATH=src python3 scripts/combine_shape_probe.py [--cases 64x8192,16x2048,128x64]
"""

from __future__ import annotations

import argparse

import torch
import triton
import triton.testing

from evtfuse.backends.triton.combine import combine_partials, launch_shape


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--cases", default="64x8192,32x8192,16x2048,128x64,16x16384")
    a = p.parse_args()
    for case in a.cases.split(","):
        T, EXT = (int(x) for x in case.split("x"))
        ws = torch.randn(T, EXT, device="cuda")
        ws2 = torch.rand(T, EXT, device="cuda") + 0.5
        out = torch.empty(EXT, device="cuda")
        want = None
        chosen = launch_shape(T, EXT)
        rows = []
        for block in (16, 32, 64, 128):
            for parts in (16, 32, 64, 128):
                if parts > max(16, triton.next_power_of_2(T)) or block * parts > 16384:
                    continue
                for warps in (2, 4, 8):
                    grid = (triton.cdiv(EXT, block), 1)

                    def fn(block=block, parts=parts, warps=warps, grid=grid):
                        combine_partials[grid](ws, ws2, out, T, EXT, 0, 1, OP="logsumexp",
                                               BLOCK=block, PARTS=parts, num_warps=warps)

                    fn()
                    if want is None:
                        want = out.clone()
                    torch.testing.assert_close(out, want, rtol=1e-6, atol=1e-6)
                    us = triton.testing.do_bench(fn, warmup=10, rep=100, return_mode="median") * 1e3
                    rows.append((us, block, parts, warps))
        rows.sort()
        mine = [r for r in rows if (r[1], r[2], r[3]) == chosen]
        print(f"== T={T} EXT={EXT}: launch_shape {chosen} "
              f"{mine[0][0] if mine else float('nan'):.2f} us; best: " + ", ".join(f"{u:.2f} us B{b} P{q} w{w}"
                                                      for u, b, q, w in rows[:5]))


if __name__ == "__main__":
    main()
