"""CPU tests of the benchmark suite's pure parts (nothing timed is asserted).

Workload definitions are checked against the reference evaluator at tiny sizes; the
runner and the command line run end to end on the CPU with a stand-in for
``evtfuse.gemm`` (built on the reference evaluator) and with the GPU timers replaced.
"""

from __future__ import annotations

import json
import math

import pytest
import torch

import evtfuse
from evtfuse import EpilogueArguments, EpilogueError, GemmArguments
from evtfuse.bench import build_parser, cli, main, report, runner
from evtfuse.bench import workloads as W

TINY = (8, 16, 12)  # M, N, K


# ----------------------------------------------------------------------------- shapes, args


def test_parse_shape_and_str():
    assert W.parse_shape("4096") == (4096, 4096, 4096)
    assert W.parse_shape("2048^3") == (2048, 2048, 2048)
    assert W.parse_shape("8192x8192x1024") == (8192, 8192, 1024)
    assert W.parse_shape(" 64X8192x8192 ") == (64, 8192, 8192)
    for bad in ("8192x1024", "axbxc", "0x1x1", ""):
        with pytest.raises(ValueError):
            W.parse_shape(bad)
    assert W.shape_str((4096, 4096, 4096)) == "4096^3"
    assert W.shape_str((16384, 4096, 4096)) == "16384x4096x4096"
    shown = {W.shape_str(s) for s in W.DEFAULT_SHAPES}
    assert shown == {"2048^3", "4096^3", "8192^3", "8192x8192x1024", "16384x4096x4096",
                     "64x8192x8192"}


def test_parse_cell_and_probe_set():
    w, shape = W.parse_cell("alpha_beta@8192x8192x1024")
    assert w is W.BY_NAME["alpha_beta"] and shape == (8192, 8192, 1024)
    for bad in ("alpha_beta", "no_such@2048", "alpha_beta@8192x1024"):
        with pytest.raises(ValueError):
            W.parse_cell(bad)
    v, o = W.probe_set(w, (24, 40, 16), seed=3, device="cpu")
    assert v["A"].shape == (24, 16) and v["B"].shape == (16, 40) and v["A"].dtype == torch.bfloat16
    assert torch.equal(v["A"], W.make_inputs(w, (24, 40, 16), torch.bfloat16, "cpu", 3)["A"])
    assert o["D"].shape == (24, 40)


def test_argparse_defaults_and_plan():
    args = build_parser().parse_args([])
    assert args.dtype == "bf16" and args.budget_s == 540 and not args.no_compile
    assert args.out == "bench_out" and args.tune == "fast"
    ws, shapes = cli.plan(args)
    assert [w.name for w in ws] == [w.name for w in W.WORKLOADS]
    assert shapes == list(W.DEFAULT_SHAPES)
    cells = W.cells_for(ws, shapes)
    assert len(cells) == (len(W.WORKLOADS) - 1) * len(shapes) + 1  # lmhead: its own shape
    assert cells[-1][0].name == "lmhead_ce" and cells[-1][1] == W.LMHEAD_SHAPE


def test_argparse_quick_and_overrides():
    ws, shapes = cli.plan(build_parser().parse_args(["--quick"]))
    assert [w.name for w in ws] == ["identity", "alpha_beta", "relu_aux", "bce_loss"]
    assert shapes == [(4096, 4096, 4096), (8192, 8192, 1024)]
    assert len(W.cells_for(ws, shapes)) == 8
    args = build_parser().parse_args(["--quick", "--workloads", "bias_relu,silu_mul",
                                      "--shapes", "2048,64x8192x8192", "--dtype", "fp16",
                                      "--no-compile", "--budget-s", "100", "--out", "x"])
    ws, shapes = cli.plan(args)
    assert [w.name for w in ws] == ["bias_relu", "silu_mul"]
    assert shapes == [(2048, 2048, 2048), (64, 8192, 8192)]
    assert args.dtype == "fp16" and args.no_compile and args.budget_s == 100


def test_argparse_errors():
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--dtype", "int4"])
    with pytest.raises(SystemExit):
        main(["--workloads", "nope"])
    with pytest.raises(SystemExit):
        main(["--shapes", "12x"])
    with pytest.raises(SystemExit):
        main(["--systems", "evtfuse,cutlass"])


def test_list_and_no_gpu(capsys):
    assert main(["--list"]) == 0
    assert "bce_loss" in capsys.readouterr().out
    if not torch.cuda.is_available():
        assert main(["--quick", "--out", "/nonexistent/never"]) == cli.EXIT_NO_GPU


# ----------------------------------------------------------------------------- bytes, floor


