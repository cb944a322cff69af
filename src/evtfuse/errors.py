"""Errors and Status objects shared by every layer (layer: base; imports nothing of evtfuse).

``EpilogueError`` is what a user sees for a bad epilogue or bad arguments: a ValueError
whose text names the variable and, for source errors, the line; ``ConfigError`` the same
for a setting (an environment variable). ``Status`` is the
answer of ``supports``-style questions: truthy on success, and carrying the reason when
falsy, so that ``explain`` can say why every candidate was refused.
"""

from __future__ import annotations

from dataclasses import dataclass


class EpilogueError(ValueError):
    """A bad epilogue function or argument. ``variable`` and ``line`` say where.

    The text starts with the line (``line 3 of my_epi: ...``) and ends with the source
    line, except for the messages CUTLASS documents (``exact=True``), which stay word for
    word at the start, the location after them (``... twice. (line 3 of my_epi)``).
    """

    def __init__(self, message: str, *, variable: str | None = None, line: int | None = None,
                 where: str | None = None, source_line: str | None = None,
                 exact: bool = False):
        self.variable = variable
        self.line = line
        self.bare_message = message
        text = message
        if line is not None:
            loc = f"line {line}" + (f" of {where}" if where else "")
            # documented messages stay word for word, the location after them
            text = f"{message} ({loc})" if exact else f"{loc}: {message}"
            if source_line:
                text += f"\n    {shorten(source_line.strip())}"
        super().__init__(text)


SOURCE_LINE_LIMIT = 160  # characters of a source line an error message quotes


def shorten(text: str, limit: int = SOURCE_LINE_LIMIT) -> str:
    """``text``, or its start and how much was left out when longer than ``limit``: an
    error quoting a 20,000-term line stays readable."""
    if len(text) <= limit:
        return text
    return f"{text[:limit - 30]} ... ({len(text) - (limit - 30)} more characters)"


def not_an_operand(name: str, value: object) -> EpilogueError:
    """The error for an operand that is neither a number nor a tensor (bool and None
    included): raised when arguments are built, and by a cached launch plan's runtime
    scalars, which skip that validation on repeated calls."""
    if isinstance(value, bool) or value is None:
        return EpilogueError(f"Argument {name} must be a number or a tensor, not {value!r}",
                             variable=name)
    return EpilogueError(f"Argument {name} must be a number or a torch.Tensor, not "
                         f"{type(value).__name__}", variable=name)


def scalar_value(name: str, value: object) -> float:
    """A runtime scalar as the float a kernel is given (computing in fp32, the kernel rounds
    it again, to inf past fp32's largest value, as torch rounds a Python number it multiplies
    an fp32 tensor by). A number ``float()`` cannot convert (an int past the largest double)
    is an error naming the operand, not an OverflowError from inside a launch."""
    try:
        return float(value)  # type: ignore[arg-type]
    except OverflowError:
        raise EpilogueError(f"Argument {name} = {_describe(value)} does not fit a float "
                            "(Python's float() of it raises OverflowError); pass a float "
                            "(float('inf') for infinity)", variable=name) from None


def _describe(value: object) -> str:
    if isinstance(value, int):
        try:
            digits = f"{len(str(abs(value)))} digits"
        except ValueError:  # past Python's limit on int-to-str conversion
            digits = f"about {int(value.bit_length() * 0.30103) + 1} digits"
        return f"an int of {digits}"
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:37]}..."


class UnsupportedError(RuntimeError):
    """No kernel can run these arguments; the text says why for every family."""


class ConfigError(ValueError):
    """A setting evtfuse cannot work with (an environment variable such as
    ``EVTFUSE_CACHE_DIR``); ``variable`` names it and the text says what to change."""

    def __init__(self, message: str, *, variable: str):
        self.variable = variable
        super().__init__(message)


@dataclass(frozen=True)
class Status:
    """Truthy when supported; otherwise ``reason`` says what is missing."""

    ok: bool
    reason: str = ""

    def __bool__(self) -> bool:
        return self.ok

    @staticmethod
    def success() -> "Status":
        return Status(True)

    @staticmethod
    def fail(reason: str) -> "Status":
        return Status(False, reason)

    def __str__(self) -> str:
        return "supported" if self.ok else f"not supported: {self.reason}"
