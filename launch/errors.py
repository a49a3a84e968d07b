"""The launcher's user error: one line, exit code 2, nothing started. Raised by the command
bodies, the pre-flight and the renderers alike, so it lives below all of them."""


class UsageError(Exception):
    """A user error found before anything starts: one line, exit code 2."""
