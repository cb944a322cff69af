"""The one namer of generated code: every identifier that stands for a user's operand or
output, or for a value of the DAG, is built here.

Layer: backends/triton. Invariant: a user's names never appear in generated code (only in
the header docstring's table, ``Names.table``), so no user name can meet a generated one.
Operand or output number ``i`` (used operands in the DAG's order, then every output in
return order: ``Names.users``) is spelled ``u<i>``; an identifier derived from it is
``u<i>_<role>`` or ``u<i>_<role>_<piece>``, its role one of ``ROLES`` (lowercase letters
and digits, no underscore) and its piece a number, so the map from (number, role, piece)
to identifiers is one to one. A DAG node's value is ``v<k>`` or ``v<k>_<piece>`` (node
``k`` of ``Dag.nodes``; a piece of the tile's epilogue), a program-level scalar ``s<k>``.
Every other identifier of generated code is fixed text of the emitters (``M``, ``acc``,
``rm``, ``tl``, ``_ef_`` helpers, ...), and none of those has these forms
(``GENERATED``). tests/test_names_cpu.py checks that renaming every operand and output
changes no line of any family's kernels below the header, and the fuzzer draws names
like the kernels' own (``tests/epilogue_fuzz.py``: ``user_names``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ...ir import Dag

# role -> what the identifier holds (kernel parameters first, then locals)
ROLES: dict[str, str] = {
    # kernel parameters
    "ptr": "pointer of an operand or output read or written through pointers",
    "sl": "batch stride (elements)",
    "sm": "row stride",
    "sn": "column stride",
    "desc": "TMA tensor descriptor",
    "ws": "reduction workspace (partials, or a fold's float bits)",
    "ws2": "logsumexp's second workspace (sums of exp)",
    "cnt": "ticket counters of an in-kernel combine",
    "out": "pointer of a reduction output the kernel writes itself",
    "osl": "that output's batch stride",
    "os": "that output's row or column stride",
    # locals of the epilogue emitter
    "rv": "a sub-tile's values entering a reduction",
    "racc": "a tile's running partial of a reduction",
    "raccs": "logsumexp's running sum of exp in a tile",
    "pacc": "a program's running partial of a whole-output reduction",
    "paccs": "logsumexp's running sum of exp in a program",
    "pm": "logsumexp's partial max",
    "ps": "logsumexp's partial sum of exp",
    "tk": "a ticket",
    "cm": "a combine's running result",
    "cms": "a grouped combine's running sum of exp (logsumexp)",
    "p": "a partial loaded by a combine (piece: the load of a step)",
    "ln": "a combine's lane indices",
    "fo": "fold finish: workspace offsets",
    "fm": "fold finish: mask",
    "fb": "fold finish: the workspace's bits",
    # hopper kernel
    "pf": "a full aux tile prefetched before the mainloop (piece: its sub-tile)",
    "l2": "row pointers of a full aux tile asked into L2 during the mainloop",
    "ve": "a per-row/per-column operand loaded at the top of the epilogue (piece: its sub-tile)",
    # gluon kernel
    "lb": "shared buffers of a full aux tile (two, one per consumer)",
    "lbc": "the consumer's buffer of a full aux tile",
    "lbc3": "the consumer's buffer of a full aux tile, 3-D (batched kernels)",
    "vb": "shared buffers of a staged per-row/per-column operand",
    "vbc": "the consumer's buffer of a staged vector",
    "ob": "piece buffers of an output staged per column piece",
    "hold": "a slot output's piece held in registers (piece: its piece)",
    "ld": "an aux tile's slice loaded in the piece loop",
    "lv": "a staged vector's slice loaded in the piece loop",
    "st": "an output's value stored into its buffer after the piece loop's body",
}
assert all(re.fullmatch(r"[a-z][a-z0-9]*", r) for r in ROLES)

# the forms of identifiers the namer builds; fixed identifiers of the emitters never match
GENERATED = re.compile(r"(?:u|v|s)\d+(?:_|\Z)")
_USER = re.compile(r"u(\d+)(?:_([a-z][a-z0-9]*)(?:_(\d+))?)?\Z")
_NODE = re.compile(r"(?:v\d+(?:_\d+|_[ms])?|s\d+)\Z")


@dataclass(frozen=True)
class Names:
    """The numbers of one DAG's operands and outputs, and the identifiers built from them."""

    users: tuple[str, ...]  # user names, by number
    kinds: tuple[str, ...]  # what each is ("operand, per-row vector", ...), for the table

    @classmethod
    def of(cls, dag: Dag) -> "Names":
        users = [s.name for s in dag.used_operands] + [o.name for o in dag.outputs]
        kinds = [f"operand, {s.describe()}" for s in dag.used_operands]
        kinds += [f"output, {o.kind.value}" for o in dag.outputs]
        if len(set(users)) != len(users):  # the frontend keeps outputs apart from operands
            raise ValueError(f"operand and output names are not distinct: {users}")
        return cls(tuple(users), tuple(kinds))

    def number(self, name: str) -> int:
        """The number of operand or output ``name``."""
        try:
            return self.users.index(name)
        except ValueError:
            raise KeyError(f"{name!r} is no operand or output of this kernel") from None

    def __call__(self, name: str, role: str | None = None, piece: int | None = None) -> str:
        """The identifier of ``name``'s ``role`` (None: the value itself, a runtime scalar),
        for ``piece`` (a sub-tile, a step; None: one for the whole tile)."""
        ident = f"u{self.number(name)}"
        if role is None:
            if piece is not None:
                raise ValueError("a piece needs a role")
            return ident
        if role not in ROLES:
            raise ValueError(f"unknown role {role!r} (names.ROLES)")
        ident += f"_{role}"
        if piece is not None:
            if not isinstance(piece, int) or isinstance(piece, bool) or piece < 0:
                raise ValueError(f"a piece is a number, got {piece!r}")
            ident += f"_{piece}"
        return ident

    def user(self, name: str) -> "User":
        """``name``'s identifiers, as a callable of (role, piece)."""
        self.number(name)
        return User(self, name)

    @staticmethod
    def value(k: int, piece: int | None = None) -> str:
        """The variable holding node ``k``'s value (in sub-tile ``piece``)."""
        return f"v{k}" if piece is None else f"v{k}_{piece}"

    @staticmethod
    def row_part(k: int, part: str) -> str:
        """Part ``part`` ("m": the max, "s": the sum of exp) of node ``k``'s in-tile
        logsumexp or shifted_sumexp (a reduction feeding computation, in one pass)."""
        assert part in ("m", "s"), part
        return f"v{k}_{part}"

    @staticmethod
    def hoisted(k: int) -> str:
        """The variable holding program-level scalar node ``k``."""
        return f"s{k}"

    def owns(self, ident: str) -> bool:
        """Whether ``ident`` is an identifier this namer can build (for checks)."""
        m = _USER.match(ident)
        if m:
            return int(m.group(1)) < len(self.users) and (m.group(2) is None or m.group(2) in ROLES)
        return bool(_NODE.match(ident))

    def table(self) -> list[str]:
        """The header docstring's lines: each number with the user's name."""
        return [f"u{i} = {n} ({k})" for i, (n, k) in enumerate(zip(self.users, self.kinds))]


@dataclass(frozen=True)
class User:
    """One operand's or output's identifiers: ``u(role, piece)`` is ``names(u.name, role, piece)``
    (what a tile object is handed to spell a load or store)."""

    names: Names
    name: str

    def __call__(self, role: str | None = None, piece: int | None = None) -> str:
        return self.names(self.name, role, piece)
