"""Resolve inputs once (path -> files, each with its format, kind, collection and label) and read them
with the registered readers (:mod:`critic_audit.io.formats`).

A folder is searched recursively (hidden entries are left out). A folder holding ``tokens.parquet``
or ``step_*.tokens.parquet`` is one table input (not searched further). Every other file is detected
on its own (:func:`detect_file`); a file no format reads (``notes.txt``, ``config.json``, a SWE-bench
results file) is skipped and counted in :attr:`ReadReport.skipped_files` as ``not_rollout_file``; a
Harbor trial's verifier files (``verifier/reward.txt``, ``result.json``) are read as its trajectory's
reward, not counted.

Names (``docs/input_formats.md``, "Collections"): the ``source`` of a conversation is its file's
collection: the file stem; where several files of a run share a stem (NeMo Gym writes every
environment's rollouts to ``resources_servers/<env>/data/example_rollouts.jsonl``), the folders that
tell them apart, generic folder names (``data``, ``rollouts``, ...) left out (``<env>``). A NeMo Gym
file alone (``example_rollouts.jsonl``, ``example_<x>_rollouts.jsonl``) is named by its nearest
non-generic folder (``<env>``), as when several are read together. Formats
with one rollout per file name the collection themselves (a SWE-agent run folder, a Harbor job).
Generated ids are ``{label}:{index}`` (the label: the source, or the relative path where sources
collide), and a trajectory id found in several files is qualified as ``{label}/{id}`` in each.
"""

from __future__ import annotations

import errno
import os
import stat
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from critic_audit.errors import InputError
from critic_audit.io.content import by_content, is_compressed, strip_compression_suffix
from critic_audit.io.copies import refuse_or_note_copies
from critic_audit.io.formats import FORMATS, Format
from critic_audit.io.records import (
    AS_JSONL, JSONL_SUFFIXES, MESSAGES_KEYS, ReadOptions, ReadReport, iter_jsonl, load_json,
)
from critic_audit.io.sniff import is_responses_record
from critic_audit.schema import Conversation
from critic_audit.summary import is_summary

__all__ = ["format_readers", "FileSpec", "ResolvedInput", "resolve_inputs", "detect_file", "detect_format", "read_conversations",
           "iter_conversations", "qualify_ids", "apply_id_policy", "kept_after_id_policy", "holds_rows", "claims_of", "claimants", "file_qualified", "group_scope", "CONVERSATION_FORMATS", "TABLE_FORMATS", "is_table_format"]

#: ``mixed``: an input whose files hold different conversation formats (each file read with its own).
CONVERSATION_FORMATS = (*(n for n, f in FORMATS.items() if f.kind == "conversations"), "mixed")
TABLE_FORMATS = tuple(n for n, f in FORMATS.items() if f.kind == "tables")
#: Folder names that say nothing about a collection (left out of a source name).
GENERIC_DIRS = frozenset({"data", "rollouts", "outputs", "output", "results", "trajs", "trajectories", "logs",
                          "runs", "agent", "eval", "evals", "samples", "jsonl", "json"})
_ALL_SUFFIXES = tuple(sorted({s for f in FORMATS.values() for s in f.suffixes}, key=len, reverse=True))
_HEAD = 20000


@dataclass(frozen=True)
class FileSpec:
    """One file (or table folder) to read: its format, its collection (``source``) and the unique
    ``label`` its generated ids start with; ``origin``: the user's file when ``path`` is its
    decompressed copy in a temporary folder (:mod:`critic_audit.io.content`), else None."""

    path: Path
    format: str
    source: str
    label: str
    kind: str = "conversations"
    origin: Path | None = None


@dataclass
class ResolvedInput:
    """An input path resolved to files: ``format`` is theirs when they agree, ``mixed`` otherwise;
    ``kind`` is ``tables`` when every file is read as tables."""

    path: Path
    files: list[FileSpec] = field(default_factory=list)

    @property
    def format(self) -> str:
        fmts = {f.format for f in self.files}
        if fmts == {"tokenized", "tables"}:
            return "tables"
        return fmts.pop() if len(fmts) == 1 else "mixed"

    @property
    def kind(self) -> str:
        kinds = {f.kind for f in self.files}
        return kinds.pop() if len(kinds) == 1 else "mixed"


# --------------------------------------------------------------------------------------------- detection


def _is_table_folder(p: Path) -> bool:
    """``p`` holds ``tokens.parquet`` or ``step_*.tokens.parquet`` (False when it cannot be listed: the
    folder search names it, :func:`entry_problem`)."""
    try:
        return (p / "tokens.parquet").is_file() or any(p.glob("step_*.tokens.parquet"))
    except OSError:
        return False


# --------------------------------------------------------------------------------------------- entries

#: Why an entry of an input tree is not read, with the one-line problem and fix (``--lenient`` skips
#: and counts it under its reason in :attr:`ReadReport.skipped_files`; strict mode stops at it).
ENTRY_PROBLEMS = {
    "unreadable_file": ("cannot read the file ({why})", "make it readable (chmod), or pass --lenient to skip and "
                        "count it"),
    "unreadable_folder": ("cannot list the folder ({why})", "make it readable (chmod), or pass --lenient to skip "
                          "and count it"),
    "broken_symlink": ("a symbolic link to {why}, which does not exist", "repair or remove the link, or pass "
                       "--lenient to skip and count it"),
    "symlink_loop": ("a symbolic link loop (it leads back to itself)", "repair or remove the link, or pass "
                     "--lenient to skip and count it"),
    "not_regular_file": ("not a regular file or folder ({why}): reading it could block or never end",
                         "copy the data into a file and point at it, or pass --lenient to skip and count it"),
}

