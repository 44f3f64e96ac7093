"""Subcommands of `filterforward`, one module each."""
