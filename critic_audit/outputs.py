"""Safe output: atomic files, atomic folders, and a manifest of what the tool wrote.

Every folder critic-audit writes (an ``analyze`` output, a critic folder, a training run folder and its
checkpoints and rollout tables) holds :data:`MANIFEST`, a JSON file naming the tool, its version, the
kind of folder, every file it wrote (``files``), the folders it owns (``dirs``: e.g. ``plots``, whose
figures a rerun or ``critic-audit plot`` replaces) and the files it wrote in each (``dir_files``; a
folder without that record, such as a training run's ``checkpoints/``, is owned whole). The manifest is
the only proof of ownership: a file not listed (nor inside a folder owned whole) was not written by
critic-audit and is never replaced or removed, with or without ``--overwrite``, also inside ``plots/``.
A rerun that writes no plots (``--no-plots``) removes the figures the earlier run wrote.

- :func:`atomic_write` / :func:`atomic_write_text`: a file written to a temporary sibling, flushed and
  renamed over the target (a reader sees the old file or the new one, never a part).
- :func:`staging` + :func:`publish`: a folder built in a temporary sibling ``.<name>.tmp-XXXX`` (which
  carries a marker naming this process) and renamed into place. An existing folder is swapped out
  only when everything in it is the tool's; its files are then removed by its manifest. With
  ``overwrite`` a folder holding other files is written into file by file (each atomically), next to
  the files that are not the tool's; a clash with one of those is refused.
- :func:`clean_stale`: temporary and swapped-out folders of a killed run (the process named in their
  marker is gone) are removed before the next publish.
- :func:`refuse_input_clash`: an output that is (or holds) an input, or replaces a file inside an input
  folder, is refused even with ``--overwrite`` (every command that writes calls it).
- :func:`check_out_path`: ``/``, the home folder, the current folder (``.``, an empty path) and their
  parents, and symlink loops are refused with one clean line.
- :func:`lock_folder`: one process at a time per output folder (``train --out``, ``analyze --out``):
  an OS lock (``fcntl.flock`` through the ``filelock`` package) on a hidden ``.<name>.lock`` next to the
  folder, which records the holder's pid, host and command and is removed on release. A second
  process is refused at once; the kernel releases the lock when its holder ends, even by ``kill -9``, so
  the file a killed run leaves never blocks the next one.

Errors are :class:`critic_audit.errors.ConfigError` (a path the tool refuses to write) naming the path
and the fix.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import socket
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path, PurePosixPath
from typing import Any

import filelock

from critic_audit.version import __version__
from critic_audit.errors import ConfigError

__all__ = [
    "MANIFEST",
    "OWNED_KEY",
    "TOOL",
    "atomic_write",
    "atomic_write_text",
    "check_out_path",
    "check_owned_file",
    "check_writable",
    "check_replaceable",
    "clean_stale",
    "foreign_entries",
    "is_ours",
    "lock_folder",
    "lock_path",
    "publish",
    "read_manifest",
    "refuse_input_clash",
    "remove_owned",
    "staging",
    "update",
    "write_manifest",
    "write_owned_parquet",
]

#: The manifest file at the top of every folder the tool writes.
MANIFEST = "critic-audit-manifest.json"
TOOL = "critic-audit"
#: Marker inside a staging folder: the process that made it (pid, host).
STAGING_MARKER = ".critic-audit-staging"
#: Name prefix of a staging folder made inside the output folder (:func:`staging` with ``inside``).
INSIDE_STAGING = ".critic-audit.tmp-"


# --------------------------------------------------------------------------------------------- paths


def check_out_path(path: str | Path, *, option: str = "--out", example: str = "audit_out") -> Path:
    """``path`` resolved (``~`` expanded, symlinks followed), refusing paths no output may replace.
    ``example`` is the path the fix suggests (a folder for a folder option, a file name for a file option).

    Raises:
        ConfigError: an empty path ("is empty"), a file option's path ending in ``/`` (a folder), ``.``
            (the current folder), ``/``, the home folder, a folder
            that holds the current or the home folder, a symlink loop, or an unresolvable path.
    """
    raw = str(path)
    kind = "a file" if Path(example).suffix else "a folder"
    if not raw.strip():
        raise ConfigError(f"{option} is empty ({raw!r}); it names the {kind[2:]} to write",
                          fix=f"pass {kind} of its own, e.g. {option} {example}")
    if kind == "a file" and raw.rstrip().endswith(("/", os.sep)) and raw.strip().strip("/" + os.sep):
        raise ConfigError(f"{option} {raw} ends in '/', so it names a folder; this option names a file",
                          fix=f"pass a file name, e.g. {option} {raw.rstrip().rstrip('/' + os.sep)}/{example}")
    if raw.strip() == ".":
        raise ConfigError(f"{option} {raw!r} is the current folder; critic-audit writes into a folder of its own",
                          fix=f"pass {kind} of its own, e.g. {option} {example}")
    try:
        p = Path(raw).expanduser().resolve(strict=False)
    except RuntimeError:  # symlink loop (Python < 3.13)
        raise ConfigError(f"{option} {raw} is (or runs through) a symlink loop",
                          fix="remove the symlink loop or pass another path") from None
    except OSError as e:  # symlink loop (Python >= 3.13), permission
        raise ConfigError(f"{option} {raw} cannot be resolved ({e.strerror or e})",
                          fix="remove the symlink loop or pass another path") from None
    if _is_loop(Path(raw).expanduser()):
        raise ConfigError(f"{option} {raw} is a symlink loop", fix="remove the symlink loop or pass another path")
    if p == Path(p.anchor):
        raise ConfigError(f"{option} {raw} is the filesystem root", fix=f"pass {kind} of its own, e.g. {option} {example}")
    guarded = {"your home folder": _safe_resolve(Path.home()), "the current folder": _safe_resolve(Path.cwd())}
    for what, g in guarded.items():
        if g is not None and (p == g or p in g.parents):
            which = what if p == g else f"a parent of {what}"
            raise ConfigError(f"{option} {raw} is {which}; critic-audit writes into a folder of its own",
                              fix=f"pass {kind} of its own, e.g. {option} {g / example}")
    return p


def _safe_resolve(p: Path) -> Path | None:
    try:
        return p.resolve()
    except (OSError, RuntimeError):
        return None


def _is_loop(p: Path) -> bool:
    """A symlink (at ``p`` or one of its parents) that never resolves to a real path."""
    try:
        os.stat(p)
    except OSError as e:
        return e.errno == 40  # ELOOP
    return False


def _rel_ok(rel: Any) -> bool:
    """A manifest entry: a relative POSIX path without ``..``, not absolute, not the manifest."""
    if not isinstance(rel, str) or not rel or "\\" in rel or "\x00" in rel:
        return False
    pp = PurePosixPath(rel)
    return not pp.is_absolute() and ".." not in pp.parts and "." not in pp.parts and rel != MANIFEST


def _inside(folder: Path, target: Path) -> bool:
    """``target``'s parent, with symlinks followed, lies inside ``folder`` (no escape through a link)."""
    base = os.path.realpath(folder)
    parent = os.path.realpath(target.parent)
    return parent == base or parent.startswith(base + os.sep)