_KINDS = {stat.S_IFIFO: "a named pipe (FIFO)", stat.S_IFSOCK: "a socket", stat.S_IFCHR: "a character device",
          stat.S_IFBLK: "a block device"}


def entry_problem(p: Path, *, listed: bool = True) -> tuple[str, str] | None:
    """Why the entry ``p`` of an input tree cannot be read, as ``(reason, why)`` (a key of
    :data:`ENTRY_PROBLEMS` and its detail), or None for a readable regular file or folder. Symbolic
    links are followed. A named pipe is a problem when ``listed`` (found in a folder: opening it
    could block forever), not when named on its own (read once as a stream, :func:`spool_stream`)."""
    try:
        st = os.stat(p)
    except OSError as e:
        if e.errno == errno.ELOOP:
            return "symlink_loop", ""
        if e.errno in (errno.ENOENT, errno.ENOTDIR) and os.path.islink(p):
            try:
                return "broken_symlink", repr(os.readlink(p))
            except OSError:
                return "broken_symlink", "a missing path"
        if e.errno in (errno.EACCES, errno.EPERM):
            return "unreadable_file", e.strerror or str(e)
        return None  # missing: the caller says so
    if stat.S_ISDIR(st.st_mode):
        try:
            with os.scandir(p) as it:
                next(it, None)
        except OSError as e:
            return "unreadable_folder", e.strerror or str(e)
        return None
    if not stat.S_ISREG(st.st_mode):
        if stat.S_ISFIFO(st.st_mode) and not listed:
            return None
        return "not_regular_file", _KINDS.get(stat.S_IFMT(st.st_mode), "not a file")
    try:
        os.close(os.open(p, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0)))
    except OSError as e:
        return "unreadable_file", e.strerror or str(e)
    return None


def entry_error(p: Path, problem: tuple[str, str], *, listed: bool = True) -> InputError:
    """The :class:`InputError` (tagged with its reason) for an :func:`entry_problem` of ``p``; an input
    named on its own (not ``listed``) is not offered ``--lenient``, which skips entries of folders."""
    reason, why = problem
    text, fix = ENTRY_PROBLEMS[reason]
    if not listed:
        fix = fix.split(", or pass --lenient")[0]
    e = InputError(text.format(why=why), path=p, fix=fix)
    e.reason = reason  # type: ignore[attr-defined]
    return e


#: Most bytes read from a pipe named as an input (``<(zcat rollouts.jsonl.gz)``, ``/dev/stdin``).
MAX_STREAM_BYTES = 8 << 30
#: Seconds a pipe named as an input is given for a writer to open it (a FIFO nobody writes to reads as
#: empty after that, instead of blocking forever).
STREAM_WAIT_S = 2.0
_STREAMS: dict[str, Path] = {}


def spool_stream(p: Path) -> Path:
    """A regular file holding what the pipe ``p`` (a FIFO, ``/dev/fd/N`` of a process substitution)
    gives until its end, read once: format detection and the reader each read the file again, which a
    pipe cannot give twice. It keeps the pipe's name (so ``rollouts.jsonl`` is still detected by its
    suffix) in a temporary folder removed at exit. The pipe is opened without blocking; one that no
    process opens for writing within :data:`STREAM_WAIT_S` seconds reads as empty.

    Raises:
        InputError: the pipe cannot be read, gives nothing, or gives more than :data:`MAX_STREAM_BYTES`.
    """
    key = str(p)
    if key in _STREAMS:
        return _STREAMS[key]
    import atexit
    import shutil
    import tempfile

    folder = Path(tempfile.mkdtemp(prefix="critic-audit-pipe-"))
    atexit.register(shutil.rmtree, folder, True)
    out = folder / (p.name or "stream")
    import select
    import time

    total = 0
    deadline = time.monotonic() + STREAM_WAIT_S
    try:
        fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK)  # never blocks, with or without a writer
        try:
            with open(out, "wb") as fh:
                while True:
                    try:
                        chunk = os.read(fd, 1 << 20)
                    except BlockingIOError:  # a writer is there, its data not yet
                        select.select([fd], [], [])
                        continue
                    if not chunk:  # end of data, or no writer yet: wait a moment for one to open the pipe
                        if total or time.monotonic() > deadline:
                            break
                        time.sleep(0.02)
                        continue
                    total += len(chunk)
                    if total > MAX_STREAM_BYTES:
                        raise InputError(f"the pipe gives more than {MAX_STREAM_BYTES >> 30} GiB", path=p,
                                         fix="write the data to a file and point at it")
                    fh.write(chunk)
        finally:
            os.close(fd)
    except OSError as e:
        raise InputError(f"cannot read the pipe ({e.strerror or e})", path=p,
                         fix="point at a file, or at a pipe that a process writes to") from None
    if total == 0:
        raise InputError("the pipe gave no data (no process wrote to it)", path=p,
                         fix="point at a file, or at a pipe that a process writes to (e.g. <(cat FILE))")
    _STREAMS[key] = out
    return out


def _head(path: Path) -> str:
    """The first characters of a text file ("" for a binary or unreadable one)."""
    try:
        with path.open("rb") as fh:
            raw = fh.read(_HEAD)
    except OSError:
        return ""
    if b"\x00" in raw:
        return ""
    return raw.decode("utf-8-sig", errors="replace")


def _has_bytes(path: Path) -> bool:
    """True when the file holds any non-whitespace byte (binary junk included)."""
    try:
        with path.open("rb") as fh:
            return bool(fh.read(_HEAD).strip())
    except OSError:
        return False


