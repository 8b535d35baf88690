"""Streaming one sequence's text as tokens are committed, never retracting what was printed.

A speculative round commits its accepted drafts and the target's token together, so text arrives in
chunks of one or more tokens. After each commit the whole committed text is decoded again and the
part that is final is released:
- an incomplete multi-byte UTF-8 character decodes to U+FFFD at the end (byte-level BPE splits
  characters across tokens); trailing U+FFFD is held back until the next token completes it;
- a suffix that is the beginning of a stop string is held back: the next tokens may complete the
  stop string, and the text is cut before it (a stop string can span tokens and rounds).
Every occurrence of a stop string begins inside what was held back when it was still incomplete, so
the final text (cut before the first stop string, EOS dropped) always starts with what was released,
and :meth:`TextStream.finish` releases the rest.
"""

from __future__ import annotations

REPLACEMENT = "\ufffd"


class TextStream:
    """Releases the final part of a growing text (see the module note)."""

    def __init__(self, stop: list[str]) -> None:
        self.stop = [s for s in stop if s]
        self.sent = ""

    def _held_back(self, text: str) -> int:
        end = len(text)
        while end > 0 and text[end - 1] == REPLACEMENT:
            end -= 1
        hold = 0
        for s in self.stop:
            for n in range(min(len(s) - 1, end), hold, -1):
                if text.endswith(s[:n], 0, end):
                    hold = n
                    break
        return end - hold

    def update(self, text: str) -> str:
        """The committed text so far (EOS dropped); returns the newly final chunk ('' if none)."""
        end = self._held_back(text)
        if end <= len(self.sent) or not text.startswith(self.sent):
            return ""
        chunk = text[len(self.sent) : end]
        self.sent += chunk
        return chunk

    def finish(self, final_text: str) -> str:
        """The rest of the final text (cut before a stop string, EOS dropped)."""
        if not final_text.startswith(self.sent):  # cannot happen for a prefix-stable decoder (module note)
            raise RuntimeError(f"final text {final_text!r} does not start with the streamed {self.sent!r}")
        chunk = final_text[len(self.sent) :]
        self.sent = final_text
        return chunk