# --------------------------------------------------------------------------------------------- files


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write(path: str | Path, write: Callable[[Path], None], *, fsync: bool = True) -> Path:
    """Call ``write(tmp)`` on a temporary sibling of ``path`` (``.<name>.tmp-XXXX``), flush it to disk
    and rename it over ``path``: a reader sees the old file or the new one, a kill leaves the old one.
    The file gets the permissions of one made with ``open`` (mkstemp's are private).

    Raises:
        ConfigError: the parent folder cannot be created or written.
    """
    p = Path(path)
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(prefix=f".{p.name}.tmp-", dir=p.parent)
    except OSError as e:
        raise ConfigError(f"cannot write ({e.strerror or e})", path=p, fix="choose a writable path") from None
    os.close(fd)
    tmp = Path(name)
    try:
        write(tmp)
        os.chmod(tmp, 0o666 & ~_umask())
        if fsync:
            with open(tmp, "rb") as fh:
                os.fsync(fh.fileno())
        os.replace(tmp, p)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return p


def atomic_write_text(path: str | Path, text: str) -> Path:
    """Write UTF-8 ``text`` to ``path`` atomically (:func:`atomic_write`)."""
    return atomic_write(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))


def write_json(path: str | Path, obj: Any) -> Path:
    """``obj`` as indented JSON (NaN refused), written atomically."""
    return atomic_write_text(path, json.dumps(obj, indent=2, default=str, allow_nan=False) + "\n")


# --------------------------------------------------------------------------------------------- manifests