def first_record(path: Path) -> Any:
    """The first record of a JSON / JSONL file (None when there is none or it does not parse)."""
    try:
        doc = AS_JSONL if path.suffix.lower() in JSONL_SUFFIXES else load_json(path)
        if doc is AS_JSONL:
            for rec, _ in iter_jsonl(path, lenient=True):
                return rec
            return None
    except InputError:
        return None
    if isinstance(doc, list):
        if doc and isinstance(doc[0], Mapping) and isinstance(doc[0].get("role"), str):
            return doc  # a bare list of messages
        return doc[0] if doc else None
    if isinstance(doc, Mapping):
        if any(k in doc for k in MESSAGES_KEYS) or any(_sniffs(f, doc, None) for f in FORMATS.values()):
            return doc
        vals = [v for v in doc.values() if isinstance(v, (Mapping, list))]
        return vals[0] if vals and len(vals) == len(doc) else doc
    return doc


def _sniffs(fmt: Format, rec: Any, opts: ReadOptions | None) -> bool:
    sniff = getattr(fmt.reader(), "sniff_record", None)
    return bool(sniff and sniff(rec, opts or ReadOptions()))


_CACHE: dict[tuple[Any, ...], str | None] = {}


def detect_file(path: str | Path, options: ReadOptions | None = None) -> str | None:
    """The format of one file, or None when no format reads it (a stray file).

    Rules, in the registry's order: a format whose ``sniff_file`` claims the file by name or head
    (``*.traj`` -> swe; Parquet by its columns -> tables / tokenized; a Reflexion log -> react);
    then, for JSON / JSONL files, the first format whose ``sniff_record`` accepts the first record
    (token ids -> tokenized; ``schema_version`` ATIF -> atif; SWE history -> swe; Responses items ->
    responses; a transcript string -> react; a messages list -> chat). A JSON file that does not
    parse is given to chat, whose reader names the error.
    """
    p = Path(path)
    opts = options or ReadOptions()
    try:
        st = p.stat()
    except OSError:
        raise InputError("no such file or directory", path=p, fix="check the path") from None
    key = (os.path.realpath(p), st.st_mtime_ns, st.st_size, opts.messages_key)  # a file is sniffed once
    if key not in _CACHE:
        if len(_CACHE) > 4096:
            _CACHE.clear()
        try:
            _CACHE[key] = _detect_file(p, opts)
        except OSError as e:  # it opens but reading fails (EIO: /proc/self/mem, a failing disk)
            raise entry_error(p, ("unreadable_file", e.strerror or str(e))) from e
    return _CACHE[key]


def _detect_file(p: Path, opts: ReadOptions) -> str | None:
    name = p.name.lower()
    claims = claims_of(p, opts)
    if claims or not name.endswith((".json", *JSONL_SUFFIXES)):
        return _one_claim(p, claims)
    if first_record(p) is None:
        if p.suffix.lower() in JSONL_SUFFIXES:
            # no line parses: an empty file is no rollout file, a corrupt one (binary junk, torn lines)
            # is a broken rollout file, which the chat reader reports (strict) or skips and counts
            return "chat" if _head(p).strip() or _has_bytes(p) else None
        try:
            load_json(p)
        except InputError:
            return "chat"  # unreadable JSON: the chat reader reports it
    return None


def claims_of(path: str | Path, options: ReadOptions | None = None) -> list[str]:
    """Every format whose rule accepts the file, in registry order: the formats whose ``sniff_file``
    claims it by name or head (``*.traj``, an ``.eval`` zip, Parquet columns, a Reflexion log: decisive,
    the record rules are not asked), else, for a JSON / JSONL file, those whose ``sniff_record`` accepts
    its first record. :func:`claimants` of the result is who reads it (the detection confusion matrix of
    ``tests/test_detect_matrix.py``)."""
    p = Path(path)
    opts = options or ReadOptions()
    name = p.name.lower()
    head = None
    found = []
    for fmt in FORMATS.values():
        sniff = getattr(fmt.reader(), "sniff_file", None) if name.endswith(fmt.suffixes) else None
        if sniff is not None:
            head = _head(p) if head is None else head
            if sniff(p, head, opts):
                found.append(fmt.name)
    if found or not name.endswith((".json", *JSONL_SUFFIXES)):
        return found
    rec = first_record(p)
    if rec is None:
        return []
    return [fmt.name for fmt in FORMATS.values() if name.endswith(fmt.suffixes) and _sniffs(fmt, rec, opts)]


def claimants(claims: Sequence[str]) -> list[str]:
    """The formats that claim a file, from every format whose rule accepts it (``claims``, in registry
    order): fallbacks (:attr:`Format.fallback`) only when no producer-specific format accepts it, and a
    format left out where another that accepts it :attr:`Format.overrides` it."""
    specific = [c for c in claims if not FORMATS[c].fallback] or list(claims)
    return [c for c in specific if not any(c in FORMATS[o].overrides for o in specific if o != c)]


def _one_claim(p: Path, claims: list[str]) -> str | None:
    """The one format that claims ``p`` (None: none does).

    Raises:
        InputError: several producer-specific formats claim it (reason ``ambiguous_format``), naming
            them and ``--format``.
    """
    found = claimants(claims)
    if len(found) > 1:
        e = InputError(f"ambiguous: the file reads as {' and as '.join(found)} (each format's rule accepts its "
                       "first record)", path=p, fix=f"pick its format with --format {'|'.join(found)}")
        e.reason = "ambiguous_format"  # type: ignore[attr-defined]
        raise e
    return found[0] if found else None


def detect_format(path: str | Path, messages_key: str | None = None) -> str:
    """The format of a file or folder: a registered name, ``mixed`` (a folder of several conversation
    formats) or ``tables``. A file no format claims is ``chat`` (its reader names the problem).

    Raises:
        InputError: the path does not exist, or a folder holds no rollout file.
    """
    opts = ReadOptions(messages_key=messages_key)
    [res] = resolve_inputs([path], opts, ReadReport())
    return res.format