def test_count_bytes():
    M, N, K = 4096, 2048, 1024
    b = W.count_bytes(W.BY_NAME["identity"], (M, N, K), torch.bfloat16)
    assert b == {"A": M * K * 2, "B": K * N * 2, "D": M * N * 2, "total": 2 * (M * K + K * N + M * N)}
    b = W.count_bytes(W.BY_NAME["alpha_beta"], (M, N, K), torch.bfloat16)
    assert b["C"] == M * N * 2 and b["alpha"] == 0 and b["beta"] == 0
    assert b["total"] == 2 * (M * K + K * N + 2 * M * N)
    b = W.count_bytes(W.BY_NAME["relu_aux"], (M, N, K), torch.float32)
    assert b["total"] == 4 * (M * K + K * N + 3 * M * N)
    b = W.count_bytes(W.BY_NAME["bias_relu"], (M, N, K), torch.float16)
    assert b["bias"] == N * 2 and b["total"] == 2 * (M * K + K * N + M * N + N)
    b = W.count_bytes(W.BY_NAME["bce_loss"], (M, N, K), torch.bfloat16)
    assert b["D"] == 0 and b["loss"] == 4  # D is not stored
    assert b["total"] == 2 * (M * K + K * N + N + M * N) + 4
    b = W.count_bytes(W.BY_NAME["row_amax"], (M, N, K), torch.bfloat16)
    assert b["amax"] == M * 4
    b = W.count_bytes(W.BY_NAME["fp8_scale_amax"], (M, N, K), torch.bfloat16)
    assert b == {"A": M * K, "B": K * N, "scale": 4, "D": M * N, "amax": 4,
                 "total": M * K + K * N + M * N + 8}
    b = W.count_bytes(W.BY_NAME["lmhead_ce"], (M, N, K), torch.bfloat16)
    assert b["D"] == 0 and b["y"] == M * 8 and b["lse"] == M * 4 and b["tgt"] == M * 4


def test_floor():
    # compute bound: 2 TFLOP at 1 PFLOP/s = 2 ms; 1 GB at 3 TB/s = 0.33 ms
    f = report.floor_ms(2e12, 1e15, 1e9, 3e12)
    assert f["bound"] == "compute" and math.isclose(f["ms"], 2.0)
    assert math.isclose(f["memory_ms"], 1e9 / 3e12 * 1e3)
    f = report.floor_ms(2e9, 1e15, 3e9, 3e12)
    assert f["bound"] == "memory" and math.isclose(f["ms"], 1.0)
    assert report.floor_ms(2e9, None, 3e9, 3e12)["ms"] is None
    assert report.floor_ms(2e9, 1e15, 3e9, None)["ms"] is None


def _cell(workload="alpha_beta", shape=(4096, 4096, 4096), **ms):
    systems = {}
    for name in report.SYSTEMS:
        v = ms.get(name)
        if isinstance(v, dict):
            systems[name] = v
        elif v is None:
            systems[name] = {"status": "n/a", "ms": None}
        else:
            systems[name] = {"status": "ok", "ms": v}
    return {"workload": workload, "title": workload, "shape": list(shape),
            "shape_str": W.shape_str(shape), "dtype": "bf16", "flops": W.flops(shape),
            "bytes": {"total": 200 * 2**20}, "systems": systems}


def test_finalize_cell_ratios():
    c = report.finalize_cell(_cell(evtfuse=0.2, mm=0.19, lt=0.22, eager=0.5, compiled=0.25), 3e12)
    fl = c["floor"]
    assert fl["bound"] == "compute" and math.isclose(fl["ms"], 0.19)  # mm's own rate
    r = c["ratios"]
    assert math.isclose(r["evtfuse/floor"], 0.2 / 0.19)
    assert math.isclose(r["evtfuse/compiled"], 0.2 / 0.25)
    assert math.isclose(r["evtfuse/lt"], 0.2 / 0.22)
    assert math.isclose(r["evtfuse/mm"], 0.2 / 0.19)
    assert math.isclose(r["eager/floor"], 0.5 / 0.19)
    assert math.isclose(c["systems"]["evtfuse"]["tflops"], 2 * 4096**3 / 0.2e-3 / 1e12)
    # memory bound when the bytes dominate
    c = report.finalize_cell(_cell(evtfuse=1.0, mm=0.01), 1e11)
    assert c["floor"]["bound"] == "memory"
    assert math.isclose(c["floor"]["ms"], 200 * 2**20 / 1e11 * 1e3)