def read_manifest(folder: str | Path) -> dict[str, Any] | None:
    """The folder's manifest when it is a valid one of this tool, else None (missing, unreadable,
    another tool's, or an entry that leaves the folder)."""
    f = Path(folder) / MANIFEST
    try:
        if f.is_symlink() or not f.is_file():
            return None
        m = json.loads(f.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(m, dict) or m.get("tool") != TOOL:
        return None
    files, dirs = m.get("files"), m.get("dirs", [])
    if not isinstance(files, list) or not isinstance(dirs, list):
        return None
    if not all(_rel_ok(x) for x in (*files, *dirs)):
        return None
    rec = m.get("dir_files", {})
    if not isinstance(rec, dict) or not all(
            d in dirs and isinstance(fs, list) and all(_rel_ok(f) and f.startswith(d + "/") for f in fs)
            for d, fs in rec.items()):
        return None
    return m


def dir_files(manifest: dict[str, Any], d: str) -> set[str] | None:
    """The files the tool wrote inside owned folder ``d`` (relative to the manifest's folder), or None
    when the manifest does not record them (an older manifest: the folder is then the tool's whole)."""
    rec = (manifest.get("dir_files") or {}).get(d)
    return None if rec is None else set(rec)


def _walk_files(folder: Path) -> list[str]:
    out = []
    for dirpath, _dirs, files in os.walk(folder):
        rel = Path(dirpath).relative_to(folder)
        for f in files:
            r = (rel / f).as_posix()
            if r not in (MANIFEST, STAGING_MARKER):
                out.append(r)
    return sorted(out)


def write_manifest(folder: str | Path, kind: str, *, dirs: Sequence[str] = (), extra: dict[str, Any] | None = None,
                   files: Sequence[str] | None = None, whole: Sequence[str] | None = None) -> dict[str, Any]:
    """Write ``folder``'s manifest: tool, version, ``kind``, every file below it (or ``files``), the
    owned folders ``dirs`` and the files the tool wrote in each (``dir_files``: an owned folder's other
    files are not the tool's and are never removed). The folders of ``whole`` (by default, with
    ``files`` given, those none of whose files is listed, e.g. a training run's ``checkpoints/``) are
    owned whole, files unrecorded. Returns it."""
    folder = Path(folder)
    owned = [d for d in dirs if (folder / d).is_dir() or files is not None]
    every = sorted(files) if files is not None else _walk_files(folder)
    listed = [f for f in every if not any(f.startswith(d + "/") for d in owned)]
    inside = {d: [f for f in every if f.startswith(d + "/")] for d in owned}
    # a folder given without any of its files (the trainer's checkpoints/, rollouts/) is owned whole
    record = [d for d in owned if d not in whole] if whole is not None else \
        [d for d in owned if files is None or inside[d]]
    m = {"tool": TOOL, "version": __version__, "kind": kind, "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
         "files": listed, "dirs": sorted(owned), "dir_files": {d: inside[d] for d in sorted(record)}, **(extra or {})}
    _save_manifest(folder, m)
    return m


def _save_manifest(folder: Path, m: dict[str, Any]) -> None:
    atomic_write_text(folder / MANIFEST, json.dumps(m, indent=1) + "\n")


OWNED_KEY = b"critic_audit.kind"
"""Parquet key-value metadata that marks a single file written by critic-audit (``monitor --out``)."""


def _parquet_kind(path: Path) -> str | None:
    try:
        import pyarrow.parquet as pq

        meta = pq.read_schema(path).metadata or {}
    except Exception:  # noqa: BLE001 - not a Parquet file (or unreadable): not ours
        return None
    v = meta.get(OWNED_KEY)
    return v.decode() if v else None


def check_owned_file(path: str | Path, *, kind: str, overwrite: bool = False, option: str = "--out") -> Path:
    """``path`` resolved, when critic-audit may write its single output file (of ``kind``) there.

    ``path`` must end in ``.parquet`` (the file is Parquet; a ``.csv`` name would mislabel it).
    A missing path is fine; an existing one only when it carries the tool's Parquet mark of that
    ``kind`` (a file of another kind, e.g. an audit folder's own ``trajectories.parquet``, only with
    ``overwrite``), or ``overwrite``. What the command reads is never replaced: see
    :func:`refuse_input_clash`. A path inside a folder critic-audit wrote (one with its manifest, e.g. an
    audit folder) is refused: ``analyze --out FOLDER --overwrite`` replaces that folder whole.

    Raises:
        ConfigError: ``path`` is a folder, does not end in ``.parquet``, is ``/`` or another path :func:`check_out_path` refuses,
            cannot be created (:func:`check_writable`), is inside a folder critic-audit wrote, or is a file
            critic-audit did not write (fix: another path, or ``overwrite``).
    """
    return _owned_target(path, kind, overwrite, option)[0]


def _owned_target(path: str | Path, kind: str, overwrite: bool, option: str) -> tuple[Path, dict[str, Any] | None]:
    """:func:`check_owned_file`'s path and the manifest of its folder (None if it has none)."""
    raw = str(path)
    p = check_out_path(path, option=option, example="turn_scores.parquet")
    if p.is_dir():
        raise ConfigError(f"{option} {raw} is a folder; this option names a Parquet file",
                          fix=f"pass a file path, e.g. {option} {Path(raw) / 'turn_scores.parquet'}")
    if p.suffix.lower() != ".parquet":
        raise ConfigError(f"{option} {raw} does not end in .parquet; this option writes a Parquet file",
                          fix=f"pass e.g. {option} {p.with_suffix('.parquet').name} (polars.read_parquet(...)"
                              ".write_csv(...) converts it to CSV)")
    check_writable(p, option=option)  # before the work: a parent that is a file, a read-only folder
    m = read_manifest(p.parent)
    if m is not None:  # analyze --out FOLDER --overwrite replaces that folder whole: the file would go with it
        raise ConfigError(f"{option} {raw} is inside {p.parent}, a folder critic-audit wrote (its {MANIFEST}), "
                          "which a later analyze --overwrite replaces whole", fix=f"pass a path outside {p.parent}, "
                          f"e.g. {option} {p.parent.parent / p.name}")
    if p.exists() and not (overwrite or _parquet_kind(p) == kind):  # an audit's own tables are another kind
        raise ConfigError(f"{option} {raw} exists and is not a file critic-audit wrote, so it is not replaced "
                          "without --overwrite", fix=f"pass another path, or --overwrite to replace {p.name}")
    return p, m


def write_owned_parquet(df: Any, path: str | Path, *, kind: str, overwrite: bool = False,
                        option: str = "--out") -> Path:
    """Write the polars DataFrame ``df`` to the Parquet file ``path`` atomically, marked as critic-audit's
    (key-value metadata ``critic_audit.kind = kind``), never over a file the tool did not write
    (:func:`check_owned_file`; never inside a folder critic-audit wrote).

    Raises:
        ConfigError: as :func:`check_owned_file`.
    """
    import pyarrow.parquet as pq

    p = _owned_target(path, kind, overwrite, option)[0]
    table = df.to_arrow()
    table = table.replace_schema_metadata({**(table.schema.metadata or {}), OWNED_KEY: kind.encode()})
    atomic_write(p, lambda tmp: pq.write_table(table, tmp))
    return p


def _ancestors(rels: Sequence[str]) -> set[str]:
    out: set[str] = set()
    for r in rels:
        parts = PurePosixPath(r).parts
        for i in range(1, len(parts)):
            out.add("/".join(parts[:i]))
    return out


def foreign_entries(folder: str | Path, manifest: dict[str, Any] | None = None, limit: int = 3) -> list[str]:
    """Up to ``limit`` entries of ``folder`` the tool did not write (not in its manifest, not inside a
    folder it owns); ``[]`` when everything is the tool's. Without a manifest every entry is foreign.
    A symlinked folder is foreign (the tool never writes links)."""
    folder = Path(folder)
    m = manifest if manifest is not None else read_manifest(folder)
    if m is None:
        names = []
        with contextlib.suppress(OSError), os.scandir(folder) as it:
            for e in it:
                if e.name.startswith(INSIDE_STAGING):
                    continue  # this tool's staging folder (staging(inside=True))
                names.append(e.name + ("/" if e.is_dir(follow_symlinks=False) else ""))
                if len(names) >= limit:
                    break
        return sorted(names)
    owned = {d for d in m.get("dirs", []) if dir_files(m, d) is None}  # owned whole: not walked
    files = set(m["files"]).union(*(dir_files(m, d) or set() for d in m.get("dirs", [])))
    parents = _ancestors([*files, *owned]) | (set(m.get("dirs", [])) - owned)
    bad: list[str] = []
    for dirpath, dirnames, filenames in os.walk(folder):
        rel = Path(dirpath).relative_to(folder).as_posix()
        rel = "" if rel == "." else rel
        keep = []
        for d in sorted(dirnames):
            r = f"{rel}/{d}" if rel else d
            if not rel and d.startswith(INSIDE_STAGING):
                continue  # this tool's staging folder (staging(inside=True))
            if os.path.islink(os.path.join(dirpath, d)):
                bad.append(r)
            elif r in owned:
                continue  # owned whole: not walked
            elif r in parents:
                keep.append(d)
            else:
                bad.append(r + "/")
        dirnames[:] = keep
        for f in sorted(filenames):
            r = f"{rel}/{f}" if rel else f
            if r not in files and r != MANIFEST and not (not rel and f.startswith(INSIDE_STAGING)):
                bad.append(r)
        if len(bad) >= limit:
            break
    return bad[:limit]


def _remove_dir_files(folder: Path, m: dict[str, Any], d: str) -> None:
    """Remove what the tool wrote in owned folder ``d`` (its recorded files; the whole folder when the
    manifest records none), then the folders left empty. A file the tool did not write stays."""
    rec = dir_files(m, d)
    if rec is None:
        shutil.rmtree(folder / d, ignore_errors=True)
        return
    for f in rec:
        p = folder / f
        if _inside(folder, p) and (p.is_file() or p.is_symlink()):
            p.unlink(missing_ok=True)
    for sub in sorted({d, *_ancestors(sorted(rec))} - _ancestors([d]), key=lambda x: -x.count("/")):
        with contextlib.suppress(OSError):
            (folder / sub).rmdir()  # only when empty


def is_ours(folder: str | Path) -> bool:
    """``folder`` holds a manifest of this tool and nothing the tool did not write."""
    m = read_manifest(folder)
    return m is not None and not foreign_entries(folder, m, limit=1)


def remove_owned(folder: str | Path) -> bool:
    """Remove what ``folder``'s manifest names (its files and owned folders), then the folders left
    empty, then ``folder`` itself when empty. Nothing else is touched: a file the tool did not write
    stays, and so does its folder. Returns True when ``folder`` is gone."""
    folder = Path(folder)
    m = read_manifest(folder)
    if m is None:
        return not folder.exists()
    for d in m.get("dirs", []):
        p = folder / d
        if not _inside(folder, p):
            continue
        if p.is_symlink():
            p.unlink()
        elif p.is_dir():
            _remove_dir_files(folder, m, d)
    for f in m["files"]:
        p = folder / f
        if _inside(folder, p) and (p.is_symlink() or p.is_file()):
            p.unlink(missing_ok=True)
    (folder / MANIFEST).unlink(missing_ok=True)
    for d in sorted(_ancestors([*m["files"], *m.get("dirs", [])]), key=lambda s: -s.count("/")):
        with contextlib.suppress(OSError):
            (folder / d).rmdir()  # only when empty
    with contextlib.suppress(OSError):
        folder.rmdir()
    return not folder.exists()


# --------------------------------------------------------------------------------------------- folders


def check_replaceable(out: Path, *, overwrite: bool = False, option: str = "--out", writes: Sequence[str] = ()) -> None:
    """Refuse an existing ``out`` that is a file, or a folder holding files the tool did not write
    (unless ``overwrite``: then they are kept and the output is written next to them, and only a clash
    with one of the top-level names in ``writes`` is refused; :func:`publish` checks every path).

    Raises:
        ConfigError: as above.
    """
    if out.is_symlink() and not out.exists():
        raise ConfigError(f"{option} {out} is a dangling symlink", fix="remove it or pass another path")
    if not out.exists():
        return
    if not out.is_dir():
        raise ConfigError(f"{option} {out} is a file", fix="pass a folder path")
    foreign = foreign_entries(out)
    if foreign and not overwrite:
        raise ConfigError(
            f"{option} {out} is not a critic-audit output folder: it holds files critic-audit did not write "
            f"({', '.join(foreign)}{', ...' if len(foreign) >= 3 else ''})",
            fix="pass a new or empty folder, or --overwrite to write next to them (a file critic-audit did "
                "not write is never replaced or removed)")
    if foreign and writes:
        m = read_manifest(out)
        owned = set(m["files"]) | set(m.get("dirs", [])) | _ancestors([*m["files"], *m.get("dirs", [])]) if m else set()
        for name in writes:
            p = out / name
            if (p.exists() or p.is_symlink()) and name not in owned:
                raise ConfigError(f"{option} {out}: {name} was not written by critic-audit (no manifest lists it); "
                                  "refusing to replace it", fix="pass a new or empty folder, or move that file away")


def check_writable(out: str | Path, *, option: str = "--out") -> None:
    """Refuse, before any work, an output folder the tool could not write at the end: an existing
    ``out`` in which a file cannot be created, or (``out`` missing) a nearest existing parent in which
    ``out`` cannot be made. A file is created and removed to find out (permissions, a read-only mount).

    Raises:
        ConfigError: ``cannot write to OUT: <reason>`` when permissions forbid it (fix: chmod, or another
            path); ``cannot create OUT: the system refuses a new file in P (<reason>)`` for any other cause
            (a read-only mount, ``/proc``; fix: another path); or ``cannot create OUT: its parent P is a
            file, not a folder``.
    """
    out = Path(out)
    where = next((a for a in (out, *out.parents) if a.exists()), None)
    if where is None or where == out and not out.is_dir():
        return  # nothing exists (a relative path's root) or ``out`` is a file: check_replaceable says so
    if not where.is_dir():
        raise ConfigError(f"cannot create {out}: its parent {where} is a file, not a folder", path=None,
                          fix=f"pass another {option}, e.g. {option} {where.parent / (out.name or 'out')}")
    try:
        fd, probe = tempfile.mkstemp(prefix=INSIDE_STAGING + "probe-", dir=where)
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        reason = e.strerror or str(e)
        if e.errno in (errno.EACCES, errno.EPERM):  # permissions: chmod helps
            what = "" if where == out else f" (its folder {where} does not let it be made)"
            raise ConfigError(f"cannot write to {out}{what}: {reason}", path=None,
                              fix=f"make it writable (e.g. chmod u+w {where}) or pass another {option}") from None
        # not permissions (a read-only mount, /proc's "No such file or directory"): no chmod advice
        raise ConfigError(f"cannot create {out}: the system refuses a new file in {where} ({reason})", path=None,
                          fix=f"pass another {option}, in a folder where files can be made") from None


def refuse_input_clash(out: str | Path, inputs: Sequence[str | Path], *, option: str = "--out",
                       example: str = "audit_out2") -> None:
    """Refuse an output path that would destroy what the command reads, with or without ``--overwrite``:
    ``out`` is one of ``inputs``, holds one (an output folder around an input), or is an existing file
    inside an input folder (e.g. ``monitor AUDIT --out AUDIT/trajectories.parquet``: the audit's own
    table). A new file inside an input folder is fine. The one guard of every command that writes
    (``analyze``, ``check``, ``monitor``, ``fit-critic``, ``build-critic``, ``train``); ``example`` is the
    path the fix suggests.

    Raises:
        ConfigError: ``OPTION OUT is (or holds) the input P`` or ``OPTION OUT is inside the input folder
            P``, naming the fix.
    """
    o = Path(os.path.realpath(Path(out).expanduser()))  # realpath never raises (a symlink loop included)
    for p in inputs:
        rp = Path(os.path.realpath(Path(p).expanduser()))
        if rp == o or o in rp.parents:
            raise ConfigError(f"{option} {out} is (or holds) the input {p}; an input is never replaced, even "
                              "with --overwrite", fix=f"pass another {option}, e.g. {option} {example}")
        if rp in o.parents and rp.is_dir() and (o.is_file() or o.is_symlink()):
            raise ConfigError(f"{option} {out} is a file inside the input folder {p}, which this command reads; "
                              "it is never replaced, even with --overwrite",
                              fix=f"pass a path outside {p}, e.g. {option} {example}, or a new file name")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, ValueError):
        return True
    return True