# --------------------------------------------------------------------------------------------- resolution


def _stem(path: Path) -> str:
    name = strip_compression_suffix(path.name)
    for s in _ALL_SUFFIXES:
        if name.lower().endswith(s) and len(name) > len(s):
            return name[: -len(s)]
    return Path(name).stem


def _walk(root: Path, opts: ReadOptions, report: ReadReport) -> Iterator[tuple[Path, str, Path | None]]:
    """``(path, format, origin)`` of every rollout file / table folder below ``root``, in sorted order:
    a gzip- or zstd-compressed file (told by its first 4 bytes, whatever its name) is read from its
    decompressed copy ``path``, ``origin`` naming it (None for every other file).

    Symbolic links to folders are followed (each folder once: a link back up the tree is a
    ``symlink_loop``). An entry that cannot be read (:func:`entry_problem`: an unreadable file or
    folder, a dangling link, a link loop, a named pipe, socket or device) stops the search with one
    :class:`InputError` naming it; with ``--lenient`` it is skipped and counted under its reason.

    Raises:
        InputError: an entry that cannot be read (strict mode).
    """
    def problem(entry: Path, found: tuple[str, str]) -> None:
        if not opts.lenient:
            raise entry_error(entry, found)
        report.skip_file(entry, found[0])

    def onerror(e: OSError) -> None:  # a folder os.walk cannot list
        entry = Path(e.filename) if e.filename else root
        problem(entry, entry_problem(entry) or ("unreadable_folder", e.strerror or str(e)))

    seen: set[tuple[int, int]] = set()
    for dirpath, dirnames, filenames in os.walk(root, onerror=onerror, followlinks=True):
        d = Path(dirpath)
        try:
            st = os.stat(d)
        except OSError:
            dirnames[:] = []
            continue
        if (st.st_dev, st.st_ino) in seen:  # a link back to a folder already searched
            dirnames[:] = []
            problem(d, ("symlink_loop", ""))
            continue
        seen.add((st.st_dev, st.st_ino))
        if d != root and _is_table_folder(d):
            dirnames[:] = []
            yield d, "tables", None
            continue
        dirnames[:] = sorted(n for n in dirnames if not n.startswith("."))
        for n in sorted(filenames):
            if n.startswith("."):
                continue
            f = d / n
            found = entry_problem(f)
            if found is not None:
                problem(f, found)
                continue
            got = _walk_file(f, root, opts, report)
            if got is not None:
                yield got


def _walk_file(f: Path, root: Path, opts: ReadOptions, report: ReadReport) -> tuple[Path, str, Path | None] | None:
    """``(path, format, origin)`` of one readable file the search of folder ``root`` found (see :func:`_walk`), or
    None when it is skipped (counted in ``report``) or read with others (a companion).

    Raises:
        InputError: several formats claim it, it cannot be read or decompressed (strict mode).
    """
    head = _first_bytes(f)  # one read for the Git LFS check and the compression magic
    reason = _skip_reason(f, root=root, head=head)
    if reason is not None:  # beside rollout files, not one (a Harbor agent's native log, ...)
        report.skip_file(f, reason, rows=reason == "git_lfs_pointer")
        return None
    origin, g = None, f
    try:
        if is_compressed(f, head):  # by content, as a file named on its own (a.json.gz, 00000.jsonl.zst)
            origin = f
            g = by_content(f, _ALL_SUFFIXES)
            reason = _skip_reason(g)  # the readers' content rules, on the decompressed bytes
            if reason is not None:
                report.skip_file(f, reason)
                return None
        fmt = _file_format(g, opts, explicit=False)
    except InputError as e:  # several formats claim the file, or it cannot be read: strict names
        reason = getattr(e, "reason", None) or ("unreadable_file" if origin is not None else None)  # it,
        if reason not in ("ambiguous_format", "unreadable_file") or not opts.lenient:  # lenient counts it
            raise
        report.skip_file(f, reason, rows=reason == "ambiguous_format")
        return None
    if fmt is None and _is_companion(g):
        return None  # a Harbor trial's reward, a vf-eval run's metadata.json: read with its rollouts
    if fmt is None:
        report.skip_file(f, "not_rollout_file", rows=holds_rows(g))
        return None
    return g, fmt, origin


#: Largest JSON file parsed whole to tell whether it holds record-like rows (larger: its head decides).
_ROWS_PARSE_BYTES = 64 << 20


def holds_rows(f: Path) -> bool:
    """``f`` holds record-like rows, so it may be rollouts that no reader claims: JSONL whose first record
    is an object, a JSON array of objects, or a JSON object with a list of two or more objects
    (``{"simulations": [...]}``; a run config's one-agent list is not rows) or with several objects keyed
    by id. False for anything else, or a file that cannot be read."""
    name = f.name.lower()
    if not name.endswith((".json", *JSONL_SUFFIXES)):
        return False
    try:
        big = f.stat().st_size > _ROWS_PARSE_BYTES
    except OSError:
        return False
    if name.endswith(JSONL_SUFFIXES) or big:
        head = _head(f).lstrip()
        return head.startswith("{") and ("\n{" in head or not name.endswith(".json")) or head.startswith("[{")
    try:
        doc = load_json(f)
    except InputError:
        return False
    if doc is AS_JSONL:
        return True
    if isinstance(doc, list):
        return bool(doc) and isinstance(doc[0], Mapping)
    if isinstance(doc, Mapping):
        lists = [v for v in doc.values() if isinstance(v, list) and len(v) >= 2 and all(isinstance(x, Mapping) for x in v)]
        objects = [v for v in doc.values() if isinstance(v, Mapping)]
        return bool(lists) or (len(objects) >= 2 and len(objects) == len(doc))
    return False


