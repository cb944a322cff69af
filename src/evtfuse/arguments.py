"""Public argument objects: ``EpilogueArguments`` and ``GemmArguments``.

Layer: frontend (the user's view of an operation). Construction parses and validates
everything it can and raises ``EpilogueError`` before any kernel exists; nothing here
touches an output tensor. The DAG for a problem shape is built once and kept while the
tensors stay as they were: a tensor changed in place since (``A.t_()``, ``D.set_(...)``,
moved to other memory) is validated again (``GemmArguments.checked_state``).
"""

from __future__ import annotations

from typing import Any, Mapping

import torch

from . import ir
from .errors import EpilogueError
from .memory import has_internal_overlap, overlap, state_of
from .optable import FP8_DTYPES, OPS, Category
from .dag_epilogue import DagEpilogue, assigned_reductions, read_epilogue
from .frontend import EpilogueSource, ParsedEpilogue, check_names, problem_shape_of


class EpilogueArguments:
    """An epilogue function (or source string) and a value for each operand and output.

    ``EpilogueArguments(fn, C=C, alpha=1.0, D=D)``: the first parameter is positional-only
    so that operands may have any name. Outputs passed as ``None`` are computed for their
    consumers but never stored. Inside evtfuse the epilogue may also be one already parsed
    (``frontend.ParsedEpilogue``) or a DAG a pass built (``dag_epilogue.DagEpilogue``),
    taken as it is.
    """

    def __init__(self, epilogue: EpilogueSource | DagEpilogue, /, **operands_and_outputs: Any):
        self.epilogue = epilogue
        self.parsed: ParsedEpilogue | DagEpilogue = read_epilogue(epilogue)
        check_names(self.parsed, operands_and_outputs)
        self.values: dict[str, Any] = dict(operands_and_outputs)
        # per (problem shape, rank): (the values' state when bound, the DAG)
        self._dags: dict[tuple, tuple[list, ir.Dag]] = {}
        self._problem: tuple[int, int, int] | None = None
        self._rank: int | None = None  # of A @ B, where the problem's binding knew it
        # a full-shaped D tells (L, M, N); a D that is a reduction (e.g. (M, 1)) does not:
        # then binding waits for GemmArguments, which knows the problem
        guess = None if _is_reduction(self.parsed, "D") else problem_shape_of(self.values.get("D"))
        if guess is not None:
            try:
                self.bind(guess)
            except EpilogueError as exc:
                raise _from_d_shape(exc, self.values["D"]) from None


    @classmethod
    def unbound(cls, epilogue: EpilogueSource | DagEpilogue, /, **operands_and_outputs: Any
                ) -> "EpilogueArguments":
        """The arguments, parsed and name-checked, bound only by the ``GemmArguments`` they
        go into (not guessed from D's shape): a grouped GEMM's (``GemmArguments(...,
        offs=offs)``), whose per-group operands (G, 1, N) do not broadcast to D's (T, N)."""
        new = object.__new__(cls)
        new.epilogue = epilogue
        new.parsed = read_epilogue(epilogue)
        check_names(new.parsed, operands_and_outputs)
        new.values = dict(operands_and_outputs)
        new._dags, new._problem, new._rank = {}, None, None
        return new

    # -- binding
    def bind(self, problem: tuple[int, int, int], grouped: bool = False,
             rank: int | None = None) -> ir.Dag:
        """The DAG for output shape (L, M, N); validates shapes. Built once per shape, and
        again when a value changed since (another tensor, or one changed in place).
        ``grouped``: (G, T, N) of a grouped GEMM; ``rank``: 2 or 3, that of A @ B as torch
        has it, where known (what torch's dims in the epilogue count: ``frontend.bind``)."""
        problem = tuple(int(p) for p in problem) + ((1,) if grouped else ())  # type: ignore[assignment]
        state = state_of(self.values.values())
        hit = self._dags.get((problem, rank))
        if hit is not None and hit[0] == state:
            dag = hit[1]
        else:
            dag = self.parsed.bind(self.values, problem[:3], grouped, rank=rank)
            self._dags[(problem, rank)] = (state, dag)
        self._problem, self._rank = problem, rank
        return dag

    @property
    def dag(self) -> ir.Dag:
        if self._problem is None:
            raise EpilogueError("the problem shape is not known yet: pass a full-shaped D, or "
                                "put these EpilogueArguments into GemmArguments")
        return self._dags[(self._problem, self._rank)][1]

    @property
    def operand_names(self) -> tuple[str, ...]:
        return self.parsed.params

    @property
    def output_names(self) -> tuple[str, ...]:
        return self.parsed.outputs

    def operands(self) -> dict[str, Any]:
        return {k: self.values[k] for k in self.parsed.params}

    def outputs(self) -> dict[str, Any]:
        return {k: self.values[k] for k in self.parsed.outputs}

    def with_values(self, **changes: Any) -> "EpilogueArguments":
        """A copy with some operands or outputs replaced (parsing is not repeated)."""
        new = object.__new__(EpilogueArguments)
        new.epilogue, new.parsed = self.epilogue, self.parsed
        new.values = {**self.values, **changes}
        check_names(new.parsed, new.values)
        new._dags, new._problem, new._rank = {}, None, None
        if self._problem is not None:  # bound as it was (a grouped problem keeps its marker)
            new.bind(self._problem[:3], grouped=len(self._problem) > 3, rank=self._rank)
        return new

    def __repr__(self) -> str:
        return f"EpilogueArguments({self.parsed.name}, {', '.join(self.values)})"