def _stale_marker(folder: Path) -> bool:
    """``folder`` is a staging folder of this tool whose process (on this host) is gone."""
    try:
        mark = json.loads((folder / STAGING_MARKER).read_text())
        pid, host = int(mark["pid"]), str(mark["host"])
    except (OSError, ValueError, KeyError, TypeError):
        return False
    return host == socket.gethostname() and not _alive(pid)


def clean_stale(out: Path) -> list[Path]:
    """Remove the leftovers of killed runs next to ``out``: staging folders ``.<name>.tmp-*`` whose
    marker names a process of this host that is gone, and swapped-out folders ``.<name>.old-<pid>-*``
    of such a process (by their manifest). Returns the paths removed."""
    removed: list[Path] = []
    parent = out.parent
    if not parent.is_dir():
        return removed
    inside = sorted(out.glob(f"{INSIDE_STAGING}*")) if out.is_dir() and not out.is_symlink() else []
    for p in [*sorted(parent.glob(f".{out.name}.tmp-*")), *inside]:
        if p.is_dir() and not p.is_symlink() and _stale_marker(p):
            shutil.rmtree(p, ignore_errors=True)
            removed.append(p)
    for p in sorted(parent.glob(f".{out.name}.old-*")):
        try:
            pid = int(p.name[len(f".{out.name}.old-"):].split("-")[0])
        except ValueError:
            continue
        if p.is_dir() and not p.is_symlink() and not _alive(pid) and remove_owned(p):
            removed.append(p)
    return removed


