"""The one error type users see.

Every bad input (config, file, command line, checkpoint) raises ``UserError`` with one sentence:
what is wrong, where, and what to do. The CLI prints it without a traceback and exits with 2.
"""


class UserError(Exception):
    """A problem with the user's input, reported as one clear sentence."""


class RunError(UserError):
    """A run that must stop (diverged, a save that failed, a run directory in use), raised on every
    rank of a job with the same sentence; the CLI prints it once, on rank 0."""


# Process exit codes shared by the trainer, the CLI and the Slurm job script.
EXIT_FINISHED = 0
EXIT_USAGE = 2
"""A bad input: the CLI printed one sentence."""
EXIT_RESUME = 75
"""EX_TEMPFAIL: the trainer saved on a signal; run the same command again to continue."""