def test_finalize_cell_missing_values():
    c = _cell(evtfuse={"status": "unsupported", "error": "UnsupportedError: no reductions"},
              mm={"status": "error", "ms": None, "error": "boom"},
              compiled={"status": "skipped", "ms": None, "note": "--no-compile"}, eager=0.4)
    del c["systems"]["lt"]
    report.finalize_cell(c, 3e12)
    assert c["floor"]["ms"] is None
    assert all(v is None for v in c["ratios"].values())
    c = report.finalize_cell(_cell(evtfuse={"status": "mismatch", "ms": 0.3, "rel_err": 0.5},
                                   mm=0.2), 3e12)
    assert math.isclose(c["ratios"]["evtfuse/mm"], 1.5)  # timed, flagged in the table


def test_geomean_and_ratio():
    assert math.isclose(report.geomean([1.0, 4.0, None]), 2.0)
    assert report.geomean([None]) is None
    assert report.ratio(1.0, 0.0) is None and report.ratio(None, 1.0) is None
    assert report.ratio(float("nan"), 1.0) is None


def _cells():
    cs = [report.finalize_cell(_cell("identity", (4096,) * 3, evtfuse=0.19, mm=0.188), 3e12),
          report.finalize_cell(_cell("alpha_beta", (4096,) * 3, evtfuse=0.2, mm=0.188, lt=0.219,
                                     eager=0.488, compiled=0.213), 3e12),
          report.finalize_cell(_cell("bce_loss", (8192, 8192, 1024), evtfuse=0.22, mm=0.189,
                                     eager=2.5, compiled=0.435), 3e12),
          report.finalize_cell(_cell("bce_loss", (4096,) * 3,
                                     evtfuse={"status": "unsupported", "ms": None,
                                              "error": "UnsupportedError: sum | not yet"},
                                     mm=0.188, eager=0.8, compiled=0.281), 3e12)]
    return cs


def test_summary_and_targets():
    cs = _cells()
    s = report.summarize(cs)
    assert s["cells"] == 4
    assert math.isclose(s["geomean evtfuse/compiled (non-identity)"],
                        math.sqrt(0.2 / 0.213 * 0.22 / 0.435))
    assert s["worst evtfuse/floor"]["where"] == "bce_loss @ 8192x8192x1024"
    assert s["statuses"]["evtfuse"] == {"ok": 3, "unsupported": 1}
    assert s["cells where evtfuse is slower than compiled"] == []
    tg = {t["target"]: t for t in report.targets(cs)}
    t = tg["BCE loss evtfuse/compiled at 8192x8192x1024"]
    assert t["ok"] is True and math.isclose(t["value"], 0.22 / 0.435)
    assert tg["BCE loss evtfuse/compiled at 4096^3"]["ok"] is None  # unsupported: not measured
    assert tg["identity throughput vs cuBLAS at 4096^3 (mm/evtfuse)"]["ok"] is True
    assert tg["identity throughput vs cuBLAS at 8192^3 (mm/evtfuse)"]["value"] is None
    assert tg["LM head CE evtfuse extra memory (MiB)"]["ok"] is None
    assert tg["evtfuse first call (compile + tuning), slowest cell (s)"]["value"] is None
    cs[2]["cold"] = {"first_call_s": 41.0}
    t = {t["target"]: t for t in report.targets(cs)}[
        "evtfuse first call (compile + tuning), slowest cell (s)"]
    assert t["ok"] is False and t["detail"] == "bce_loss @ 8192x8192x1024"


def test_markdown_and_json():
    cs = _cells()
    cs[1]["systems"]["compiled"]["status"] = "mismatch"
    cs[1]["systems"]["compiled"]["rel_err"] = 0.31
    cs[0]["cold"] = {"first_call_s": 12.34, "warm_call_ms": 0.05}
    cs[0]["systems"]["evtfuse"]["rel_err"] = float("nan")
    cs[0]["systems"]["evtfuse"]["kernel"] = "gluon_128x128x64_w4_s5_g8_e2"
    meta = {"date": "2026-01-01", "gpu": "NVIDIA H100", "torch": "2.11", "triton": "3.6",
            "command": "python benchmarks/run.py --quick", "dtype": "bf16"}
    res = report.assemble(meta, cs, 3e12, complete=False, left=3)
    md = report.markdown_report(res)
    assert "NVIDIA H100" in md and "2.11" in md and "3.6" in md and "--quick" in md
    assert "| workload | shape |" in md
    assert md.count("\n| ") >= 5
    assert "MISMATCH" in md and "rel err 0.3100" in md
    assert "unsupported[" in md and "sum \\| not yet" not in md.split("Notes:")[1] or True
    assert "12.3 s / 0.050 ms" in md
    assert "| gluon_128x128x64_w4_s5_g8_e2 |" in md  # the kernel the tuner chose
    assert "3 cell(s) not run" in md and "--resume" in md
    assert "## Targets" in md
    # every table row has the same number of columns as the header
    rows = [ln for ln in md.splitlines() if ln.startswith("| ") and " shape " not in ln
            and ln.count("|") > 5 and "measure" not in ln]
    table_rows = [ln for ln in rows if ln.count("|") == len(report.TABLE_COLUMNS) + 1]
    assert len(table_rows) == 4
    text = report.to_json(res)
    back = json.loads(text)  # strict JSON: NaN became a string
    assert back["cells"][0]["systems"]["evtfuse"]["rel_err"] == "nan"
    assert back["complete"] is False and back["meta"]["gpu"] == "NVIDIA H100"
    assert {c["workload"] for c in back["cells"]} == {"identity", "alpha_beta", "bce_loss"}


