"""The error file (docs/command-jobs.md, "The error file"): a failed process's last word.

A process that dies of an uncaught exception writes {"message", "traceback", "retry"} to
SUBSTRAX_ERROR_FILE, which becomes the attempt's error (`substraxctl get`), instead of the last
lines of its output. `retry: false` fails the job at once, without using its restarts: raise a
`PermanentError` (or pass retry=False) when restarting cannot help (bad data, a bad setting).
"""

from __future__ import annotations

import functools
import json
import os
import sys
import tempfile
import traceback
from types import TracebackType
from typing import Any, Callable, TypeVar, overload

from substrax._info import info

# The launcher reads 256 KiB of the file and keeps the traceback's last 3 KiB; these bounds keep
# the file well under the first.
_MAX_MESSAGE_CHARS = 16 * 1024
_MAX_TRACEBACK_CHARS = 64 * 1024

F = TypeVar("F", bound=Callable[..., Any])


class PermanentError(Exception):
    """An error that restarting the job cannot mend: its error file says retry: false."""


def write_error_file(error: BaseException, retry: bool | None = None) -> str | None:
    """Writes `error` to the error file; returns its path, or None outside a job.

    retry=None: false for a PermanentError, true otherwise. The first error written in an
    attempt stays (an atomic link that never replaces an existing file): several threads or
    torchrun workers failing together leave the first failure's error.
    """
    path = info().error_file
    if path is None:
        return None
    if retry is None:
        retry = not isinstance(error, PermanentError)
    message = "".join(traceback.format_exception_only(type(error), error)).strip()
    trace = "".join(traceback.format_exception(type(error), error, error.__traceback__))
    payload = json.dumps({
        "message": message[:_MAX_MESSAGE_CHARS],
        "traceback": trace[-_MAX_TRACEBACK_CHARS:],
        "retry": retry,
    })
    directory = os.path.dirname(path) or "."
    fd, temporary = tempfile.mkstemp(dir=directory, prefix=".error-", suffix=".json")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(payload + "\n")
        try:
            os.link(temporary, path)
        except FileExistsError:
            pass  # an earlier failure of this attempt wrote it first
    finally:
        os.unlink(temporary)
    return path


def _record_failure(error: BaseException, retry: bool | None) -> None:
    """Writes the error file for an exception that ends the program, and for SystemExit with a
    message (`raise SystemExit("why")`); not for a plain exit status nor Ctrl-C, which say
    nothing the output does not. A failure to write is printed, never raised over `error`."""
    if isinstance(error, SystemExit):
        if error.code is None or isinstance(error.code, int):
            return
    elif not isinstance(error, Exception):
        return
    try:
        write_error_file(error, retry)
    except Exception as failure:  # noqa: BLE001: the program's own error matters more
        print(f"substrax.job: could not write the error file: {failure}", file=sys.stderr)


@overload
def record(fn: F) -> F: ...
@overload
def record(fn: None = None, *, retry: bool | None = None) -> Callable[[F], F]: ...


def record(fn: Callable[..., Any] | None = None, *, retry: bool | None = None) -> Any:
    """Decorates a job's entry point: an exception escaping it is written to the error file,
    then raised on. `@record` or `@record(retry=False)` (every error is permanent)."""

    def decorate(function: F) -> F:
        @functools.wraps(function)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            try:
                return function(*args, **kwargs)
            except BaseException as error:
                _record_failure(error, retry)
                raise

        return wrapper  # type: ignore[return-value]

    return decorate(fn) if fn is not None else decorate


def install_error_hook(retry: bool | None = None) -> None:
    """Writes the error file for any exception that ends the program (sys.excepthook), then
    prints it as Python does. Call it first thing in a script; `record` does the same for one
    function."""
    previous = sys.excepthook

    def hook(kind: type[BaseException], error: BaseException,
             trace: TracebackType | None) -> None:
        _record_failure(error.with_traceback(trace), retry)
        previous(kind, error, trace)

    sys.excepthook = hook
