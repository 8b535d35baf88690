"""The one error type users see.

Every bad input (config, file, command line, checkpoint) raises ``UserError`` with one sentence:
what is wrong, where, and what to do. The CLI prints it without a traceback and exits with 2.
"""


class UserError(Exception):
    """A problem with the user's input, reported as one clear sentence."""
