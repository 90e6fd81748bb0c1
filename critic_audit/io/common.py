"""Atomic writers of the readers' outputs (a reader never sees a partial file)."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from critic_audit.errors import InputError

if TYPE_CHECKING:
    import polars as pl

__all__ = ["write_parquet_atomic", "write_text_atomic"]


def _write_atomic(path: str | Path, write: Callable[[str], None]) -> Path:
    """``write(tmp)`` to a temporary sibling of ``path``, then ``os.replace`` it onto ``path``."""
    p = Path(path)
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.tmp-", dir=p.parent)
    except OSError as e:
        raise InputError(f"cannot write ({e.strerror or e})", path=p, fix="choose a writable --out path") from None
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, p)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return p


def write_parquet_atomic(df: pl.DataFrame, path: str | Path) -> Path:
    """Write ``df`` to ``path`` as Parquet through a temporary sibling and ``os.replace``: a reader
    never sees a partial file and an interrupted write leaves the previous file intact.

    Raises:
        InputError: the parent folder cannot be created or written.
    """
    return _write_atomic(path, df.write_parquet)


def write_text_atomic(text: str, path: str | Path) -> Path:
    """Write UTF-8 ``text`` to ``path`` atomically, as :func:`write_parquet_atomic` does.

    Raises:
        InputError: the parent folder cannot be created or written.
    """
    return _write_atomic(path, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))
