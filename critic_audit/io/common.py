"""Atomic writers of the readers' outputs (a reader never sees a partial file)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import polars as pl

__all__ = ["write_parquet_atomic", "write_text_atomic"]


def _write_atomic(path: str | Path, write: Callable[[str], None]) -> Path:
    """``write(tmp)`` to a temporary sibling of ``path``, then renamed onto it
    (:func:`critic_audit.outputs.atomic_write`)."""
    from critic_audit.outputs import atomic_write

    return atomic_write(path, lambda tmp: write(str(tmp)))


def write_parquet_atomic(df: pl.DataFrame, path: str | Path) -> Path:
    """Write ``df`` to ``path`` as Parquet through a temporary sibling and ``os.replace``: a reader
    never sees a partial file and an interrupted write leaves the previous file intact.

    Raises:
        ConfigError: the parent folder cannot be created or written.
    """
    return _write_atomic(path, df.write_parquet)


def write_text_atomic(text: str, path: str | Path) -> Path:
    """Write UTF-8 ``text`` to ``path`` atomically, as :func:`write_parquet_atomic` does.

    Raises:
        ConfigError: the parent folder cannot be created or written.
    """
    return _write_atomic(path, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))
