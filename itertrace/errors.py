"""The one exception type that means "the user gave us something wrong"."""


class UserError(Exception):
    """Bad input: the CLI prints `itertrace: error: <message>` on one line and exits with status 2.

    The message names the file, flag or value at fault and what is wrong with it.
    """
