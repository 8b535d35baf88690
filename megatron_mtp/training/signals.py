"""The save-and-exit signals of a training run (checkpoint.exit_signals) and Ctrl-C.

They are only noted when they arrive; the trainer acts on them at the next agreement point of a step
or of an evaluation batch, so that every rank stops at the same place and saves.
"""

from __future__ import annotations

import signal

from megatron_mtp.errors import UserError


class SignalFlag:
    """The save-and-exit signals (checkpoint.exit_signals) and Ctrl-C, noted when they arrive and acted on
    at the next step's agreement point. A second Ctrl-C stops at once, without saving."""

    def __init__(self, names: list[str], say=None):
        self.received: str | None = None
        self.say = say or (lambda line: None)
        self.previous: dict = {}
        for name in names:
            sig = getattr(signal, name, None)
            if sig is None:
                raise UserError(f"checkpoint.exit_signals has unknown signal '{name}'; use names like SIGUSR1")
            self.previous[sig] = signal.signal(sig, self._handle)
        if signal.SIGINT not in self.previous:
            self.previous[signal.SIGINT] = signal.signal(signal.SIGINT, self._interrupt)

    def _handle(self, signum, frame):
        self.received = signal.Signals(signum).name

    def _interrupt(self, signum, frame):
        if self.received == "SIGINT":
            raise KeyboardInterrupt
        self.received = "SIGINT"
        self.say("received SIGINT (Ctrl-C): saving when this step ends; press Ctrl-C again to stop without saving")

    def restore(self) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)
        self.previous.clear()
