"""User-facing errors: a bad value the user gave, reported as one line, never a traceback."""


class InputError(ValueError):
    """A value given by the user (flag, TOML field, file) is invalid.

    The message is a single line that names the field and its unit; the CLI prints it as
    ``ckptsim: error: <message>`` and exits with status 2.
    """
