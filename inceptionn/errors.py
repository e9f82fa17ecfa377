"""Errors the CLI reports as one clear line instead of a traceback."""


class UserError(Exception):
    """A mistake in what the user asked for (bad flag value, missing file, wrong state)."""