def _from_d_shape(exc: EpilogueError, D: torch.Tensor) -> EpilogueError:
    """``exc``, raised binding the problem shape guessed from D's, with a note saying so when
    it names another variable: a D of the wrong shape must not read as a fault of C."""
    if exc.variable in (None, "D") or "(L, M, N)" not in str(exc):
        return exc
    head, sep, tail = str(exc).partition("\n")
    note = (f" (the output's (L, M, N) is taken from D's shape {tuple(D.shape)} here, before "
            "A and B are known: if D is what has the wrong shape, fix D)")
    exc.args = (head + note + sep + tail,)
    return exc


def _is_reduction(parsed: ParsedEpilogue | DagEpilogue, name: str) -> bool:
    if isinstance(parsed, DagEpilogue):
        return name in assigned_reductions(parsed.dag)
    return any(a.target == name and a.expr.kind == "call"
               and OPS[a.expr.op].category is Category.REDUCE for a in parsed.assignments)


def _identity_epilogue(out: torch.Tensor) -> EpilogueArguments:
    return EpilogueArguments("def identity(accum):\n    D = accum\n    return D", D=out)


class GemmArguments:
    """``D = epilogue(A @ B, ...)``: A is (M, K) or (L, M, K), B is (K, N) or (L, K, N),
    each row- or column-major; ``out`` is D. ``allow_tf32`` lets fp32 inputs use TF32.
    ``fp8_fast_accum`` (the default): fp8 inputs accumulate in the tensor cores' reduced
    precision over the whole of K, as Triton does on Hopper and cuBLAS with
    ``use_fast_accum=True``; False promotes each k-step's partial sum (BLOCK_K of K) to
    the fp32 accumulator, as cuBLAS's default: an error that does not grow with K, at a
    cost in time (docs/dtypes-and-layouts.md).

    ``offs``: a grouped GEMM (``evtfuse.grouped_gemm``, docs/grouped.md), ``offs`` (G,)
    int32 cumulative group ends on A's device, contiguous (the kernels read it packed). Groups over M (``group_dim`` "M"): A is
    (T, K), B (G, K, N); the problem is then (L, M, N) = (G, T, N) with each row in one
    group (``frontend.bind``'s ``grouped``). Groups over K ("K", a mixture of experts'
    weight gradient): A is (M, T), B (T, N), each group a range of T; the problem is then
    a batched one, (L, M, N) = (G, M, N), whose batch g sums over its group's range.
    """

    def __init__(self, A: torch.Tensor, B: torch.Tensor, out: torch.Tensor | None = None,
                 accumulator_type: torch.dtype = torch.float32,
                 epilogue: EpilogueArguments | None = None, *, allow_tf32: bool = False,
                 fp8_fast_accum: bool = True, offs: torch.Tensor | None = None):
        self.group_dim = None if offs is None else check_grouped(A, B, offs)
        self.offs = offs
        self.L, self.M, self.K, self.N = _problem_of(A, B, offs)
        if not isinstance(accumulator_type, torch.dtype):
            raise EpilogueError(f"accumulator_type must be a torch.dtype, not "
                                f"{accumulator_type!r}", variable="accumulator_type")
        self.A, self.B = A, B
        self.accumulator_type = accumulator_type
        self.allow_tf32 = bool(allow_tf32)
        self.fp8_fast_accum = bool(fp8_fast_accum)
        if epilogue is None:
            if out is None:
                raise EpilogueError("GemmArguments needs out (D) when no epilogue is given",
                                    variable="out")
            epilogue = _identity_epilogue(out)
        if not isinstance(epilogue, EpilogueArguments):
            raise EpilogueError("epilogue must be an EpilogueArguments", variable="epilogue")
        self.gated = epilogue.parsed.gated
        if self.gated:  # the epilogue's N: pairs of B's columns
            self.N = gated_width(B)
        d = epilogue.values.get("D")
        if out is not None and d is not None and out is not d:
            raise EpilogueError("out and the epilogue's D are different tensors; pass the same "
                                "tensor to both", variable="D")
        self.out = out if out is not None else d
        self.epilogue = epilogue
        self.dag = epilogue.bind(self.problem, self.group_dim == "M", _rank(A, B, self.group_dim))
        self._optimized: ir.Dag | None = None
        _check_memory(self.A, self.B, epilogue, self.dag, offs)
        self._state = self._current_state()

    @property
    def problem(self) -> tuple[int, int, int]:
        return (self.L, self.M, self.N)

    @property
    def compute_dtype(self) -> torch.dtype:
        """What the epilogue computes in: float64 for float64 accumulation, else float32."""
        return torch.float64 if self.accumulator_type == torch.float64 else torch.float32

    @property
    def optimized_dag(self) -> ir.Dag:
        """The epilogue DAG after the pass pipeline (computed once): what backends emit."""
        if self._optimized is None:
            from .passes import optimize
            self._optimized = optimize(self.dag, dtype=self.compute_dtype)
        return self._optimized

    def _current_state(self) -> list:
        return state_of([self.A, self.B, self.offs, *self.epilogue.values.values()])

    def checked_state(self) -> list:
        """The state of every tensor (``memory.tensor_state``) these arguments were last
        validated at. When a tensor changed since (``A.t_()``, ``D.set_(...)``, a value
        replaced), everything is validated again first, as the constructor does (an
        ``EpilogueError`` leaves them unvalidated, so the next call raises it again).
        Launch-plan caches key on the object this returns."""
        now = self._current_state()
        if now == self._state:
            return self._state
        if self.offs is not None:
            self.group_dim = check_grouped(self.A, self.B, self.offs)
        L, M, K, N = _problem_of(self.A, self.B, self.offs)
        if self.gated:
            N = gated_width(self.B)
        dag = self.epilogue.bind((L, M, N), self.group_dim == "M",
                                 _rank(self.A, self.B, self.group_dim))
        _check_memory(self.A, self.B, self.epilogue, dag, self.offs)
        if dag is not self.dag:
            self._optimized = None
        self.L, self.M, self.K, self.N, self.dag = L, M, K, N, dag
        self._state = now
        return now

    def operands(self) -> Mapping[str, Any]:
        return self.epilogue.operands()

    @property
    def launch_values(self) -> Mapping[str, Any]:
        """What a launch plan reads per call besides A and B: the epilogue's values, and a
        grouped GEMM's ``offs`` under ``OFFS_KEY`` (no identifier can be that name)."""
        if self.offs is None:
            return self.epilogue.values
        return {**self.epilogue.values, OFFS_KEY: self.offs}


