"""The package's error type: bad input (config, data, checkpoints, arguments) named clearly."""


class StreambackError(Exception):
    """A problem with the user's input; the CLI prints its message and exits with status 2."""
