"""The error type for problems a user can fix (bad input, missing file, wrong setting), the one-line form of
pydantic's validation errors that such messages quote, and the test for the one failure every writer handles
(a full disk)."""

from __future__ import annotations

import errno
import sqlite3

from pydantic import ValidationError

PG_DISK_FULL = "53100"  # PostgreSQL's SQLSTATE disk_full


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


def is_disk_full(exc: BaseException) -> bool:
    """Whether a write failed for lack of disk space: ENOSPC or a quota, SQLite's "database or disk is full",
    PostgreSQL's disk_full; a database error wrapped by SQLAlchemy is judged by the driver's error (`orig`)."""
    cause = getattr(exc, "orig", None) or exc
    if isinstance(cause, OSError):
        return cause.errno in (errno.ENOSPC, errno.EDQUOT)
    if isinstance(cause, sqlite3.Error):
        return getattr(cause, "sqlite_errorcode", None) == sqlite3.SQLITE_FULL or "disk is full" in str(cause)
    return getattr(cause, "sqlstate", None) == PG_DISK_FULL