def _first_bytes(f: Path, n: int = 48) -> bytes:
    try:
        with f.open("rb") as fh:
            return fh.read(n)
    except OSError:
        return b""


def _skip_reason(f: Path, *, root: Path | None = None, head: bytes | None = None) -> str | None:
    """Why a file is passed over although a reader could parse it (``skip_reason`` of a reader, or a Git
    LFS pointer left where the data should be; ``root``: the folder searched, and also a reader's
    ``skip_in_folder(f, root)``, a file that search leaves out but that is read when named on its own,
    such as prime-rl's ``all/`` beside an ``effective/`` also below ``root``; asked before a compressed
    file is decompressed), or None. ``head``: the file's first 48 bytes, when already read."""
    if (_first_bytes(f) if head is None else head).startswith(b"version https://git-lfs.github.com/spec/"):
        return "git_lfs_pointer"
    for fmt in FORMATS.values():
        reader = fmt.reader()
        reason = reader.skip_reason(f) if hasattr(reader, "skip_reason") else None
        if reason is None and root is not None and hasattr(reader, "skip_in_folder"):
            reason = reader.skip_in_folder(f, root)
        if reason is not None:
            return reason
    return None


#: The one-line refusal of a file named on its own that a reader's ``skip_reason`` passes over.
_SKIP_FIX = {
    "git_lfs_pointer": ("a Git LFS pointer, not the data it stands for", "fetch the file (git lfs pull) and point at it"),
    "nemo_gym_task_inputs": ("NeMo Gym task inputs (requests without a response: the rollouts are not in this file)",
                             "point at the rollouts file that ng_collect_rollouts wrote (output_jsonl_fpath)"),
    "nemo_gym_reward_profiling": ("a NeMo Gym reward profile (per-task aggregates such as mean/reward), not rollouts",
                                  "point at the rollouts file it was computed from"),
    "harbor_native_log": ("an agent's native log inside a Harbor trial, not ATIF (the same run is in the trial's "
                          "agent/trajectory.json)", "point at agent/trajectory.json or at the job folder"),
    "harbor_traces_export": ("a Harbor traces export (conversation rows rebuilt from ATIF trajectories), not ATIF",
                             "point at the Harbor job folder (its <trial>/agent/trajectory.json files)"),
    "prime_rl_trace_index": ("a prime-rl trace index (one summary row per episode or update), not episodes",
                             "point at the episode stream beside it (monitors/file/traces/stream/) or at the run folder"),
    "prime_rl_trace_annotations": ("prime-rl trace annotations (updates folded onto traces after they arrived), "
                                   "not episodes", "point at the episode stream (monitors/file/traces/stream/)"),
    "prime_rl_live_trace": ("a prime-rl live trace (deltas of a rollout still in flight), not a finished episode",
                            "point at the episode stream (monitors/file/traces/stream/) once the rollout has landed"),
    "prime_rl_metrics": ("prime-rl's metric rows (monitors/file/metrics.jsonl), not episodes",
                         "point at the episode stream (monitors/file/traces/stream/) or at the run folder"),
    "prime_rl_chunk_being_sealed": ("a prime-rl stream chunk being compressed (.zst.tmp, incomplete)",
                                    "point at the plain chunk beside it (<n>.jsonl), or wait until it is sealed"),
}


def _is_companion(f: Path) -> bool:
    """A file read with the rollout files of some format (``is_companion_file`` of its reader)."""
    for fmt in FORMATS.values():
        hook = getattr(fmt.reader(), "is_companion_file", None)
        if hook is not None and hook(f):
            return True
    return False


def _is_zip(f: Path) -> bool:
    """``f`` is named ``.eval`` / ``.zip`` or starts with a zip's local-file signature."""
    if f.name.lower().endswith((".eval", ".zip")):
        return True
    try:
        with open(f, "rb") as fh:
            return fh.read(4) == b"PK\x03\x04"
    except OSError:
        return False


def _file_format(f: Path, opts: ReadOptions, *, explicit: bool) -> str | None:
    if opts.format == "auto":
        fmt = detect_file(f, opts)
        if fmt is None and explicit:  # read it anyway, so that its reader names the problem
            if _is_zip(f):  # no JSON reader can name what a zip is: an .eval goes to inspect, others stop here
                if f.name.lower().endswith(".eval"):
                    return "inspect"
                raise InputError("a zip archive, not a rollout file", path=f,
                                 fix="unzip it and point at the rollout files inside (an Inspect log is named .eval)")
            rec = first_record(f)
            if f.suffix.lower() not in JSONL_SUFFIXES and is_summary(rec):
                folder = f.parent
                raise InputError("this is critic-audit's own summary.json (the result of an audit), not rollouts",
                                 path=f, fix=f"pass the folder that holds it (critic-audit analyze {folder} --out NEW) "
                                             f"or re-render its report with critic-audit plot {folder}")
            return "responses" if is_responses_record(rec) else "chat"
        return fmt
    forced = FORMATS[opts.format]
    if f.name.lower().endswith(".parquet") and forced.name == "tokenized":
        return "tables" if detect_file(f, opts) == "tables" else "tokenized"  # a tokens table stays tables
    if explicit:
        return forced.name
    # a folder search reads the files of the forced format's suffixes that some format reads (an
    # ambiguous file too: --format is the choice its refusal asks for)
    if not f.name.lower().endswith(forced.suffixes):
        return None
    try:
        return forced.name if detect_file(f, opts) is not None else None
    except InputError as e:
        if getattr(e, "reason", None) == "ambiguous_format":
            return forced.name
        raise