@contextlib.contextmanager
def staging(out: str | Path, *, inside: bool = False) -> Iterator[Path]:
    """A fresh staging folder next to ``out`` (``.<name>.tmp-XXXX``, marked with this process) for
    :func:`publish`; stale ones of killed runs are removed first. Removed when the block raises.
    ``inside`` and ``out`` an existing folder: the staging folder is made inside it
    (``.critic-audit.tmp-XXXX``, on the same filesystem), and :func:`publish` then moves its files in one
    by one without renaming ``out`` itself: an empty mount point (a Docker or Kubernetes output volume)
    or a folder whose parent is not writable can be written.

    Raises:
        ConfigError: the folder it goes in cannot be created or written.
    """
    out = Path(out)
    where = out if inside and out.is_dir() and not out.is_symlink() else out.parent
    try:
        where.mkdir(parents=True, exist_ok=True)
        clean_stale(out)
        prefix = INSIDE_STAGING if where == out else f".{out.name}.tmp-"
        tmp = Path(tempfile.mkdtemp(prefix=prefix, dir=where))
    except OSError as e:
        raise ConfigError(f"cannot write {'to' if where == out else 'next to'} {out} ({e.strerror or e})",
                          path=where, fix="choose a writable --out") from None
    (tmp / STAGING_MARKER).write_text(json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                                                  "created": time.time()}))
    try:
        yield tmp
    finally:
        if tmp.exists():  # not published (an error, or the block did not publish it)
            shutil.rmtree(tmp, ignore_errors=True)


