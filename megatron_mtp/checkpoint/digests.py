"""Digests of a checkpoint's files, so bytes changed after the save (silent corruption on storage or
in transit) are found before a load uses them.

Design note.
  - What: manifest.json carries, beside each file's size, the SHA-256 of its bytes (``"digest":
    "sha256"``, ``"digests": {file: hex}``). SHA-256 rather than a CRC: any copy of a checkpoint can
    be checked with the standard ``sha256sum``, and no corruption pattern slips through; with the
    CPU's SHA instructions (OpenSSL through hashlib) it costs well under a second per GB (measured
    figures and the command in the README's checkpoint section), which a save or a load of the
    same bytes dwarfs. zlib.crc32 measured about 3 times faster; it is not needed at these costs.
  - Exempt: the text records config.yaml and train_state.json (their readers check them, and
    users may edit them), convert's hf_source/ record, and the manifest itself.
  - Computed where written: torch_dist names each shard file after the global rank that wrote it
    (``__R_I.distcp``, with megatron-core's optional group prefix before it). At publishing every
    rank hashes its own shard files right after the write, while they are still in its page
    cache and on its node's view of the filesystem, and rank 0 gathers them into the manifest it
    writes; rank 0 hashes what it wrote itself (the index, common.pt, the tokenizer) and any file
    no rank claimed. One process writing a checkpoint (convert from-hf, drop-mtp) hashes all.
  - Verified on load: the files are split over the loading ranks by size (each rank hashes about
    1/world of the bytes) and a mismatch on any rank reaches every rank, which raise the same
    DamagedCheckpoint naming the file (training/checkpoint_state.py); a resume then moves the step
    to checkpoints.damaged/ and loads the next newest, as for a shard that does not read back.
    convert and drop-mtp (one process) check the files they read (TorchDistReader.validate).
  - A manifest without digests (a checkpoint saved before they existed) loads unchecked.
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path
from typing import Optional

ALGORITHM = "sha256"
_SHARD = re.compile(r"__(\d+)_\d+\.distcp$")


def digest_of(path: Path) -> str:
    """The hex SHA-256 of a file's bytes, read in a stream."""
    with open(path, "rb") as fh:
        return hashlib.file_digest(fh, ALGORITHM).hexdigest()


def writer_rank(name: str) -> Optional[int]:
    """The global rank that wrote a torch_dist shard file (None for any other file)."""
    match = _SHARD.search(name)
    return int(match.group(1)) if match else None


def own_digests(step_dir: Path, rank: int) -> dict[str, str]:
    """{file: digest} of the shard files `rank` wrote under `step_dir`; a file that cannot be read here
    is left to rank 0, which hashes whatever no rank reported."""
    found = {}
    for folder, _, names in os.walk(step_dir):
        for name in names:
            if writer_rank(name) == rank:
                path = Path(folder) / name
                try:
                    found[path.relative_to(step_dir).as_posix()] = digest_of(path)
                except OSError:
                    continue
    return found


def mismatch(step_dir: Path, names: list[str], expected: dict[str, str]) -> Optional[str]:
    """What is wrong with the first of `names` whose bytes do not have their `expected` digest, in a few
    words naming the file; None when all match (a file absent from `expected` is not checked)."""
    for name in names:
        if name not in expected:
            continue
        try:
            actual = digest_of(step_dir / name)
        except OSError as exc:
            return f"{name} cannot be read ({exc.strerror or type(exc).__name__})"
        if actual != expected[name]:
            return (f"{name} does not match its SHA-256 digest in manifest.json (its bytes changed "
                    "after the save)")
    return None


def share(sizes: dict[str, int], rank: int, world: int) -> list[str]:
    """The files `rank` of `world` verifies: the largest first, each to the rank with the fewest bytes so
    far, so every rank hashes about the same amount."""
    loads = [0] * world
    mine = []
    for name in sorted(sizes, key=lambda n: (-sizes[n], n)):
        least = loads.index(min(loads))
        loads[least] += sizes[name]
        if least == rank:
            mine.append(name)
    return mine