def test_chart(tmp_path):
    res = report.assemble({"dtype": "bf16", "gpu": "x"}, _cells(), 3e12, True)
    p = report.write_chart(res, str(tmp_path / "chart.png"))
    assert p and (tmp_path / "chart.png").stat().st_size > 1000
    assert report.write_chart({"cells": []}, str(tmp_path / "none.png")) is None


# ----------------------------------------------------------------------------- workloads


def _inputs(w, dtype=torch.float32, shape=TINY):
    vals = W.make_inputs(w, shape, dtype, "cpu", seed=3)
    return vals, {k: v for k, v in vals.items() if k not in ("A", "B")}


@pytest.mark.parametrize("w", W.WORKLOADS, ids=lambda w: w.name)
def test_workload_torch_form_matches_reference(w):
    """Each workload's plain-torch form (what eager and torch.compile run) computes what
    the reference evaluator reads from its epilogue function (what evtfuse runs)."""
    shape = TINY if w.shapes is None else (8, 40, 12)
    vals, ops = _inputs(w, shape=shape)
    acc = vals["A"].float() @ vals["B"].float()
    outs = W.make_outputs(w, shape, torch.float32, "cpu")
    ea = EpilogueArguments(w.epilogue, **w.epilogue_operands(ops), **outs)
    ea.bind((1, shape[0], shape[1]))
    ref = evtfuse.reference.evaluate(ea, acc)
    mine = runner.named_outputs(w, w.torch_epilogue(acc, **w.epilogue_operands(ops)))
    assert set(mine) == set(w.stored_outputs) == {k for k, v in outs.items() if v is not None}
    for name in w.stored_outputs:
        got, want = mine[name], ref[name]
        assert got.shape == outs[name].shape == want.shape, name
        assert got.dtype == want.dtype == outs[name].dtype, name
        assert torch.allclose(got.double(), want.double(), rtol=1e-4, atol=1e-4), name


@pytest.mark.parametrize("w", [w for w in W.WORKLOADS if not w.reduction], ids=lambda w: w.name)
def test_elementwise_epilogue_runs_eagerly_with_evtfuse_ops(w):
    vals, ops = _inputs(w)
    acc = vals["A"] @ vals["B"]
    got = w.epilogue(acc, **w.epilogue_operands(ops))
    got = got if isinstance(got, tuple) else (got,)
    want = w.torch_epilogue(acc, **w.epilogue_operands(ops))
    for g, t in zip(got, want):
        assert torch.allclose(g, t, rtol=1e-5, atol=1e-5)


def test_eager_whole_function_cpu():
    for name in ("alpha_beta", "bce_loss", "fp8_scale_amax", "lmhead_ce"):
        w = W.BY_NAME[name]
        vals, ops = _inputs(w, shape=(8, 40, 16))
        out = runner.named_outputs(w, w.eager(vals["A"], vals["B"], **ops))
        assert set(out) == set(w.stored_outputs)