def _usual_modes(tmp: Path) -> None:
    """Give every folder and file staged in ``tmp`` the umask's usual mode (0755 / 0644 under umask 022):
    writers that go through ``mkstemp`` (transformers' ``save_pretrained`` writes ``model.safetensors``
    that way) leave 0600, so a critic or backbone folder would be half private."""
    mask = _umask()
    for root, dirs, files in os.walk(tmp):
        for d in dirs:
            p = Path(root) / d
            if not p.is_symlink():
                os.chmod(p, 0o777 & ~mask)
        for f in files:
            p = Path(root) / f
            if not p.is_symlink():
                mode = os.stat(p).st_mode
                os.chmod(p, (0o777 if mode & 0o100 else 0o666) & ~mask)


def publish(tmp: Path, out: Path, *, kind: str, dirs: Sequence[str] = (), overwrite: bool = False,
            extra: dict[str, Any] | None = None, option: str = "--out") -> Path:
    """Write ``tmp``'s manifest and put ``tmp`` in place of ``out``.

    ``tmp`` staged inside ``out`` (:func:`staging` with ``inside``): its files are moved into ``out`` one by
    one (each rename atomic, the manifest written last), ``out`` itself is never renamed, and what the
    tool wrote there before and the new output lacks is removed by the old manifest.
    ``out`` missing or empty: ``tmp`` is renamed onto it. ``out`` entirely the tool's (its manifest
    covers everything in it): swapped by two renames, then the old folder's files are removed by its
    manifest. ``out`` holding other files: refused, or with ``overwrite`` written into file by file
    (each atomically) next to them; a path of the new output that is taken by a file the tool did not
    write is refused.

    Raises:
        ConfigError: as above.
    """
    out = Path(out)
    check_replaceable(out, overwrite=overwrite, option=option)
    (tmp / STAGING_MARKER).unlink(missing_ok=True)
    os.chmod(tmp, 0o777 & ~_umask())
    _usual_modes(tmp)
    if tmp.parent == out or (out.exists() and foreign_entries(out, limit=1)):  # files moved in, out kept
        return _merge(tmp, out, kind=kind, dirs=dirs, extra=extra, option=option)
    write_manifest(tmp, kind, dirs=dirs, extra=extra)
    if out.exists() and not any(out.iterdir()):
        out.rmdir()
    if not out.exists():
        os.replace(tmp, out)
        return out
    old = out.with_name(f".{out.name}.old-{os.getpid()}-{time.time_ns()}")
    os.replace(out, old)
    try:
        os.replace(tmp, out)
    except OSError:
        os.replace(old, out)
        raise
    remove_owned(old)
    return out


