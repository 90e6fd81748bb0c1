"""A file named on its own, read by its content where its name does not tell (used by
:func:`critic_audit.io.detect.resolve_inputs`): a gzip- (or, with the ``zstandard`` package,
zstd-) compressed file is decompressed into a temporary folder; a file (or a pipe's spooled copy)
without a rollout suffix is given one from its first bytes (``PAR1`` -> ``.parquet``; one JSON object
per line -> ``.jsonl``; one JSON value -> ``.json``), as a link in a temporary folder, so that every
reader's suffix rules apply. A folder search (:func:`critic_audit.io.detect.resolve_inputs`) sniffs
the first 4 bytes of each file (:func:`is_compressed`) and reads a compressed one the same way, whatever
its name (``a.json.gz`` beside ``a.json``, a chunk ``00000.jsonl.zst``, a gzip file without a suffix).
Errors name the user's file, not the temporary copy (:func:`critic_audit.errors.show_path_as`).
Layering: imports only :mod:`critic_audit.errors`.
"""

from __future__ import annotations

import itertools
import json
import os
from pathlib import Path

from critic_audit.errors import InputError, show_path_as

__all__ = ["by_content", "is_compressed", "strip_compression_suffix", "MAX_DECOMPRESSED_BYTES"]

#: The most bytes a compressed input may decompress to (it is written to a temporary file).
MAX_DECOMPRESSED_BYTES = 8 << 30
_GZIP, _ZSTD = b"\x1f\x8b", b"\x28\xb5\x2f\xfd"
_COMPRESSED_SUFFIXES = (".gzip", ".zstd", ".gz", ".zst")
_FOLDER: list[Path] = []
_DONE: dict[str, Path] = {}  # "realpath:mtime_ns:size" -> what by_content gave
_COUNT = itertools.count()


def _temp_folder() -> Path:
    if not _FOLDER:
        import atexit
        import shutil
        import tempfile

        _FOLDER.append(Path(tempfile.mkdtemp(prefix="critic-audit-in-")))
        atexit.register(shutil.rmtree, _FOLDER[0], True)
    return _FOLDER[0]


def _head(p: Path, n: int = 1 << 16) -> bytes:
    try:
        with open(p, "rb") as fh:
            return fh.read(n)
    except OSError:
        return b""


def is_compressed(p: Path, head: bytes | None = None) -> bool:
    """``p`` starts with a gzip or zstd magic number (its first 4 bytes, or those of ``head`` when given;
    False when it cannot be read)."""
    head = _head(p, 4) if head is None else head[:4]
    return head[:3] == _GZIP + b"\x08" or head == _ZSTD  # gzip: deflate, its only method


def strip_compression_suffix(name: str) -> str:
    """``name`` without a ``.gz`` / ``.gzip`` / ``.zst`` / ``.zstd`` ending (``a.json.gz`` -> ``a.json``)."""
    for s in _COMPRESSED_SUFFIXES:
        if name.lower().endswith(s) and len(name) > len(s):
            return name[: -len(s)]
    return name


def _json_suffix(head: bytes) -> str | None:
    """``.jsonl`` when the first line is a whole JSON object and more follows, ``.json`` for a JSON
    value, None for anything else."""
    text = head.lstrip(b"\xef\xbb\xbf \t\r\n")
    if text[:1] not in (b"{", b"["):
        return None
    line, nl, rest = text.partition(b"\n")
    if text[:1] == b"{" and nl:
        try:
            json.loads(line)
            return ".jsonl"
        except ValueError:
            pass
    return ".json"


def _decompress(p: Path, magic: bytes) -> Path:
    name = strip_compression_suffix(p.name)
    if magic == _GZIP:
        import gzip

        opener = gzip.open
    else:
        try:
            import zstandard
        except ImportError:
            e = InputError("zstd-compressed file (the zstandard package is not installed)", path=p,
                           fix="decompress it, pass <(zstd -dc FILE), or pip install zstandard")
            e.reason = "zstandard_missing"  # type: ignore[attr-defined]  # not the file's fault: never skipped
            raise e from None
        opener = zstandard.open
    out = _temp_folder() / str(next(_COUNT)) / name
    out.parent.mkdir()
    total = 0
    try:
        with opener(p, "rb") as src, open(out, "wb") as dst:
            while chunk := src.read(1 << 20):
                total += len(chunk)
                if total > MAX_DECOMPRESSED_BYTES:
                    raise InputError(f"decompresses to more than {MAX_DECOMPRESSED_BYTES >> 30} GiB", path=p,
                                     fix="decompress it to a file and point at it")
                dst.write(chunk)
    except (OSError, EOFError, ValueError) as e:
        kind = "gzip" if magic == _GZIP else "zstd"
        raise InputError(f"{kind}-compressed file that does not decompress ({str(e).splitlines()[0] if str(e) else e})",
                         path=p, fix="repair it, or decompress it and point at the result") from None
    return out


def by_content(p: Path, known_suffixes: tuple[str, ...]) -> Path:
    """``p`` itself, or a temporary file / link holding its rollouts under a name whose suffix tells the
    format (see the module docstring); ``known_suffixes``: the suffixes some reader reads (lower case).

    Raises:
        InputError: a compressed file that does not decompress, one that decompresses to more than
            :data:`MAX_DECOMPRESSED_BYTES`, or a zstd file without the ``zstandard`` package.
    """
    real = os.path.realpath(p)
    try:
        st = os.stat(real)
        key = f"{real}:{st.st_mtime_ns}:{st.st_size}"  # a file rewritten since is read again
    except OSError:
        key = real
    if key in _DONE:
        return _DONE[key]
    head = _head(p)
    out = p
    if head[:2] == _GZIP or head[:4] == _ZSTD:
        out = by_content(_decompress(p, head[:2] if head[:2] == _GZIP else _ZSTD), known_suffixes)
    elif not p.name.lower().endswith(known_suffixes):
        suffix = ".parquet" if head[:4] == b"PAR1" else _json_suffix(head)
        if suffix is not None:
            out = _temp_folder() / str(next(_COUNT)) / (p.name + suffix)
            out.parent.mkdir()
            out.symlink_to(real)
    if out != p:
        show_path_as(out, p)  # errors name the user's file
    _DONE[key] = out
    return out