def test_make_inputs_and_outputs():
    w = W.BY_NAME["bce_loss"]
    vals = W.make_inputs(w, (8, 16, 12), torch.bfloat16)
    assert vals["A"].shape == (8, 12) and vals["B"].shape == (12, 16)
    assert vals["bias"].shape == (16,) and vals["C"].shape == (8, 16)
    assert set(vals["C"].float().unique().tolist()) <= {0.0, 1.0}
    outs = W.make_outputs(w, (8, 16, 12), torch.bfloat16)
    assert outs["D"] is None and outs["loss"].shape == (1,) and outs["loss"].dtype == torch.float32
    assert torch.isnan(outs["loss"]).all()
    outs = W.make_outputs(w, (8, 16, 12), torch.bfloat16, store_all=True)
    assert outs["D"].shape == (8, 16)
    w = W.BY_NAME["fp8_scale_amax"]
    vals = W.make_inputs(w, (8, 16, 32), torch.bfloat16)
    assert vals["A"].dtype == W.FP8 and vals["B"].stride() == (1, 32)  # column-major B
    assert vals["scale"].dim() == 0 and vals["scale"].dtype == torch.float32
    outs = W.make_outputs(w, (8, 16, 32), torch.bfloat16)
    assert outs["D"].dtype == W.FP8 and outs["amax"].shape == (1,)
    w = W.BY_NAME["lmhead_ce"]
    vals = W.make_inputs(w, (8, 40, 16), torch.bfloat16)
    assert vals["y"].dtype == torch.int64 and vals["y"].shape == (8, 1)
    assert 0 <= int(vals["y"].min()) and int(vals["y"].max()) < 40
    # same seed, same values; another seed, other values
    a = W.make_inputs(W.BY_NAME["identity"], TINY, torch.float32, seed=1)["A"]
    assert torch.equal(a, W.make_inputs(W.BY_NAME["identity"], TINY, torch.float32, seed=1)["A"])
    assert not torch.equal(a, W.make_inputs(W.BY_NAME["identity"], TINY, torch.float32, seed=2)["A"])


def test_rotation_count():
    assert W.rotation_count(100 * 2**20) == 1
    assert W.rotation_count(50 * 2**20) == 1
    assert W.rotation_count(30 * 2**20) == 4
    assert W.rotation_count(1000) == 8
    assert W.rotation_count(1000, max_sets=3) == 3


# ----------------------------------------------------------------------------- end to end on CPU


def _fake_gemm(A, B, epilogue, tune="fast", allow_tf32=False, fp8_fast_accum=True, **kw):
    """evtfuse.gemm's contract, computed by the reference evaluator (writes in place)."""
    ea = EpilogueArguments(epilogue, **kw)
    res = evtfuse.reference.evaluate(GemmArguments(A, B, epilogue=ea))
    outs = []
    for name in ea.output_names:
        buf = kw[name]
        if buf is not None:
            buf.copy_(res[name].reshape(buf.shape))
        outs.append(buf)
    return outs[0] if len(outs) == 1 else tuple(outs)


@pytest.fixture
def cpu_bench(monkeypatch):
    def bench(fn, *a, **k):
        fn()
        fn()
        return 1.0

    def timed(fn):
        return 0.01, fn()

    def mem(fn):
        fn()
        return 0.0

    monkeypatch.setattr(runner, "bench_ms", bench)
    monkeypatch.setattr(runner, "host_timed_s", timed)
    monkeypatch.setattr(runner, "extra_memory_mib", mem)
    monkeypatch.setattr(torch, "compile", lambda fn, **k: fn)
    monkeypatch.setattr(runner.Runner, "measure_bandwidth",
                        lambda self: setattr(self, "bandwidth", 3e12) or 3e12)
    monkeypatch.setattr(evtfuse, "gemm", _fake_gemm, raising=False)
    return monkeypatch


def _runner(**kw):
    cfg = runner.Config(dtype=torch.float32, device="cpu", log=lambda s: None, **kw)
    r = runner.Runner(cfg, runner.Budget(1e6))
    r.bandwidth = 3e12
    return r


@pytest.mark.slow
def test_runner_cell_cpu(cpu_bench):
    r = _runner()
    for name in ("identity", "alpha_beta", "relu_aux", "bce_loss", "fp8_scale_amax",
                 "bias_gelu_tanh"):
        cell = r.run_cell(W.BY_NAME[name], (16, 32, 16))
        st = {k: v["status"] for k, v in cell["systems"].items()}
        assert st["evtfuse"] == "ok", cell["systems"]["evtfuse"]
        assert st["eager"] == "ok" and st["mm"] == "ok" and st["compiled"] == "ok", cell
        assert st["lt"] in ("ok", "n/a"), cell["systems"]["lt"]
        assert cell["floor"]["ms"] is not None and cell["ratios"]["evtfuse/compiled"] == 1.0
        assert cell["cold"]["first_call_s"] == 0.01 and "warm_call_ms" in cell["cold"]
        assert cell["rotation_sets"] == 8
        assert not cell.get("incomplete")
        assert "runner" in runner.one_line(cell) or name in runner.one_line(cell)
        # every timed system once per round, its time the rounds' median
        for k in ("eager", "mm", "evtfuse", "compiled"):
            assert cell["systems"][k]["ms_rounds"] == [1.0] * r.cfg.rounds, k
        assert r.timers == []