def update(tmp: Path, out: Path, *, dirs: Sequence[str] = (), option: str = "folder") -> Path:
    """Move the files staged in ``tmp`` (made by :func:`staging`) into the existing output ``out``, keeping
    its other files: a re-render (``critic-audit plot``). In each owned folder of ``dirs`` what the tool
    wrote before is removed first; a file the tool did not write is never replaced or removed (a new
    file whose path it takes is refused). The manifest then lists the old files and the new ones.

    Raises:
        ConfigError: ``out`` has no manifest of this tool, or a staged path is taken by a file the tool
            did not write.
    """
    m = read_manifest(out)
    if m is None:
        raise ConfigError(f"{option} {out} has no {MANIFEST}", fix="pass an output folder written by critic-audit")
    (tmp / STAGING_MARKER).unlink(missing_ok=True)
    return _merge(tmp, out, kind=str(m.get("kind")), dirs=dirs, extra=None, option=option, partial=True)


def _merge(tmp: Path, out: Path, *, kind: str, dirs: Sequence[str], extra: dict[str, Any] | None,
           option: str, partial: bool = False) -> Path:
    old = read_manifest(out)
    old_files = set(old["files"]) if old else set()
    old_dirs = set(old.get("dirs", [])) if old else set()
    new_files = _walk_files(tmp)

    def ours(rel: str) -> bool:
        if rel in old_files:
            return True
        for d in old_dirs:
            if rel.startswith(d + "/"):
                rec = dir_files(old, d) if old else None
                return rec is None or rel in rec
        return False

    for rel in new_files:
        target = out / rel
        if not _inside(out, target):
            raise ConfigError(f"{option} {out}: {rel} would be written through a symlink out of the folder",
                              fix="pass a new or empty folder")
        for q in [target, *[out / a for a in sorted(_ancestors([rel]))]]:
            if q != target and q.exists() and not q.is_dir():
                raise ConfigError(f"{option} {out}: {q.relative_to(out)} is a file critic-audit did not write, "
                                  f"where it writes the folder of {rel}", fix="pass a new or empty folder")
        if (target.exists() or target.is_symlink()) and not ours(rel):
            raise ConfigError(f"{option} {out}: {rel} was not written by critic-audit (no manifest lists it); "
                              "refusing to replace it", fix="pass a new or empty folder, or move that file away")
    keep_dirs = [d for d in dirs if (d in old_dirs and (out / d).is_dir() and not (out / d).is_symlink())
                 or not (out / d).exists()]  # own a folder only when it was the tool's or is new
    # first a manifest naming the old files and the new ones: a kill while moving leaves them all the tool's
    old_inside: set[str] = set()
    for d in old_dirs:
        rec = dir_files(old, d) if old else None
        old_inside |= rec if rec is not None else {f"{d}/{f}" for f in _walk_files(out / d)}
    write_manifest(out, kind, dirs=sorted(old_dirs | set(keep_dirs)), extra={**(extra or {}), "merging": True},
                   files=sorted(old_files | old_inside | set(new_files)), whole=[])
    # the old output's files that the new one does not have (a partial update keeps them)
    for rel in sorted(old_files - set(new_files)) if not partial else []:
        p = out / rel
        if _inside(out, p) and (p.is_file() or p.is_symlink()):
            p.unlink()
    # the old output's owned folders (plots/), rewritten or not: what the tool wrote there goes (an
    # earlier run's plots never stay beside a report of this one), a file the tool did not write stays
    cleaned = set(dirs) & old_dirs if partial else old_dirs
    for d in sorted(cleaned):
        if old and (out / d).is_dir() and not (out / d).is_symlink():
            _remove_dir_files(out, old, d)
    for rel in new_files:
        target = out / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(tmp / rel, target)
    final, final_dirs = set(new_files), set(keep_dirs)
    if partial:
        final |= old_files | {f for f in old_inside if not any(f.startswith(d + "/") for d in cleaned)}
        final_dirs |= old_dirs - cleaned
    # an owned folder still holding a user's file stays the tool's (its recorded files: none), so a later
    # run may write its figures there again next to that file
    final_dirs |= {d for d in cleaned if (out / d).is_dir() and not (out / d).is_symlink()}
    write_manifest(out, kind, dirs=sorted(final_dirs), extra={**(extra or {}), "merged": True}, files=sorted(final),
                   whole=[])
    shutil.rmtree(tmp, ignore_errors=True)
    return out


# --------------------------------------------------------------------------------------------- locks