def _no_rollout_file(folder: Path, skipped: list[dict[str, Any]]) -> InputError:
    """The error for a folder whose search found no rollout file: the files it passed over named (the
    first three, those holding record-like rows first, then their count) with the reason of each, and
    a --format hint when some hold record-like rows."""
    ordered = sorted(skipped, key=lambda f: (not f.get("rows"), str(f.get("path"))))
    shown = ", ".join(f"{os.path.relpath(str(f['path']), folder)} ({f['reason']}"
                      + (", record-like rows" if f.get("rows") else "") + ")" for f in ordered[:3])
    more = f" and {len(ordered) - 3} more" if len(ordered) > 3 else ""
    said = f"{len(ordered)} other file(s) skipped: {shown}{more}" if ordered else "no file in it"
    fix = ("these rows may be rollouts of a format not recognised: pick it with --format (docs/input_formats.md)"
           if any(f.get("rows") for f in ordered) else
           "point at rollout files (docs/input_formats.md), or pick the format with --format")
    return InputError(f"the folder holds no rollout file ({said})", path=folder, fix=fix)


def resolve_inputs(paths: list[str | Path] | tuple[str | Path, ...], options: ReadOptions | None = None,
                   report: ReadReport | None = None) -> list[ResolvedInput]:
    """Resolve every input once: its files, each with format, kind, collection and label.

    Raises:
        InputError: a path does not exist, or a folder holds no file any format reads.
    """
    opts = options or ReadOptions()
    rep = report if report is not None else ReadReport()
    found: list[tuple[int, Path, str, Path | None]] = []  # (input, file, format, origin)
    for i, raw in enumerate(paths):
        p = Path(raw)
        found_problem = entry_problem(p, listed=False)
        if found_problem is not None:
            raise entry_error(p, found_problem, listed=False)
        if not os.path.exists(p):
            raise InputError("no such file or directory", path=p, fix="check the path")
        if stat.S_ISFIFO(os.stat(p).st_mode):  # a pipe named on its own: read once, as a stream
            p = spool_stream(p)
            rep.notes["inputs_read_from_a_pipe"] += 1
        if p.is_dir() and _is_table_folder(p):
            found.append((i, p, "tables", None))
            continue
        if p.is_dir():
            before = len(rep.skipped_file_list)
            files = list(_walk(p, opts, rep))
            if not files:
                raise _no_rollout_file(p, rep.skipped_file_list[before:])
            found.extend((i, f, fmt, origin) for f, fmt, origin in files)
        else:
            named, p = p, by_content(p, _ALL_SUFFIXES)  # compressed, or no suffix telling the format
            reason = _skip_reason(p) if opts.format == "auto" else None
            if reason is None and opts.format == "auto" and p.suffix.lower() in (".csv", ".tsv"):
                raise InputError("CSV is not a rollout format", path=p,
                                 fix="write the rollouts as JSON, JSONL or Parquet in one of the formats critic-audit "
                                     f"reads ({', '.join(f.name for f in FORMATS.values() if f.selectable)}; "
                                     "docs/input_formats.md)")
            if reason is not None:
                problem, fix = _SKIP_FIX.get(reason, (f"not a rollout file ({reason})", "pick the format with --format"))
                raise InputError(problem, path=p, fix=fix)
            found.append((i, p, _file_format(p, opts, explicit=True) or "chat", named if p != named else None))
    # named after the user's files (a decompressed copy after the file it came from)
    names = _names([(Path(paths[i]), origin or f, fmt) for i, f, fmt, origin in found], opts)
    out = [ResolvedInput(Path(p)) for p in paths]
    for (i, f, fmt, origin), (source, label) in zip(found, names):
        reader = FORMATS[fmt].reader()
        kind = reader.file_kind(f, opts) if hasattr(reader, "file_kind") else FORMATS[fmt].kind
        out[i].files.append(FileSpec(f, fmt, source, label, kind, origin))
    if not opts.lenient:
        _refuse_one_export_twice(out)
    for r in out:
        rep.formats[str(r.path)] = r.format
    return out


def _refuse_one_export_twice(resolved: list[ResolvedInput]) -> None:
    """One line when two files read are the same export's overlapping subsets (a reader's
    ``same_episodes_as``: prime-rl's ``all/`` and ``effective/`` traces of one step, both named).

    Raises:
        InputError: naming both files and which to pass.
    """
    read = {os.path.realpath(s.origin or s.path) for r in resolved for s in r.files}
    for r in resolved:
        for s in r.files:
            hook = getattr(FORMATS[s.format].reader(), "same_episodes_as", None)
            twin = hook(Path(s.origin or s.path)) if hook is not None else None
            if twin is not None and os.path.realpath(twin[0]) in read:
                raise InputError(f"holds the same episodes as {twin[0]} (two subsets of one export, both given)",
                                 path=s.origin or s.path, fix=twin[1])


def _names(files: list[tuple[Path, Path, str]], opts: ReadOptions) -> list[tuple[str, str]]:
    """``(source, label)`` of every file (see the module docstring)."""
    stems = [_stem(f) if not f.is_dir() else f.name for _, f, _ in files]
    by_stem = Counter(stems)
    sources = []
    for (root, f, fmt), stem in zip(files, stems):
        collection = getattr(FORMATS[fmt].reader(), "collection_of", None)
        named = collection(f, root) if collection is not None else None  # None: named as any other file
        if named is not None:
            sources.append(named)
        elif by_stem[stem] == 1:
            sources.append(_nemo_env(f) or stem)
        else:
            sources.append(_distinguishing(f, [g for (_, g, _), s in zip(files, stems) if s == stem]) or stem)
    by_source = Counter(sources)
    labels = [source if by_source[source] == 1 else _relative(f, root) for (root, f, _), source in zip(files, sources)]
    by_label = Counter(labels)  # a.json beside a.jsonl: the file name tells them apart
    labels = [lab if by_label[lab] == 1 else str(PurePosixPath(lab).parent / f.name).removeprefix("./")
              for lab, (_, f, _) in zip(labels, files)]
    return [(opts.source if opts.source is not None else source, label) for source, label in zip(sources, labels)]


