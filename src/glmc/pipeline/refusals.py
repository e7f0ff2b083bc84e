"""How a refusal reaches the command line: glmc's own message on stderr, no traceback, exit status 1.

A refusal is an error glmc raised on purpose to say what is wrong and what to do instead: a bad
setting, a folder that cannot be read or written, a disk that filled up. Those are told by where
they were raised (the innermost frame lies in glmc's source or in run.py) and by their kind (a
ValueError, an OSError, a NotImplementedError, or one of glmc's own exception classes). Anything
else, a failure inside torch or another library, keeps Hydra's report with its traceback, since that
is a fault to investigate rather than an input to change. With HYDRA_FULL_ERROR=1 every error keeps
its full traceback, as Hydra does.
"""

from __future__ import annotations

import os
import sys
import traceback
from pathlib import Path

import glmc

PACKAGE_DIR = Path(glmc.__file__).resolve().parent
REFUSAL_KINDS = (ValueError, OSError, NotImplementedError)
ENTRY_POINTS = ("run.py", "reproduce.py")  # the command-line scripts beside the package


def full_traceback_asked() -> bool:
    return os.environ.get("HYDRA_FULL_ERROR", "") not in ("", "0")


def _raised_in_glmc(err: BaseException) -> bool:
    tb = err.__traceback__
    if tb is None:
        return False
    while tb.tb_next is not None:
        tb = tb.tb_next
    where = Path(tb.tb_frame.f_code.co_filename).resolve()
    return where.is_relative_to(PACKAGE_DIR) or where.name in ENTRY_POINTS


def is_refusal(err: BaseException) -> bool:
    """True for an error glmc raised to say what to change (see the module's docstring)."""
    own_class = type(err).__module__.split(".")[0] == "glmc"
    return (own_class or isinstance(err, REFUSAL_KINDS)) and _raised_in_glmc(err)


def message_of(err: BaseException) -> str:
    """The message as a person reads it: OSErrors as `what: file`, others as their text."""
    if isinstance(err, OSError) and err.strerror:  # raised by the system: say what failed, where
        where = f": {err.filename}" if err.filename else ""
        return f"{err.strerror}{where}"
    return str(err) or type(err).__name__


def exit_if_refused(err: BaseException) -> None:
    """For a refusal: print its message alone on stderr and exit with status 1 (the traceback too with
    HYDRA_FULL_ERROR=1). Returns for any other error, which the caller re-raises."""
    if not is_refusal(err):
        return
    if full_traceback_asked():
        traceback.print_exception(err)
    print(f"Error: {message_of(err)}", file=sys.stderr, flush=True)
    raise SystemExit(1) from None


def unquoted_override_problem(arg: str) -> str | None:
    """Why Hydra's lexer would refuse the override `arg` where a quoted value would pass (a path with
    accents, brackets or spaces), with the quoted form to use; None for any other argument."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    key, sep, value = arg.partition("=")
    if arg.startswith("-") or not sep or value[:1] in ("'", '"'):
        return None
    parser = OverridesParser.create()
    try:
        parser.parse_overrides([arg])
        return None
    except OverrideParseException:
        pass
    quoted = f"{key}='{value}'" if "'" not in value else f'{key}="{value}"'
    try:
        parser.parse_overrides([quoted])
    except OverrideParseException:
        return None  # quoting would not help: Hydra's own message says more
    odd = sorted({c for c in value if not c.isascii()})
    holds = f" (it holds {''.join(odd)})" if odd else ""
    return (
        f'the override {arg} cannot be read unquoted{holds}: quote its value, e.g. "{quoted}" '
        "(the outer quotes are for the shell, the inner ones for Hydra)"
    )


def exit_on_unquoted_overrides(argv: list[str]) -> None:
    """Before Hydra parses the command line: print the first unquoted_override_problem and exit 1."""
    if full_traceback_asked():
        return
    for arg in argv:
        problem = unquoted_override_problem(arg)
        if problem:
            print(f"Error: {problem}", file=sys.stderr, flush=True)
            raise SystemExit(1)