def gated_width(B: torch.Tensor) -> int:
    """The output width N of a gated epilogue (``pairs(accum)``): half of B's columns,
    which must be even (dense B (K, 2N) or (L, K, 2N), grouped B (G, K, 2N))."""
    NB = int(B.shape[-1])
    if NB % 2:
        raise EpilogueError(f"the epilogue takes the accumulator's columns in pairs "
                            f"(pairs(accum)), but B has an odd number of columns ({NB}); "
                            f"B must be (K, 2N): gate and up interleaved "
                            f"(evtfuse.interleave_gate_up), or concatenated with "
                            f"pairs(accum, layout=\"concatenated\")", variable="B")
    return NB // 2


# the dtypes A and B may have (the kernel families' ``_common`` says which target runs which:
# fp8 needs a GPU of compute capability 8.9 or later)
INPUT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64, *FP8_DTYPES,
                torch.int8, torch.uint8)
INPUT_DTYPES_TEXT = ("float16, bfloat16, float32, float64, float8_e4m3fn and float8_e5m2 (on "
                     "GPUs of compute capability 8.9 and later), int8 and uint8")
OFFS_KEY = "<offs>"  # a grouped GEMM's offsets among a launch's values (not an identifier)
MAX_GROUPS = 1024


def check_tensors(A: Any, B: Any, call: str = "") -> None:
    """A and B are torch tensors, else an ``EpilogueError`` naming the first that is not
    (a numpy array with the conversion; ``call``: the function to name first)."""
    for name, t in (("A", A), ("B", B)):
        if not isinstance(t, torch.Tensor):
            hint = (f" (torch.from_numpy({name}) makes one of a numpy array)"
                    if type(t).__module__.split(".")[0] == "numpy" else "")
            raise EpilogueError(f"{call + ': ' if call else ''}{name} must be a torch.Tensor, "
                                f"not {type(t).__name__}{hint}", variable=name)


