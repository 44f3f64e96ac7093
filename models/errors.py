"""The error type for problems a user can fix (bad input, missing file, wrong setting), and the one-line form of
pydantic's validation errors that such messages quote."""

from __future__ import annotations

from pydantic import ValidationError


class FilterForwardError(Exception):
    """Its message is one line that says what is wrong and what to do; the CLI prints it without a traceback."""


def validation_summary(exc: ValidationError, whole: str = "input") -> str:
    """Pydantic's errors on one line: the first in full (`whole` names the place when it is the whole input),
    then how many more."""
    errors = exc.errors()
    first = errors[0]
    where = ".".join(str(part) for part in first["loc"]) or whole
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return f"{where}: {first['msg'].removeprefix('Value error, ')}{more}"
