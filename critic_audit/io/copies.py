"""Rollouts repeated across files: the same trajectory id with the same content in two files (two copies
of one export, ``a.jsonl`` + ``b.jsonl`` or ``a.jsonl`` + ``a.parquet`` in one folder), told apart from
two runs that reuse ids (same id, other content: qualified by file, :func:`critic_audit.io.detect.apply_id_policy`).
Layering: imports only :mod:`critic_audit.errors`.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any

from critic_audit.errors import InputError, shown_path

__all__ = ["repeated_copies", "refuse_or_note_copies", "DUPLICATE_NOTE"]

#: The ``input.notes`` key counting trajectories read again from another file (``--lenient``).
DUPLICATE_NOTE = "duplicate_trajectories"
_CONTENT = ("messages", "token_ids", "response_mask", "reward", "success", "metadata")


def _fingerprint(x: Any) -> str | None:
    """A digest of what a rollout is (messages, token ids, mask, reward, success, the record's other fields), or None when the item
    carries none of it (a table row seen only by its ids)."""
    h = hashlib.blake2b(digest_size=16)
    found = False
    for name in _CONTENT:
        v = getattr(x, name, None)
        if v is None:
            h.update(b"\x00")
            continue
        found = found or name in ("messages", "token_ids")
        if hasattr(v, "tobytes") and hasattr(v, "astype"):  # numpy: by value, whatever the dtype
            h.update(v.astype("float64").tobytes())
        else:
            h.update(json.dumps(v, sort_keys=True, default=str).encode() if not isinstance(v, (int, float, bool)) else repr(v).encode())
        h.update(b"\x01")
    return h.hexdigest() if found else None


def repeated_copies(items: Sequence[Any], labels: Sequence[str]) -> list[tuple[int, int]]:
    """``(first, again)`` index pairs: item ``again`` has the id and content of item ``first``, read from
    another file (``labels[i]``: the file of ``items[i]``). Only ids found in several files are compared."""
    where: dict[str, set[str]] = {}
    for x, lab in zip(items, labels):
        where.setdefault(str(x.trajectory_id), set()).add(lab)
    seen: dict[tuple[str, str], tuple[int, str]] = {}
    out = []
    for i, (x, lab) in enumerate(zip(items, labels)):
        tid = str(x.trajectory_id)
        if len(where[tid]) < 2:
            continue
        fp = _fingerprint(x)
        if fp is None:
            continue
        first = seen.setdefault((tid, fp), (i, lab))
        if first[1] != lab:
            out.append((first[0], i))
    return out


def refuse_or_note_copies(items: Sequence[Any], specs: Sequence[Any], lenient: bool, report: Any) -> list[int]:
    """Refuse (strict) or, lenient, drop the trajectories of ``items`` repeated with the same id and content
    in another file (``specs[i]``: the file of ``items[i]``): the first copy read is kept, every later copy
    is returned for the caller to drop and counted in ``report.notes[DUPLICATE_NOTE]``. A copy audited
    twice would be two clusters of one rollout, and narrow every interval with no new evidence.

    Returns:
        The sorted positions in ``items`` of the copies to drop (empty when none).

    Raises:
        InputError: such a trajectory, not lenient: naming both files, the record and the count.
    """
    pairs = repeated_copies(items, [s.label for s in specs])
    if not pairs:
        return []
    if not lenient:
        first, again = pairs[0]
        files = len({specs[j].path for pair in pairs for j in pair})
        raise InputError(f"trajectory {str(items[again].trajectory_id)!r} has the same id and content as in "
                         f"{shown_path(specs[first].path)} ({len(pairs)} trajector{'y' if len(pairs) == 1 else 'ies'} repeated "
                         f"across {files} files: two copies of one export?)", path=specs[again].path,
                         fix="read one copy (move the other out of the folder), or pass --lenient to audit each "
                             f"once (the copies dropped, counted as {DUPLICATE_NOTE})")
    drop = sorted({again for _, again in pairs})
    if report is not None:
        report.notes[DUPLICATE_NOTE] += len(drop)
    return drop