def _nemo_env(f: Path) -> str | None:
    """The environment of a NeMo Gym rollout file (``resources_servers/<env>/data/example_rollouts.jsonl``,
    ``example_<x>_rollouts.jsonl``): its nearest folder with a non-generic name, or None for any other
    file. NeMo Gym names every environment's file the same, so the stem names no collection."""
    stem = _stem(f)
    if f.is_dir() or not (stem.startswith("example") and stem.endswith("rollouts")):
        return None
    for parent in f.resolve().parents:
        if parent.name and parent.name.lower() not in GENERIC_DIRS:
            return parent.name
    return None


def _distinguishing(f: Path, group: list[Path]) -> str:
    """The folders of ``f`` below the common folder of ``group``, generic names left out."""
    common = Path(os.path.commonpath([g.parent.resolve() for g in group]))
    rel = f.parent.resolve().relative_to(common).parts
    parts = [x for x in rel if x.lower() not in GENERIC_DIRS] or list(rel)
    return "/".join(parts)


def _relative(f: Path, root: Path) -> str:
    """``f`` relative to its input (the input's own name for a file input), suffix dropped."""
    if f == root or not root.is_dir():
        return _stem(f)
    rel = PurePosixPath(*f.relative_to(root).parts)
    return str(rel.parent / _stem(f)) if str(rel.parent) != "." else _stem(f)


# --------------------------------------------------------------------------------------------- reading


def read_conversations(spec: FileSpec, options: ReadOptions, report: ReadReport) -> Iterator[Conversation]:
    """The conversations of one file, read by its format's reader; ``--labels`` joined for the formats
    that do not join them themselves."""
    reader = FORMATS[spec.format].reader()
    it = _read_errors_named(reader.read_file(spec, options, report), Path(spec.path))
    if options.labels is not None and not getattr(reader, "JOINS_LABELS", False):
        it = _apply_labels(it, options)
    return it


def _read_errors_named(convs: Iterator[Conversation], path: Path) -> Iterator[Conversation]:
    """``convs``, an OSError raised while reading (EIO past a successful open) turned into the file's
    ``unreadable_file`` :class:`InputError` naming ``path`` (``--lenient`` skips and counts the file)."""
    try:
        yield from convs
    except OSError as e:
        raise entry_error(path, ("unreadable_file", e.strerror or str(e))) from e


def _apply_labels(convs: Iterator[Conversation], opts: ReadOptions) -> Iterator[Conversation]:
    """Join ``--labels`` onto conversations (the key: the metadata field ``labels_key`` when present,
    else the trajectory id); ids the file does not know are left alone."""
    from critic_audit.io.labels import load_labels

    labels = load_labels(opts.labels, opts.labels_key)
    for c in convs:
        key = c.metadata.get(opts.labels_key) if opts.labels_key else None
        label = labels.get(str(key) if key is not None else c.trajectory_id)
        if label is not None:
            c.success = label
            if c.reward is None:
                c.reward = 1.0 if label else 0.0
        yield c


def group_scope(spec: FileSpec) -> str:
    """Where the group ids of the file ``spec`` are numbered: its collection (``spec.source``) for a format
    whose groups span its files (the reader sets ``GROUPS_SPAN_FILES = True``; by default a reader that
    defines ``collection_of``: the trials of one Harbor job share their task's group), else the file
    itself (``spec.label``): task k of one NeMo Gym rollouts file is not task k of another. A reader
    that names its collection but numbers its groups per file sets ``GROUPS_SPAN_FILES = False``."""
    reader = FORMATS[spec.format].reader()
    spans = getattr(reader, "GROUPS_SPAN_FILES", hasattr(reader, "collection_of"))
    return spec.source if spans else spec.label


def file_qualified(values: Sequence[str | None], scopes: Sequence[str]) -> list[str | None]:
    """The one id policy of ``analyze`` and ``check``: ``values[i]`` (a trajectory or group id read in
    the file or collection ``scopes[i]``) unchanged when every scope it is found in is the same, else
    ``{scopes[i]}/{values[i]}``; None stays None. Pure: ``file_qualified(["0", "0", "1"], ["a", "b",
    "a"]) == ["a/0", "b/0", "1"]``."""
    where: dict[str, set[str]] = {}
    for v, s in zip(values, scopes):
        if v is not None:
            where.setdefault(v, set()).add(s)
    return [v if v is None or len(where[v]) == 1 else f"{s}/{v}" for v, s in zip(values, scopes)]