def check_grouped(A: torch.Tensor, B: torch.Tensor, offs: Any) -> str:
    """A grouped GEMM's A, B and offs make one problem: groups over M, A (T, K), B
    (G, K, N); or groups over K, A (M, T), B (T, N); offs (G,) int32 on A's device. Returns
    the grouped dimension, "M" or "K"; ``EpilogueError`` naming the argument otherwise. The
    values of offs are not read (they stay on the device: no host synchronisation)."""
    if not isinstance(offs, torch.Tensor):
        raise EpilogueError(f"offs must be a torch.Tensor of int32 cumulative group ends, "
                            f"not {type(offs).__name__}", variable="offs")
    check_tensors(A, B)
    dim = "K" if B.dim() == 2 else "M"
    layouts = {"M": (("A", A, "(T, K)"), ("B", B, "(G, K, N)")),
               "K": (("A", A, "(M, T)"), ("B", B, "(T, N)"))}
    for name, t, dims in layouts[dim]:
        if t.dim() != len(dims.split(",")):
            raise EpilogueError(f"grouped_gemm: {name} must be {dims} (groups over M: A (T, K), "
                                f"B (G, K, N); over K: A (M, T), B (T, N)), got shape "
                                f"{tuple(t.shape)}", variable=name)
    if offs.dim() != 1:
        raise EpilogueError(f"offs must be 1-D (G,), got shape {tuple(offs.shape)}",
                            variable="offs")
    if offs.dtype != torch.int32:
        raise EpilogueError(f"offs must be torch.int32 (as torch._grouped_mm's), not "
                            f"{offs.dtype}", variable="offs")
    if offs.device != A.device:
        raise EpilogueError(f"offs is on {offs.device} but A is on {A.device}; keep the "
                            "offsets on A's device (they are never copied to the host)",
                            variable="offs")
    if not offs.is_contiguous():
        # the kernels read offs[g] at offs + g: another stride would read other groups' ends
        raise EpilogueError(f"offs is not contiguous (stride {offs.stride(0)}); the kernels "
                            "read it as a packed array of int32: pass offs.contiguous() "
                            "(evtfuse.grouped_gemm makes that copy itself)", variable="offs")
    if dim == "M" and offs.shape[0] != B.shape[0]:
        raise EpilogueError(f"offs has {offs.shape[0]} groups but B {tuple(B.shape)} has "
                            f"{B.shape[0]}; give one end row per group of B", variable="offs")
    if not 1 <= offs.shape[0] <= MAX_GROUPS:
        raise EpilogueError(f"offs has {offs.shape[0]} groups; grouped_gemm takes 1 to "
                            f"{MAX_GROUPS}", variable="offs")
    return dim


def _rank(A: torch.Tensor, B: torch.Tensor, group_dim: str | None) -> int:
    """The rank of A @ B as torch has it (``gemm`` allocates outputs so): 3 where A or B is
    batched, or groups over K make batches; 2 for groups over M (rows (T, N))."""
    if group_dim is not None:
        return 3 if group_dim == "K" else 2
    return 3 if A.dim() == 3 or B.dim() == 3 else 2


