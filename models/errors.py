"""The error type for problems a user can fix (bad input, missing file, wrong setting)."""


class FilterForwardError(Exception):
    """Its message is one line that says what is wrong and what to do; the CLI prints it without a traceback."""