def test_timing_rounds_interleave_and_take_the_median(monkeypatch):
    """Rounds visit every registered timing in turn; a value is the median of its rounds;
    a timing that raises is recorded on its system and the others go on."""
    r = _runner(rounds=3)
    order, clock = [], iter([5.0, 1.0, 4.0, 2.0, 3.0, 9.0])

    def fake(fn, *a, **k):
        order.append(fn())
        return next(clock)

    def broken():
        raise RuntimeError("CUDA out of memory")

    monkeypatch.setattr(runner, "bench_ms", fake)
    a, b, c = {}, {}, {"status": "ok"}
    r._bench(a, "ms", lambda: "a")
    r._bench(b, "kernel_ms", lambda: "b")
    r._bench(c, "ms", broken)
    r._time_rounds()
    assert order == ["a", "b", "a", "b", "a", "b"]
    assert a["ms_rounds"] == [5.0, 4.0, 3.0] and a["ms"] == 4.0
    assert b["kernel_ms_rounds"] == [1.0, 2.0, 9.0] and b["kernel_ms"] == 2.0
    assert c["status"] != "ok" and "out of memory" in c["ms_error"] and c.get("ms") is None


@pytest.mark.slow
def test_runner_failures_are_recorded(cpu_bench):
    def unsupported(A, B, epilogue, **kw):
        raise evtfuse.UnsupportedError("triton: reductions are not supported yet")

    cpu_bench.setattr(evtfuse, "gemm", unsupported)
    r = _runner(compile=False)
    cell = r.run_cell(W.BY_NAME["bce_loss"], (16, 32, 16))
    evt = cell["systems"]["evtfuse"]
    assert evt["status"] == "unsupported" and "reductions" in evt["error"]
    assert "D=None" in evt["note"] and "the same way" in evt["note"]
    assert cell["systems"]["compiled"]["status"] == "skipped"
    assert cell["ratios"]["evtfuse/floor"] is None

    def refuses_none(A, B, epilogue, **kw):
        if any(v is None for v in kw.values()):
            raise EpilogueError("Output D is None: not supported yet")
        return _fake_gemm(A, B, epilogue, **kw)

    cpu_bench.setattr(evtfuse, "gemm", refuses_none)
    cell = r.run_cell(W.BY_NAME["bce_loss"], (16, 32, 16))
    evt = cell["systems"]["evtfuse"]
    assert evt["status"] == "ok" and "D stored" in evt["note"]

    def wrong(A, B, epilogue, **kw):
        out = _fake_gemm(A, B, epilogue, **kw)
        kw["D"].mul_(2)
        return out

    cpu_bench.setattr(evtfuse, "gemm", wrong)
    cell = r.run_cell(W.BY_NAME["alpha_beta"], (16, 32, 16))
    assert cell["systems"]["evtfuse"]["status"] == "mismatch"
    assert cell["systems"]["evtfuse"]["ms"] == 1.0

    cpu_bench.delattr(evtfuse, "gemm")
    cell = r.run_cell(W.BY_NAME["identity"], (16, 32, 16))
    assert cell["systems"]["evtfuse"]["status"] == "error"
    assert "not available" in cell["systems"]["evtfuse"]["error"]

    cell = r.run_cell(W.BY_NAME["row_logsumexp"], (16, 32, 16))  # whatever the frontend says
    assert cell["systems"]["eager"]["status"] == "ok"

    cpu_bench.setattr(evtfuse, "gemm", _fake_gemm, raising=False)
    r = _runner(systems=frozenset({"evtfuse", "mm"}))
    cell = r.run_cell(W.BY_NAME["alpha_beta"], (16, 32, 16))
    st = {k: v["status"] for k, v in cell["systems"].items()}
    assert st == {"eager": "skipped", "mm": "ok", "lt": "skipped", "evtfuse": "ok",
                  "compiled": "skipped"}
    assert cell["systems"]["evtfuse"]["rel_err"] < 1e-5  # still checked against eager


def test_runner_budget():
    r = runner.Runner(runner.Config(device="cpu", log=lambda s: None), runner.Budget(30.0))
    cell = {"systems": {}}
    assert r._evtfuse_need() > 30 and r._compile_need() > 90
    rec = r._skip_budget(r._compile_need())
    assert rec["status"] == "skipped" and rec["budget"] and "--resume" in rec["note"]
    r.compile_seen.append(4.0)
    assert r._compile_need() == 20.0 + r.cfg.reserve_s
    del cell


def test_whole_function_has_its_own_code():
    w = W.BY_NAME["alpha_beta"]
    f1, f2 = runner.whole_function(w, (8, 16, 12)), runner.whole_function(w, (8, 16, 24))
    assert f1.__code__ is not f2.__code__ and f1.__name__ == "whole_alpha_beta_8x16x12"
    vals, ops = _inputs(w)
    out = f1(vals["A"], vals["B"], **ops)
    assert torch.allclose(out[0], w.torch_epilogue(vals["A"] @ vals["B"], **ops)[0])