def _problem_of(A: torch.Tensor, B: torch.Tensor, offs: torch.Tensor | None = None
                ) -> tuple[int, int, int, int]:
    """(L, M, K, N) of A @ B; ``EpilogueError`` naming A or B when they do not make one.
    A grouped GEMM over K (2-D A and B with ``offs``): L is the group count."""
    check_tensors(A, B)
    for name, t in (("A", A), ("B", B)):
        if t.dim() not in (2, 3):
            raise EpilogueError(f"{name} must have 2 or 3 dimensions ((M, K) / (L, M, K) for "
                                f"A, (K, N) / (L, K, N) for B), got shape {tuple(t.shape)}",
                                variable=name)
    if A.shape[-1] != B.shape[-2]:
        raise EpilogueError(f"A is {tuple(A.shape)} and B is {tuple(B.shape)}: A's K "
                            f"({A.shape[-1]}) differs from B's K ({B.shape[-2]})", variable="B")
    la = A.shape[0] if A.dim() == 3 else 1
    lb = B.shape[0] if B.dim() == 3 else 1
    if la != lb and 1 not in (la, lb):
        raise EpilogueError(f"A has batch {la} and B has batch {lb}; they must match or "
                            "one must be 1", variable="B")
    if A.dtype != B.dtype:
        raise EpilogueError(f"A is {A.dtype} and B is {B.dtype}; they must have one dtype",
                            variable="B")
    if A.dtype not in INPUT_DTYPES:
        raise EpilogueError(f"A and B are {A.dtype}; evtfuse multiplies {INPUT_DTYPES_TEXT} "
                            f"inputs: convert A and B (A.float(), A.to(torch.bfloat16), ...)",
                            variable="A")
    if A.device != B.device:
        raise EpilogueError(f"A is on {A.device} and B on {B.device}", variable="B")
    if offs is not None and A.dim() == 2 and B.dim() == 2:
        return offs.shape[0], A.shape[-2], A.shape[-1], B.shape[-1]
    return max(la, lb), A.shape[-2], A.shape[-1], B.shape[-1]


def _check_memory(A: torch.Tensor, B: torch.Tensor, epilogue: EpilogueArguments,
                  dag: ir.Dag, offs: torch.Tensor | None = None) -> None:
    """Every tensor on A's device; no output whose elements share memory with each other
    (torch refuses such in-place writes too), with another output, or with an input (a
    grouped GEMM's offs included: the kernel reads it while outputs are written), except a
    full-shaped output that is exactly a full-shaped operand (in place)."""
    dev = A.device
    values = epilogue.values
    for name, v in values.items():
        if isinstance(v, torch.Tensor) and v.device != dev:
            raise EpilogueError(f"{name} is on {v.device} but A and B are on {dev}",
                                variable=name)
    outs = [(n, values[n]) for n in epilogue.output_names if isinstance(values[n], torch.Tensor)]
    ins = [(n, values[n]) for n in epilogue.operand_names
           if isinstance(values[n], torch.Tensor)] + [("A", A), ("B", B)]
    if offs is not None:
        ins.append(("offs", offs))
    kinds = {o.name: o.kind for o in dag.outputs}
    for on, o in outs:
        if has_internal_overlap(o.shape, o.stride()):
            raise EpilogueError(
                f"output {on}: more than one element of the written-to tensor refers to a "
                f"single memory location (shape {tuple(o.shape)}, strides {o.stride()}); "
                "give each element of an output its own memory (torch.empty, .contiguous())",
                variable=on)
    for i, (on, o) in enumerate(outs):
        for pn, p in outs[i + 1:]:
            if overlap(o, p):
                raise EpilogueError(f"outputs {on} and {pn} share memory; each output needs "
                                    "its own buffer", variable=pn)
        for inn, t in ins:
            if not overlap(o, t):
                continue
            same = (o.data_ptr() == t.data_ptr() and o.shape == t.shape
                    and o.stride() == t.stride() and inn not in ("A", "B", "offs"))
            if not (same and kinds.get(on) is ir.OutputKind.FULL):
                raise EpilogueError(f"output {on} overlaps input {inn}; only a full-shaped "
                                    f"output may alias a full-shaped input exactly (in place)",
                                    variable=on)
