"""The epilogue-memory partition of the Gluon kernels (``gluon_codegen``): a 1-warp
partition that TMA-loads each epilogue unit's aux tiles and vectors into its consumer's
shared buffers ahead of time (``_ef_mem_issue``, signalled by ``c_ready``) and TMA-stores
the outputs the consumer left in those buffers (``_ef_mem``, once ``d_ready``), reusing a
buffer set two units on.

Layer: backends/triton, below ``gluon_codegen``; reads ``gluon_kernel.GluonKernel``.
"""

from __future__ import annotations

from .gluon_kernel import GluonKernel
from .gluon_schedule import CONSTS, CONSTS_SIG, I1, I2, I3, SIZES, first_loads
from .versions import gluon_names

TMA_LOAD, TMA_STORE = (gluon_names()[k] for k in ("tma_load", "tma_store"))


def mem_issue(k: GluonKernel) -> list[str]:
    """``_ef_mem_issue``: the TMA loads of one unit's aux tiles and vectors (``c_ready``)."""
    names, bufs = k.names, k.bufs
    L = [
        "@gluon.jit",
        f"def _ef_mem_issue(t, start, nprog, num_pid_m, num_pid_n, c_ready, "
        f"{k.mem}{CONSTS_SIG}):",
        f"{I1}b = t % 2",
    ]
    if not (k.load_names or k.vec_names):
        return L + [f"{I1}mbarrier.arrive(c_ready.index(b))", "", ""]
    load_bytes = " + ".join(f"{names(n, 'desc')}.block_type.nbytes"
                            for n in k.load_names + [v for v, _ in k.vec_names]) or "0"
    L += [
        f"{I1}{k.bid}row0, col0 = _ef_unit_origin(t, start, nprog, num_pid_m, num_pid_n, BLOCK_M, "
        "BLOCK_N, GROUP_M)",
        f"{I1}mbarrier.expect(c_ready.index(b), {load_bytes})",
    ]
    for n, _ in bufs.loads:
        L.append(f"{I1}{TMA_LOAD}({names(n, 'desc')}, {bufs.at(n, 'row0', 'col0')}, "
                 f"c_ready.index(b), {names(n, 'lb')}.index(b))")
    for n, row in k.vec_names:
        at = "row0" if row else "col0"
        L.append(f"{I1}{TMA_LOAD}({names(n, 'desc')}, [{at}], c_ready.index(b), "
                 f"{names(n, 'vb')}.index(b))")
    return L + ["", ""]


def mem(k: GluonKernel) -> list[str]:
    """``_ef_mem``: the 1-warp partition storing each unit's outputs and loading the aux
    tiles of the unit two on (``d_ready``)."""
    names, bufs = k.names, k.bufs
    L = [
        "@gluon.jit",
        f"def _ef_mem(c_ready, d_ready, {k.go}{k.mem}{SIZES}, {CONSTS_SIG}):",
        *k.program,
        f"{I1}my_units = {'2 * ' if k.coop else ''}my_tiles",
        *first_loads(k.staged, f"{k.mem}{CONSTS}", k.coop),
        f"{I1}for t in range(my_units):",
        f"{I2}b = t % 2",
        f"{I2}{k.bid}row0, col0 = _ef_unit_origin(t, start, nprog, num_pid_m, num_pid_n, BLOCK_M, "
        "BLOCK_N, GROUP_M)",
        f"{I2}mbarrier.wait(d_ready.index(b), (t // 2) & 1)",
    ]
    for name, host in bufs.tile_stores:
        if (name, host) in bufs.consumer_tiles:
            continue  # the consumer stores it by chunk
        L.append(f"{I2}{TMA_STORE}({names(name, 'desc')}, {bufs.at(name, 'row0', 'col0')}, "
                 f"{names(host, 'lb')}.index(b))")
    return L + [
        f"{I2}if t + 2 < my_units:",
        f"{I3}tma.store_wait(pendings=0)  # the outputs have left buffer set b",
        f"{I3}_ef_mem_issue(t + 2, start, nprog, num_pid_m, num_pid_n, c_ready, "
        f"{k.mem}{CONSTS})",
        f"{I1}tma.store_wait(pendings=0)",
        "",
        "",
    ]
