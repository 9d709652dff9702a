"""The error type the CLI turns into one line on stderr and exit code 2."""


class UserError(ValueError):
    """Bad input from the user: reported as ``dictcheck: error: <message>``, exit code 2."""