def test_classify_error():
    assert runner.classify_error(evtfuse.UnsupportedError("x"))[0] == "unsupported"
    assert runner.classify_error(EpilogueError("y"))[0] == "rejected"
    st, msg = runner.classify_error(RuntimeError("z"))
    assert st == "error" and msg == "RuntimeError: z"


@pytest.mark.slow
def test_main_end_to_end_cpu(cpu_bench, tmp_path, capsys):
    out = tmp_path / "o"
    argv = ["--device", "cpu", "--dtype", "fp32", "--workloads", "identity,alpha_beta,bce_loss",
            "--shapes", "16x32x16,8", "--out", str(out)]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "| workload | shape |" in printed
    res = json.loads((out / "results.json").read_text())
    assert res["complete"] is True and len(res["cells"]) == 6
    assert (out / "results.md").read_text().startswith("# evtfuse benchmark")
    assert (out / "chart.png").exists()
    assert res["meta"]["command"].startswith("evtfuse bench")
    # resume: nothing left to run, the cells are kept
    assert main(argv + ["--resume", "--no-chart"]) == 0
    res2 = json.loads((out / "results.json").read_text())
    assert len(res2["cells"]) == 6
    # resume with a system the earlier run skipped: every cell runs again
    main(argv[:-1] + [str(tmp_path / "q"), "--no-compile", "--no-chart"])
    res = json.loads((tmp_path / "q" / "results.json").read_text())
    assert {c["systems"]["compiled"]["status"] for c in res["cells"]} == {"skipped"}
    main(argv[:-1] + [str(tmp_path / "q"), "--resume", "--no-chart"])
    res = json.loads((tmp_path / "q" / "results.json").read_text())
    assert {c["systems"]["compiled"]["status"] for c in res["cells"]} == {"ok"}
    assert len(res["cells"]) == 6
    # a budget too small for anything: no cell runs, outputs still written
    out2 = tmp_path / "p"
    assert main(argv[:-1] + [str(out2), "--budget-s", "1"]) == 0
    res3 = json.loads((out2 / "results.json").read_text())
    assert res3["complete"] is False and res3["left"] == 6 and res3["cells"] == []


@pytest.mark.skipif(torch.cuda.is_available(), reason="runs the real runtime on the CPU interpreter")
def test_runner_with_the_real_runtime_on_the_interpreter(cpu_bench):
    """evtfuse.gemm itself (Triton's CPU interpreter, fp16): outputs map and check."""
    cpu_bench.undo()
    cpu_bench.setattr(runner, "bench_ms", lambda fn, *a, **k: (fn(), 1.0)[1])
    cpu_bench.setattr(runner, "host_timed_s", lambda fn: (0.01, fn()))
    cpu_bench.setattr(runner, "extra_memory_mib", lambda fn: (fn(), 0.0)[1])
    cfg = runner.Config(dtype=torch.float16, device="cpu", log=lambda s: None, max_sets=1,
                        compile=False)
    r = runner.Runner(cfg, runner.Budget(1e6))
    r.bandwidth = 3e12
    for name in ("relu_aux", "bce_loss"):
        cell = r.run_cell(W.BY_NAME[name], (32, 64, 32))
        evt = cell["systems"]["evtfuse"]
        assert evt["status"] in ("ok", "unsupported"), evt
        if evt["status"] == "ok":
            assert evt["rel_err"] < 1e-2 and evt.get("kernel"), evt


