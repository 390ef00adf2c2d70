"""The one user-facing error type."""


class CircbufError(ValueError):
    """Bad user input: the message names the tensor, axis or rule that was broken."""
