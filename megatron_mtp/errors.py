"""The one error type users see, and the one style of its sentence.

Every bad input (config, file, command line, checkpoint) raises ``UserError`` with one sentence:
what is wrong, where, and what to do. The CLI prints it without a traceback as
``megatron-mtp COMMAND: error: SENTENCE`` and exits with 2.

The style (``sentence``, applied by ``UserError`` itself, so no message can miss it): one line; one
sentence, its clauses joined by semicolons, never a second sentence; no final period, as argparse
writes its own errors on the same line shape. ``is_one_sentence`` is the check the tests apply to
every command's refusals (tests/unit/test_error_style.py).
"""

import contextlib
import re
from typing import Iterator

_NEW_SENTENCE = re.compile(r"[.!?] [A-Z]")


def sentence(text: object) -> str:
    """``text`` in the house style: whitespace (newlines included) folded to single spaces, a final
    period dropped (an ellipsis kept)."""
    out = " ".join(str(text).split())
    return out[:-1] if out.endswith(".") and not out.endswith("..") else out


def is_one_sentence(text: str) -> bool:
    """One line, no final period, and no sentence starting inside it (". " followed by a capital)."""
    return bool(text) and "\n" not in text and sentence(text) == text and not _NEW_SENTENCE.search(text)


class UserError(Exception):
    """A problem with the user's input, reported as one clear sentence (``sentence``)."""

    every_rank = False
    """True when every rank of a job raises this same sentence (a config refusal, a RunError): the CLI
    prints it on rank 0 alone, and every rank exits with EXIT_USAGE. False: the rank that raises it
    prints it (a sentence only that rank can see, such as a file missing on its node)."""

    def __init__(self, *args: object) -> None:
        super().__init__(*((sentence(args[0]),) + args[1:] if args else args))


class RunError(UserError):
    """A run that must stop (diverged, a save that failed, a run directory in use), raised on every
    rank of a job with the same sentence; the CLI prints it once, on rank 0."""

    every_rank = True


@contextlib.contextmanager
def same_on_every_rank() -> Iterator[None]:
    """Mark a UserError raised inside as one every rank raises alike (``UserError.every_rank``): wrap
    only checks that depend on nothing but the config and the launch, which every rank shares."""
    try:
        yield
    except UserError as exc:
        exc.every_rank = True
        raise


# Process exit codes shared by the trainer, the CLI and the Slurm job script.
EXIT_FINISHED = 0
EXIT_USAGE = 2
"""A bad input: the CLI printed one sentence."""
EXIT_RESUME = 75
"""EX_TEMPFAIL: the trainer saved on a signal; run the same command again to continue."""
EXIT_RANK_LOST = 76
"""A rank died or stopped making progress (training/watchdog.py); the job ended to be restarted from
its latest checkpoint (the local launcher and the Slurm job do so, up to --max-restarts)."""
