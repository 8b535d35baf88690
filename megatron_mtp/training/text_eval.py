"""Micro-batches from a plain text file: one document, non-overlapping windows of seq_length tokens.

In a window of s tokens, position t predicts token t+1 (t < s-1); MTP depth k at t predicts token
t+1+k, scored only while it lies inside the window. The last partial window is dropped; windows
are dealt to data-parallel ranks like training samples, and padding windows carry a zero mask.
"""

from __future__ import annotations

from pathlib import Path

import torch

from megatron_mtp.errors import UserError


def read_text_file(text_file: str) -> str:
    """--text-file's text, in one sentence when it can't be read."""
    path = Path(text_file)
    if path.is_dir():
        raise UserError(f"--text-file {text_file} is a directory; give a UTF-8 text file")
    try:
        return path.read_text(encoding="utf-8-sig")
    except FileNotFoundError:
        raise UserError(f"--text-file {text_file} does not exist") from None
    except UnicodeDecodeError as exc:
        raise UserError(f"--text-file {text_file} is not UTF-8 text (byte {exc.start}); convert it to UTF-8") from None


def text_batches(session, text: str, where: str, max_windows: int | None = None):
    """Micro-batches of ``text`` (what ``where`` names) at the session's sequence length and micro-batch
    size: every window, or the first ``max_windows``; with the number of rounds and of windows."""
    cfg, ranks = session.cfg, session.ranks
    if session.tokenizer is None:
        raise UserError(f"checkpoint {session.loaded_from} has no tokenizer/ directory, so {where} cannot be "
                        "tokenized")
    ids = session.tokenizer.encode(text)
    s = cfg.training.seq_length
    n_windows = len(ids) // s if max_windows is None else min(len(ids) // s, max_windows)
    if n_windows == 0:
        raise UserError(f"{where} has {len(ids)} tokens, fewer than one window of "
                        f"training.seq_length={s}; use a longer file or a smaller seq_length")
    windows = torch.tensor(ids[: n_windows * s], dtype=torch.long).view(n_windows, s)
    mbs = cfg.training.micro_batch_size
    per_round = mbs * ranks.dp
    rounds = -(-n_windows // per_round)
    total = rounds * per_round
    pad = total - n_windows
    tokens = torch.cat([windows, torch.zeros(pad, s, dtype=torch.long)])
    labels = torch.zeros_like(tokens)
    labels[:, :-1] = tokens[:, 1:]
    mask = torch.zeros(total, s, dtype=torch.float32)
    mask[:n_windows, :-1] = 1.0
    positions = torch.arange(s).expand(total, s).contiguous()

    def gen():
        for r in range(rounds):
            lo = r * per_round + ranks.dp_rank * mbs
            sl = slice(lo, lo + mbs)
            yield {"tokens": tokens[sl], "labels": labels[sl], "loss_mask": mask[sl], "position_ids": positions[sl]}

    return gen(), rounds, n_windows