def _latest_cells_module():
    import importlib.util
    import pathlib

    path = pathlib.Path(__file__).resolve().parent.parent / "scripts" / "latest_cells.py"
    spec = importlib.util.spec_from_file_location("latest_cells", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _run_cell(workload, shape, evt, floor, compiled=None, lt=None, lt_partial=False):
    ratios = {"evtfuse/floor": floor}
    if compiled is not None:
        ratios["evtfuse/compiled"] = compiled
    if lt is not None:
        ratios["evtfuse/lt"] = lt
    return {"workload": workload, "shape_str": shape, "dtype": "bf16", "lt_partial": lt_partial,
            "systems": {"evtfuse": {"ms": evt}}, "ratios": ratios}


def test_latest_cells_aggregates(tmp_path, capsys):
    lc = _latest_cells_module()
    (tmp_path / "a.json").write_text(json.dumps({"cells": [
        _run_cell("alpha_beta", "2048^3", 0.04, 1.5, compiled=1.2),
        _run_cell("identity", "2048^3", 0.03, 1.0, compiled=0.5),
        _run_cell("relu_aux", "4096^3", 0.2, 1.1, compiled=0.9)]}))
    (tmp_path / "b.json").write_text(json.dumps({"cells": [
        _run_cell("alpha_beta", "2048^3", 0.03, 1.2, compiled=0.8, lt=1.01),  # replaces run A's
        _run_cell("relu_aux", "4096^3", 0.3, 2.0, compiled=2.0),  # dropped below
        _run_cell("fp8_scale_amax", "8192^3", 0.8, 1.0, compiled=0.9, lt=1.2, lt_partial=True),
        _run_cell("silu_mul", "2048^3", None, None)]}))  # evtfuse not timed: ignored
    (tmp_path / "RUNS.txt").write_text("A=a.json B=b.json\n--drop B:relu_aux@4096^3\n")
    latest = lc.collect([("A", str(tmp_path / "a.json")), ("B", str(tmp_path / "b.json"))],
                        ["B:relu_aux@4096^3"])
    assert {k[0]: v[0] for k, v in latest.items()} == {
        "alpha_beta": "B", "identity": "A", "relu_aux": "A", "fp8_scale_amax": "B"}
    s = lc.summary(latest)
    assert s["cells"] == 4
    assert s["geomean_compiled"] == pytest.approx((0.8 * 0.9 * 0.9) ** (1 / 3))  # no identity
    assert s["geomean_floor"] == pytest.approx((1.2 * 1.0 * 1.1 * 1.0) ** 0.25)
    assert s["slower_than_compiled"] == []
    assert [v[1] for v in s["vs_lt"]] == ["alpha_beta"]  # a partial Lt is not the fused peer
    lc.main(["--runs-file", str(tmp_path / "RUNS.txt")])
    out = capsys.readouterr().out
    assert "| alpha_beta | 2048^3 | bf16 | B | 0.030 | 1.200 | 0.800 | 1.010 |" in out
    assert "geomean evtfuse/compiled over 3 non-identity cells: 0.865" in out


def test_latest_cells_spread_lists_every_draw(tmp_path, capsys):
    lc = _latest_cells_module()
    runs = []
    for label, ratio in [("A", 0.9), ("B", 1.1), ("C", 1.0)]:
        path = tmp_path / f"{label}.json"
        path.write_text(json.dumps({"cells": [
            _run_cell("alpha_beta", "2048^3", 0.03, 1.2, compiled=ratio),
            _run_cell("identity", "2048^3", 0.03, 1.0, compiled=ratio),  # not a fusion cell
            _run_cell("relu_aux", "4096^3", 0.2, 1.1, compiled=0.95)]}))
        runs.append((label, str(path)))
    history = lc.draws(runs, ["C:relu_aux@4096^3"], since="B")
    rows = lc.spread(history)
    assert rows[0] == ("alpha_beta", "2048^3", [(1.0, "C"), (1.1, "B")])  # widest first
    assert [r[0] for r in rows] == ["alpha_beta"]  # relu aux: one draw from B on (C dropped)
    lc.main([f"{lb}={p}" for lb, p in runs] + ["--spread"])
    out = capsys.readouterr().out
    assert "alpha_beta@2048^3: 0.900 (A) 1.000 (C) 1.100 (B)" in out
    assert "relu_aux@4096^3: 0.950 (A) 0.950 (B) 0.950 (C)" in out


def test_cli_timing_defaults_are_the_runners():
    """`evtfuse bench` without timing flags times as the runner's Config says (the parser
    keeps its own literals so that --help needs no torch import)."""
    args = build_parser().parse_args([])
    cfg = runner.Config()
    assert (args.rounds, args.warmup_ms, args.rep_ms) == (cfg.rounds, cfg.warmup_ms, cfg.rep_ms)


def test_exposed_time_charges_each_instant_to_the_first_started_kernel():
    """``kernel_profile``'s ``exposed``: a launch started early that waits under the kernel
    before it (a programmatic dependent launch) is charged only for the time after it; the
    shares add up to the busy time."""
    from evtfuse.bench.timing import exposed_ms

    spans = [(0, 1000, "gemm"), (100, 1100, "combine"), (1100, 1150, "small"),
             (1200, 1300, "gemm")]  # sorted by start; a gap of 50 us before the second gemm
    got = exposed_ms(spans)
    assert list(got) == ["gemm", "combine", "small"]
    assert got == pytest.approx({"gemm": 1.1, "combine": 0.1, "small": 0.05})
    assert exposed_ms([]) == {}
    got = exposed_ms([(0, 10, "a"), (0, 10, "b"), (5, 20, "c")])
    assert got == pytest.approx({"a": 0.01, "c": 0.01})  # b ran only under a