def lock_path(out: str | Path) -> Path:
    """The lock file of output folder ``out``: ``.<name>.lock`` next to it (not inside it: an ``analyze``
    output missing or swapped in by a rename would take a lock inside with it). When that parent
    cannot be written (a volume mounted at ``out`` under a read-only parent) and ``out`` is an existing
    folder, whose files an ``analyze`` then moves in one by one: ``.critic-audit.tmp-lock`` inside it."""
    out = Path(out)
    beside = out.parent / f".{out.name}.lock"
    if not beside.exists() and not os.access(out.parent, os.W_OK | os.X_OK) and out.is_dir() \
            and not out.is_symlink() and os.access(out, os.W_OK | os.X_OK):
        return out / f"{INSIDE_STAGING}lock"
    return beside


#: The folder locks this process holds: lock file -> [the lock, holds].
_HELD: dict[Path, list[Any]] = {}


class FolderLock:
    """A held :func:`lock_folder` lock; :meth:`release` (or leaving the ``with`` block) lets this hold go."""

    def __init__(self, path: Path) -> None:
        self.path, self._held = path, True

    def release(self) -> None:
        """Release this hold; the last hold of the folder in this process unlocks it. Idempotent."""
        if not self._held:
            return
        self._held = False
        entry = _HELD.get(self.path)
        if entry is None:
            return
        entry[1] -= 1
        if entry[1] <= 0:
            del _HELD[self.path]
            # removed while still locked: a process that opened it meanwhile finds, once it gets the
            # flock, that the path no longer names its file, and starts over (see lock_folder)
            with contextlib.suppress(OSError):
                self.path.unlink()
            entry[0].release(force=True)

    def __enter__(self) -> FolderLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def __del__(self) -> None:  # a hold dropped without release (e.g. a Trainer garbage-collected)
        with contextlib.suppress(Exception):
            self.release()


class _Unlinked(Exception):
    """The lock file was removed (or replaced) between opening it and locking it."""


def _holder(path: Path) -> dict[str, Any]:
    try:
        rec = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return rec if isinstance(rec, dict) else {}


def lock_folder(out: str | Path, *, command: str, option: str = "--out") -> FolderLock:
    """Hold the lock of output folder ``out`` for this process, or refuse at once.

    The lock is ``fcntl.flock`` on :func:`lock_path` (``filelock.FileLock``), so the kernel drops it when
    the holder exits for any reason (``kill -9`` included): a stale lock file never blocks a later run or
    ``--resume``. The file records the holder (``{"pid", "host", "command", "started"}``) for the error
    of a second process. It is removed on release, while still locked; a process that opened it just
    before gets the flock on a file no longer at the path, sees that (inode check) and starts over, so
    removal never lets two processes in. A killed holder leaves the file; the next holder removes it.
    Within one process the lock is re-entrant (a second hold of the same folder is counted, not
    refused): it guards against another process. The hold lasts while the returned :class:`FolderLock`
    is referenced (or until its :meth:`~FolderLock.release`). ``out`` should be resolved
    (:func:`check_out_path`) so that two spellings of one folder share its lock.

    Args:
        out: the output folder (it need not exist yet; its parent is created).
        command: what holds it, for the error of another process, e.g. ``"critic-audit train"``.
        option: the option that named the folder, for messages.

    Raises:
        ConfigError: another process holds the folder (naming its pid, host, command and the fix), or
            ``out`` or its lock file cannot be created (:func:`check_writable`'s line).
    """
    out = Path(out)
    path = lock_path(out)
    if path in _HELD:
        _HELD[path][1] += 1
        return FolderLock(path)
    record = json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "command": command,
                         "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")}).encode()

    def stamp(fd: int) -> None:  # the new holder writes itself into the file it locked
        try:
            current = os.stat(path).st_ino
        except FileNotFoundError:
            current = None
        if current != os.fstat(fd).st_ino:  # the holder we waited for removed it on release: try again
            raise _Unlinked
        os.ftruncate(fd, 0)
        os.pwrite(fd, record, 0)

    check_writable(out, option=option)  # a path that cannot be made is not "in use by another process"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        for _attempt in range(20):
            lock = filelock.FileLock(path, timeout=0, thread_local=False, on_acquired=stamp)
            try:
                lock.acquire()
                break
            except _Unlinked:
                continue
        else:
            raise filelock.Timeout(str(path))
    except filelock.Timeout:
        if not path.exists():  # no holder's file: the lock file could not be made (filelock says Timeout)
            raise ConfigError(f"cannot write to {out}: the lock file {path} cannot be created", path=None,
                              fix=f"pass a writable {option}") from None
        h = _holder(path)
        pid = h.get("pid")
        who = "another process"
        if pid:
            where = f" on {h['host']}" if h.get("host") and h["host"] != socket.gethostname() else ""
            what = f" ({h['command']}, since {h.get('started', '?')})" if h.get("command") else ""
            who = f"process {pid}{where}{what}"
        stop = f"stop it (kill {pid})" if pid else "stop it"
        raise ConfigError(f"{option} {out} is in use by {who}: two runs on one folder would interleave its files",
                          fix=f"wait for that run to end or {stop}, or pass another {option}; the lock "
                                         "of a killed run is released by the OS, so --resume works after it") from None
    except OSError as e:
        raise ConfigError(f"cannot lock {option} {out} ({e.strerror or e})", path=path,
                          fix=f"choose a writable {option}") from None
    _HELD[path] = [lock, 1]
    return FolderLock(path)
