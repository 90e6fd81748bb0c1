"""Resumable critic scoring: :func:`score_values` results written chunk by chunk into a cache folder.

A run killed at any point (even SIGKILL) resumes from the chunks already written and ends with values
identical to an uninterrupted run:

- The sequences are planned once, exactly as :func:`score_values` plans them (sorted by length,
  greedy batches under ``token_budget``), and consecutive batches are grouped into chunks of about
  ``chunk_tokens`` scored positions. Scoring a chunk alone reproduces the same batches, so the values
  are bit-for-bit those of one uninterrupted call with the same critic and options.
- Each chunk is written to ``chunk-NNNNNN.npz`` through a temporary file and an atomic rename; a
  killed run leaves at most a stray temporary file, which is ignored and removed.
- ``manifest.json`` records what the chunks belong to: the critic's fingerprint (path, format,
  size and mtime of every weight file, head hash, dtype, device type), the token budget and chunk
  size, and a hash of the token ids of every sequence. A cache whose manifest differs is discarded.

``CRITIC_AUDIT_SCORING_CHUNK_DELAY`` (seconds) sleeps after each written chunk: a deterministic way for
tests to kill a run mid-way.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import shutil
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from critic_audit.critic.infer import Progress, _validate, _vocab_size, plan_batches, score_values
from critic_audit.critic.load import Critic, critic_fingerprint
from critic_audit.critic.options import (  # noqa: F401  (re-exported)
    DEFAULT_CHUNK_TOKENS,
    CacheOptions,
    cache_root_for,
    current_options,
    scoring_cache,
)
from critic_audit.errors import ConfigError

log = logging.getLogger(__name__)

CACHE_VERSION = 1
DELAY_ENV = "CRITIC_AUDIT_SCORING_CHUNK_DELAY"
_CHUNK = re.compile(r"^chunk-(\d{6})\.npz$")


def sequence_hashes(sequences: Sequence[np.ndarray]) -> list[str]:
    """Per sequence, a hash of its token ids (as int64)."""
    return [hashlib.sha256(np.ascontiguousarray(s, dtype=np.int64).tobytes()).hexdigest()[:24] for s in sequences]


def plan_chunks(lengths: Sequence[int], token_budget: int, chunk_tokens: int) -> list[list[list[int]]]:
    """The batches of :func:`plan_batches` grouped, in order, into chunks of at least one batch and
    about ``chunk_tokens`` scored positions."""
    if chunk_tokens < 1:
        raise ConfigError(f"chunk_tokens must be >= 1, got {chunk_tokens}")
    chunks: list[list[list[int]]] = []
    cur: list[list[int]] = []
    n = 0
    for b in plan_batches(lengths, token_budget):
        size = sum(lengths[i] for i in b)
        if cur and n + size > chunk_tokens:
            chunks.append(cur)
            cur, n = [], 0
        cur.append(b)
        n += size
    if cur:
        chunks.append(cur)
    return chunks


def _write_atomic(path: Path, write: Callable[[Path], None]) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def _save_chunk(path: Path, idx: list[int], values: list[np.ndarray]) -> None:
    def write(tmp: Path) -> None:
        with open(tmp, "wb") as f:
            np.savez(f, indices=np.asarray(idx, dtype=np.int64),
                     lengths=np.asarray([len(v) for v in values], dtype=np.int64),
                     values=np.concatenate(values).astype(np.float32) if values else np.zeros(0, np.float32))
            f.flush()
            os.fsync(f.fileno())

    _write_atomic(path, write)


def _load_chunk(path: Path, idx: list[int], lengths: list[int]) -> list[np.ndarray] | None:
    try:
        with np.load(path) as z:
            if z["indices"].tolist() != idx or z["lengths"].tolist() != lengths:
                return None
            flat = z["values"]
    except Exception:  # a truncated or foreign file: recompute the chunk
        return None
    return np.split(flat, np.cumsum(lengths)[:-1]) if lengths else []


def score_values_cached(
    critic: Critic,
    sequences: Sequence[np.ndarray],
    cache_root: str | Path,
    *,
    token_budget: int = 16384,
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
    progress: Progress | None = None,
    stats: dict | None = None,
    attention_mask: bool = False,
    keep: bool = False,
) -> list[np.ndarray]:
    """:func:`score_values` that writes its results chunk by chunk under ``cache_root`` and resumes
    from a previous, interrupted call with the same critic, options and sequences.

    The chunks live in ``cache_root/<key>/`` (``key`` hashes the manifest); that folder is removed
    after success unless ``keep`` (and ``cache_root`` too when it is left empty). ``stats`` gets the
    keys of :func:`score_values` (for the work done in this call) plus ``n_chunks``,
    ``resumed_chunks`` (read back from the cache) and ``cache_dir``.
    """
    vocab = _vocab_size(critic)
    seqs = _validate(sequences, critic.max_length, vocab)
    fed = [max(len(s) - 1, 0) for s in seqs]
    chunks = plan_chunks(fed, token_budget, chunk_tokens)
    manifest = {
        "version": CACHE_VERSION,
        "critic": critic_fingerprint(critic),
        "token_budget": int(token_budget),
        "chunk_tokens": int(chunk_tokens),
        "attention_mask": bool(attention_mask),
        "n_sequences": len(seqs),
        "sequences": sequence_hashes(seqs),
        "n_chunks": len(chunks),
    }
    key = hashlib.sha256(json.dumps(manifest, sort_keys=True).encode()).hexdigest()[:16]
    root = Path(cache_root)
    folder = root / f"{Path(critic.path).name or 'critic'}-{key}"
    mfile = folder / "manifest.json"
    if folder.exists():
        try:
            same = json.loads(mfile.read_text()) == manifest
        except (OSError, json.JSONDecodeError):
            same = False
        if not same:
            log.warning("discarding the scoring cache %s: it belongs to another critic or other sequences", folder)
            shutil.rmtree(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for stray in folder.glob(".*.tmp"):
        stray.unlink(missing_ok=True)
    if not mfile.exists():
        _write_atomic(mfile, lambda tmp: tmp.write_text(json.dumps(manifest, sort_keys=True)))

    results = [np.full(len(s), np.nan, dtype=np.float32) for s in seqs]
    total = sum(fed)
    done = 0
    resumed = 0
    agg: dict[str, Any] = {"n_batches": 0, "batch_shapes": [], "real_tokens": 0, "computed_tokens": 0, "seconds": 0.0}
    delay = float(os.environ.get(DELAY_ENV, "0") or 0)
    if progress:
        progress(0, total)
    for k, batches in enumerate(chunks):
        idx = [i for b in batches for i in b]
        lengths = [len(seqs[i]) for i in idx]
        path = folder / f"chunk-{k:06d}.npz"
        vals = _load_chunk(path, idx, lengths) if path.exists() else None
        if vals is not None:
            resumed += 1
        else:
            st: dict = {}
            inner = (lambda d, _n, _base=done: progress(_base + d, total)) if progress else None
            vals = score_values(critic, [seqs[i] for i in idx], token_budget=token_budget, stats=st,
                                attention_mask=attention_mask, progress=inner)
            if st.get("n_batches") != len(batches):  # the chunk must reproduce the global plan
                raise RuntimeError(f"chunk {k} planned {st.get('n_batches')} batches instead of {len(batches)}")
            _save_chunk(path, idx, vals)
            for name in ("n_batches", "real_tokens", "computed_tokens", "seconds"):
                agg[name] += st[name]
            agg["batch_shapes"] += st["batch_shapes"]
            if delay > 0:
                time.sleep(delay)
        for i, v in zip(idx, vals, strict=True):
            results[i] = v
        done += sum(fed[i] for i in idx)
        if progress:
            progress(done, total)
    if stats is not None:
        sec = agg["seconds"]
        stats.update(
            n_sequences=len(seqs), **agg,
            padding_efficiency=(agg["real_tokens"] / agg["computed_tokens"]) if agg["computed_tokens"] else 1.0,
            tokens_per_s=(agg["real_tokens"] / sec) if sec > 0 else None,
            n_chunks=len(chunks), resumed_chunks=resumed, cache_dir=str(folder),
        )
    if not keep:
        shutil.rmtree(folder, ignore_errors=True)
        with contextlib.suppress(OSError):
            root.rmdir()  # only when empty
    return results
