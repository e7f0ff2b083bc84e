"""A refusal (an error of REFUSAL_KINDS or glmc's own, raised in glmc) reaches the command line as its message
on stderr and exit status 1; other errors keep Hydra's report and traceback, as all do with HYDRA_FULL_ERROR=1."""

from __future__ import annotations

import os
import shlex
import sys
import traceback
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parents[1]  # src/glmc
REFUSAL_KINDS = (ValueError, OSError, NotImplementedError)
ENTRY_POINTS = ("run.py", "reproduce.py")  # the command-line scripts beside the package


def full_traceback_asked() -> bool:
    return os.environ.get("HYDRA_FULL_ERROR", "") not in ("", "0")


def is_refusal(err: BaseException) -> bool:
    """True for an error glmc raised to say what to change."""
    tb = err.__traceback__
    if tb is None or not (type(err).__module__.split(".")[0] == "glmc" or isinstance(err, REFUSAL_KINDS)):
        return False
    while tb.tb_next is not None:
        tb = tb.tb_next
    where = Path(tb.tb_frame.f_code.co_filename).resolve()
    return where.is_relative_to(PACKAGE_DIR) or where.name in ENTRY_POINTS


def message_of(err: BaseException) -> str:
    """The message as a person reads it: OSErrors as `what: file`, others as their text."""
    if isinstance(err, OSError) and err.strerror:  # raised by the system: say what failed, where
        where = f": {err.filename}" if err.filename else ""
        return f"{err.strerror}{where}"
    return str(err) or type(err).__name__


def exit_if_refused(err: BaseException) -> None:
    """For a refusal: print its message on stderr and exit 1; returns for any other error."""
    if not is_refusal(err):
        return
    if full_traceback_asked():
        traceback.print_exception(err)
    print(f"Error: {message_of(err)}", file=sys.stderr, flush=True)
    raise SystemExit(1) from None


def _hydra_quoted(text: str) -> str:
    """`text` as one quoted Hydra string: in single quotes, or double quotes where it holds a single one."""
    return f"'{text}'" if "'" not in text else f'"{text}"'


def _quoted_form(value: str) -> tuple[str, object] | None:
    """(the value quoted for Hydra, a list element by element; what Hydra should read), None for nested values."""
    if value[:1] == "{":
        return None
    if value[:1] == "[" and value[-1:] == "]":
        inner = value[1:-1].strip()
        elements = [e.strip() for e in inner.split(",")] if inner else []
        if any(e[:1] in ("[", "{") for e in elements):
            return None
        return "[" + ",".join(map(_hydra_quoted, elements)) + "]", elements
    return _hydra_quoted(value), value


def unquoted_override_problem(arg: str) -> str | None:
    """Why Hydra's lexer refuses override `arg` where its quoted form would pass, with that form; else None."""
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
    form = _quoted_form(value)
    if form is None:
        return None
    quoted = f"{key}={form[0]}"
    try:
        if parser.parse_overrides([quoted])[0].value() != form[1]:
            return None
    except OverrideParseException:
        return None  # quoting would not help: Hydra's own message says more
    odd = sorted({c for c in value if not c.isascii()})
    holds = f" (it holds {''.join(odd)})" if odd else ""
    what = "each element of the list" if isinstance(form[1], list) else "its value"
    # for the shell: in double quotes where nothing in it is special there
    shell = f'"{quoted}"' if not any(c in quoted for c in '"$`\\!') else shlex.quote(quoted)
    return (
        f"the override {arg} cannot be read unquoted{holds}: quote {what}, e.g. {shell} "
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
