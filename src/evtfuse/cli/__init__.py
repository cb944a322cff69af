"""The ``evtfuse`` command: ``demo``, ``run``, ``show``, ``verify``, ``profile``, ``bench``,
``precompile``, ``cache``, ``export``.

Layer: tools (cli, the top). Uses only the public API (``get_kernels``, ``explain``, ``Kernel``,
``evtfuse.reference``, ``evtfuse.runtime.cache``) and never executes user text: an
epilogue given as a string or as ``path.py:fn`` is read and parsed with ``ast``; the file
is never imported.

With a CUDA GPU the commands run there; without one they run small problems through
Triton's CPU interpreter and say so. Exit status: 0 ok, 1 verification failed, 2 bad
input, 3 no kernel supports the problem (the reason is printed), 4 a tool or module is
missing (ncu, ``evtfuse.bench``). Logging goes to the ``evtfuse`` logger: quiet unless
``-v``/``-vv`` or ``EVTFUSE_LOG=info|debug``.

This module registers the commands on the typer ``app`` (``app``: the application and
``main``), in the order ``--help`` shows them; the commands and their helpers live in the
modules beside it: ``base`` (exit codes, ``CliError``), ``sources`` (epilogue text and
files), ``problem`` (flags -> operands), ``device`` (GPU or interpreter, timing),
``report`` (kernel choice, run, verify, report text), ``demos``, ``commands`` (run, show,
verify), ``ncu`` (profile), ``bench_cache``, ``precompile`` and ``export`` (export
cutlass). Every name is re-exported here; the commands look ``choose_kernel`` up in
``report`` at call time (a test replaces it there). Nothing below imports this module: the
package is the top of the cli.
"""

from __future__ import annotations

from ..ir import DTYPE_NAMES
from ..logs import setup_logging  # shared with library users: evtfuse.logs
from .app import _root, app, cache_app, export_app, main
from .base import (EXIT_INPUT, EXIT_MISSING, EXIT_OK, EXIT_UNSUPPORTED, EXIT_VERIFY, CliError,
                   _fail, _user_errors, log)
from .bench_cache import _cache_module, bench, cache_clear, cache_list
from .commands import (AbOpt, AccOpt, AlphaOpt, AMajorOpt, BetaOpt, BMajorOpt, COpt, DOpt,
                       EpilogueFileOpt, EpilogueOpt, KernelOpt, MnklOpt, OperandOpt, OutputOpt,
                       ScalarOpt, SeedOpt, Tf32Opt, _describe, _spec, run, show, verify)
from .demos import DEMO_EPILOGUES, _demo_case, demo
from .export import export_cutlass
from .device import Device, _synchronize, pick_device, time_ms
from .ncu import NCU_METRICS, parse_ncu_csv, profile
from .precompile import ENTRY_KEYS, precompile, read_entries
from .problem import (OPERAND_KINDS, OUTPUT_KINDS, BuiltProblem, ProblemSpec,
                      _shape_for, build_problem, parse_assignments, parse_dtype, parse_mnkl,
                      problem_spec_from_flags, short_dtype)
from .report import (TUNE_MODES, RunReport, _api, choose_kernel, eager_of, format_report,
                     run_and_report)
from .sources import _looks_like_source, load_epilogue_file, resolve_epilogue, resolve_positional

# the commands, in the order --help lists them; the pass-through ones take any arguments
_PASS_THROUGH = {"allow_extra_args": True, "ignore_unknown_options": True}
app.command()(demo)
app.command()(run)
app.command()(show)
app.command(context_settings=_PASS_THROUGH)(profile)
app.command(context_settings=_PASS_THROUGH)(verify)
app.command(context_settings=_PASS_THROUGH)(bench)
app.command()(precompile)
cache_app.command("list")(cache_list)
cache_app.command("clear")(cache_clear)
export_app.command("cutlass")(export_cutlass)