def apply_id_policy(items: Sequence[Any], specs: Sequence[FileSpec], report: ReadReport | None = None, *,
                    lenient: bool = False) -> list[int]:
    """Qualify, in place, the ``trajectory_id`` of every item (a :class:`Conversation`, a check rollout)
    found in more than one file as ``{file label}/{id}`` and its ``group_id`` found in more than one
    :func:`group_scope` as ``{scope}/{group}`` (:func:`file_qualified`; ``specs[i]``: the file of
    ``items[i]``). The file's own id is kept in ``metadata['id_in_file']`` (``group_in_file``) where the
    item has a metadata dict. Counts go to ``report.notes``.

    A trajectory found with the same id and content in two files (two copies of one export) is refused,
    or with ``lenient`` kept once: the later copies are left out of the id policy (the kept copy keeps its
    id and group) and their positions returned for the caller to drop, counted as
    ``duplicate_trajectories`` in ``report.notes`` (:func:`critic_audit.io.copies.refuse_or_note_copies`).

    Returns:
        The sorted positions in ``items`` of the copies to drop (empty without copies).

    Raises:
        InputError: a trajectory repeated with the same id and content in another file (not lenient).
    """
    drop = refuse_or_note_copies(items, specs, lenient, report)
    gone = set(drop)
    keep = [i for i in range(len(items)) if i not in gone]
    kept_items, kept_specs = [items[i] for i in keep], [specs[i] for i in keep]
    tids = file_qualified([x.trajectory_id for x in kept_items], [s.label for s in kept_specs])
    gids = file_qualified([x.group_id for x in kept_items], [group_scope(s) for s in kept_specs])
    n = g = 0
    for x, tid, gid in zip(kept_items, tids, gids):
        meta = getattr(x, "metadata", None)
        if tid != x.trajectory_id:
            if isinstance(meta, dict):
                meta.setdefault("id_in_file", x.trajectory_id)
            x.trajectory_id, n = tid, n + 1
        if gid != x.group_id:
            if isinstance(meta, dict):
                meta.setdefault("group_in_file", x.group_id)
            x.group_id, g = gid, g + 1
    if report is not None:
        if n:
            report.notes["trajectory_ids_qualified_with_file"] += n
        if g:
            report.notes["group_ids_qualified_with_file"] += g
    return drop


def kept_after_id_policy(items: Sequence[Any], specs: Sequence[FileSpec], report: ReadReport | None = None, *,
                         lenient: bool = False) -> list[Any]:
    """:func:`apply_id_policy` on ``items`` (ids qualified in place), then the items it keeps, in their
    order: the copies it drops (``lenient``) left out, the others the same objects.

    Raises:
        InputError: as :func:`apply_id_policy`.
    """
    gone = set(apply_id_policy(items, specs, report, lenient=lenient))
    return [x for i, x in enumerate(items) if i not in gone] if gone else list(items)


def qualify_ids(convs: list[Conversation], labels: list[str]) -> int:
    """Qualify every trajectory id found in more than one file as ``{label}/{id}`` (``labels[i]``:
    the file label of ``convs[i]``), keeping the file's own id in ``metadata['id_in_file']``.
    Returns the number of ids changed (groups: :func:`apply_id_policy`)."""
    n = 0
    for c, tid in zip(convs, file_qualified([c.trajectory_id for c in convs], labels)):
        if tid != c.trajectory_id:
            c.metadata.setdefault("id_in_file", c.trajectory_id)
            c.trajectory_id, n = tid, n + 1
    return n


def iter_conversations(path: str | Path, fmt: str | None = None, options: ReadOptions | None = None,
                       report: ReadReport | None = None) -> Iterator[Conversation]:
    """Yield the conversations of one input (file or folder) read as ``fmt`` (None or ``auto``:
    detected per file), ids unique across its files (:func:`qualify_ids`). Strict mode raises
    :class:`InputError` at the first bad record; lenient mode skips and counts in ``report``.

    Raises:
        InputError: a missing path, a bad record (strict mode), or a table input.
    """
    import dataclasses

    opts = options or ReadOptions()
    if fmt not in (None, "auto", "mixed"):
        opts = dataclasses.replace(opts, format=fmt)
    rep = report if report is not None else ReadReport()
    [res] = resolve_inputs([path], opts, rep)
    tables = [f for f in res.files if f.kind == "tables"]
    if tables:
        raise InputError(f"this input holds {tables[0].format} data, not conversations", path=tables[0].path,
                         fix="pass it to analyze as a table input, or force another --format")
    convs: list[Conversation] = []
    specs: list[FileSpec] = []
    for spec in res.files:
        for c in read_conversations(spec, opts, rep):
            convs.append(c)
            specs.append(spec)
    return iter(kept_after_id_policy(convs, specs, rep, lenient=opts.lenient))


def is_table_format(fmt: str) -> bool:
    return fmt in TABLE_FORMATS


def format_readers(fmt: str, what: str) -> tuple[Callable[..., Iterator[Any]], Callable[..., list[Any]]]:
    """The public pair ``(iter_<fmt>, read_<fmt>)`` of a format registered as ``fmt`` in
    :mod:`critic_audit.io.formats`: ``iter(path, options=None, report=None)`` yields the
    :class:`critic_audit.schema.Conversation` of a ``what`` file or folder, one file at a time
    (:func:`iter_conversations`); ``read`` returns them as a list.

    Raises (when called):
        InputError: a missing path, or a bad record (strict mode), as the format's ``read_file``.
    """
    def iter_fmt(path: str | Path, options: ReadOptions | None = None, report: ReadReport | None = None) -> Iterator[Any]:
        return iter_conversations(path, fmt, options, report)

    def read_fmt(path: str | Path, options: ReadOptions | None = None, report: ReadReport | None = None) -> list[Any]:
        return list(iter_fmt(path, options, report))

    iter_fmt.__name__, read_fmt.__name__ = f"iter_{fmt}", f"read_{fmt}"
    iter_fmt.__qualname__, read_fmt.__qualname__ = iter_fmt.__name__, read_fmt.__name__
    iter_fmt.__doc__ = f"Yield the conversations of a {what} file or folder, one file at a time (see read_file)."
    read_fmt.__doc__ = f"Read every conversation of a {what} file or folder (see iter_{fmt})."
    return iter_fmt, read_fmt
