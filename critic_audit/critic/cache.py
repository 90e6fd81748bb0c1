"""Resumable critic scoring: :func:`score_values` results written chunk by chunk into a cache folder.

A run killed at any point (even SIGKILL) resumes from the chunks already written and ends with values
identical to an uninterrupted run:

- The sequences are planned once, exactly as :func:`score_values` plans them
  (:func:`~critic_audit.critic.infer.plan_scoring`: shared-prefix groups, then sorted, greedy batches
  under ``token_budget``), and consecutive batches are grouped into chunks of about ``chunk_tokens``
  scored positions. A chunk runs its own batches of that plan (a shared prefix that spans two chunks
  is fed once in each, the same way), so the values are bit-for-bit those of one uninterrupted call
  with the same critic and options.
- Each chunk is written to ``chunk-NNNNNN.npz`` through a temporary file and an atomic rename; a
  killed run leaves at most a stray temporary file, which is ignored and removed.
- ``manifest.json`` records what the chunks belong to: the critic's fingerprint (path, format,
  size and mtime of every weight file, head hash, dtype, device type), the token budget, the scoring
  strategy and chunk size, and a hash of the token ids of every sequence. A cache whose manifest differs is discarded.

The pieces are shared with the distributed scorer (:mod:`critic_audit.critic.distributed`): a
:class:`ChunkCache` (the plan, the manifest and the chunk files), :func:`score_chunk` (one chunk, checked
against the plan) and :class:`ChunkResults` (values and statistics assembled as chunks land).

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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from critic_audit.critic.infer import (
    Progress,
    ScoreBatch,
    Strategy,
    _validate,
    _vocab_size,
    batch_members,
    localize,
    plan_batches,
    plan_scoring,
    resolve_strategy,
    score_plan,
)
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

CACHE_VERSION = 2
DELAY_ENV = "CRITIC_AUDIT_SCORING_CHUNK_DELAY"
_CHUNK = re.compile(r"^chunk-(\d{6})\.npz$")


def sequence_hashes(sequences: Sequence[np.ndarray]) -> list[str]:
    """Per sequence, a hash of its token ids (as int64)."""
    return [hashlib.sha256(np.ascontiguousarray(s, dtype=np.int64).tobytes()).hexdigest()[:24] for s in sequences]


def _group_in_order(items: Sequence[Any], size_of: Any, chunk_tokens: int) -> list[list[Any]]:
    """``items`` grouped, in order, into chunks of at least one item and about ``chunk_tokens``
    positions (``size_of(item)``)."""
    if chunk_tokens < 1:
        raise ConfigError(f"chunk_tokens must be >= 1, got {chunk_tokens}")
    chunks: list[list[Any]] = []
    cur: list[Any] = []
    n = 0
    for item in items:
        size = size_of(item)
        if cur and n + size > chunk_tokens:
            chunks.append(cur)
            cur, n = [], 0
        cur.append(item)
        n += size
    if cur:
        chunks.append(cur)
    return chunks


def plan_chunks(lengths: Sequence[int], token_budget: int, chunk_tokens: int) -> list[list[list[int]]]:
    """The batches of :func:`plan_batches` grouped, in order, into chunks of at least one batch and
    about ``chunk_tokens`` scored positions."""
    return _group_in_order(plan_batches(lengths, token_budget), lambda b: sum(lengths[i] for i in b), chunk_tokens)


def chunk_plan(batches: Sequence[ScoreBatch], lengths: Sequence[int], chunk_tokens: int) -> list[list[ScoreBatch]]:
    """The batches of a scoring plan (:func:`~critic_audit.critic.infer.plan_scoring`) grouped, in
    order, into chunks of at least one batch and about ``chunk_tokens`` scored positions (``lengths``:
    scored positions per sequence)."""
    return _group_in_order(batches, lambda b: sum(lengths[i] for i in b.members), chunk_tokens)


def _write_atomic(path: Path, write: Callable[[Path], None]) -> None:
    """:func:`critic_audit.outputs.atomic_write` (temporary sibling ``.<name>.tmp-*``, fsync, rename)."""
    from critic_audit.outputs import atomic_write

    atomic_write(path, write)


@dataclass
class ChunkCache:
    """The chunk plan of a set of sequences and the folder its chunks are written to.

    Attributes:
        root: the cache root (shared by several critics and sets of sequences).
        folder: ``root/<critic name>-<key>``, ``key`` a hash of :attr:`manifest`.
        chunks: per chunk, its batches of the scoring plan, as :func:`chunk_plan` groups them.
        lengths: the length of every sequence (tokens).
        manifest: what the chunks belong to (critic fingerprint, options, sequence hashes).
    """

    root: Path
    folder: Path
    chunks: list[list[ScoreBatch]]
    lengths: list[int]
    manifest: dict

    @classmethod
    def open(cls, cache_root: str | Path, name: str, fingerprint: dict, sequences: Sequence[np.ndarray], *,
             token_budget: int, chunk_tokens: int, attention_mask: bool, strategy: Strategy) -> ChunkCache:
        """Plan the chunks of ``sequences`` (validated token ids) under ``strategy`` (as resolved by
        :func:`~critic_audit.critic.infer.resolve_strategy`) and open their folder under
        ``cache_root``: an existing folder whose manifest differs is discarded, stray temporary files
        are removed, and the manifest is written when missing."""
        lengths = [len(s) for s in sequences]
        plan = plan_scoring(sequences, token_budget, strategy)
        chunks = chunk_plan(plan, [max(n - 1, 0) for n in lengths], chunk_tokens)
        manifest = {
            "version": CACHE_VERSION,
            "critic": fingerprint,
            "token_budget": int(token_budget),
            "strategy": strategy.as_dict(),
            "chunk_tokens": int(chunk_tokens),
            "attention_mask": bool(attention_mask),
            "n_sequences": len(sequences),
            "sequences": sequence_hashes(sequences),
            "n_chunks": len(chunks),
        }
        key = hashlib.sha256(json.dumps(manifest, sort_keys=True).encode()).hexdigest()[:16]
        root = Path(cache_root)
        folder = root / f"{name or 'critic'}-{key}"
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
        for stray in [*folder.glob(".*.tmp"), *folder.glob(".*.tmp-*")]:
            stray.unlink(missing_ok=True)
        if not mfile.exists():
            _write_atomic(mfile, lambda tmp: tmp.write_text(json.dumps(manifest, sort_keys=True)))
        return cls(root=root, folder=folder, chunks=chunks, lengths=lengths, manifest=manifest)

    def indices(self, k: int) -> list[int]:
        """The sequence indices of chunk ``k``, batch after batch."""
        return batch_members(self.chunks[k])

    def chunk_tokens(self, k: int) -> int:
        """Scored positions of chunk ``k`` (``len - 1`` per sequence)."""
        return sum(max(self.lengths[i] - 1, 0) for i in self.indices(k))

    def path(self, k: int) -> Path:
        return self.folder / f"chunk-{k:06d}.npz"

    def load(self, k: int) -> list[np.ndarray] | None:
        """Chunk ``k``'s values read back, or None when it is missing, truncated or does not match."""
        path = self.path(k)
        if not path.exists():
            return None
        idx = self.indices(k)
        lengths = [self.lengths[i] for i in idx]
        try:
            with np.load(path) as z:
                if z["indices"].tolist() != idx or z["lengths"].tolist() != lengths:
                    return None
                flat = z["values"]
        except Exception:  # a truncated or foreign file: recompute the chunk
            return None
        return np.split(flat, np.cumsum(lengths)[:-1]) if lengths else []

    def save(self, k: int, values: list[np.ndarray]) -> None:
        """Write chunk ``k`` atomically (temporary file, fsync, rename); then sleep
        ``CRITIC_AUDIT_SCORING_CHUNK_DELAY`` seconds when set (tests)."""
        idx = self.indices(k)

        def write(tmp: Path) -> None:
            with open(tmp, "wb") as f:
                np.savez(f, indices=np.asarray(idx, dtype=np.int64),
                         lengths=np.asarray([len(v) for v in values], dtype=np.int64),
                         values=np.concatenate(values).astype(np.float32) if values else np.zeros(0, np.float32))

        _write_atomic(self.path(k), write)
        delay = float(os.environ.get(DELAY_ENV, "0") or 0)
        if delay > 0:
            time.sleep(delay)

    def remove(self) -> None:
        """Remove the folder, and the root when it is left empty."""
        shutil.rmtree(self.folder, ignore_errors=True)
        with contextlib.suppress(OSError):
            self.root.rmdir()  # only when empty


def score_chunk(critic: Critic, sequences: Sequence[np.ndarray], batches: Sequence[ScoreBatch], *,
                attention_mask: bool = False, progress: Progress | None = None) -> tuple[list[np.ndarray], dict]:
    """One chunk: its ``batches`` of the global plan (sequence indices as in the whole set) run on
    ``sequences``, the chunk's own sequences in :func:`~critic_audit.critic.infer.batch_members`
    order (what :meth:`ChunkCache.indices` lists). Returns ``(values, stats)`` in that order.

    Raises:
        RuntimeError: ``sequences`` are not as many as the batches' members.
    """
    local = localize(batches)
    if len(sequences) != len(batch_members(local)):
        raise RuntimeError(f"a chunk got {len(sequences)} sequences for {len(batch_members(local))} members")
    st: dict = {}
    vals = score_plan(critic, sequences, local, stats=st, attention_mask=attention_mask, progress=progress)
    return vals, st


class ChunkResults:
    """Per-sequence values filled in as chunks land (read back from the cache or scored), with progress
    and the statistics of :func:`score_values_cached`."""

    SUMMED = ("n_batches", "real_tokens", "computed_tokens", "shared_prefix_tokens", "prefix_passes", "seconds")

    def __init__(self, cache: ChunkCache, progress: Progress | None = None) -> None:
        self.cache = cache
        self.values = [np.full(n, np.nan, dtype=np.float32) for n in cache.lengths]
        self.total = sum(max(n - 1, 0) for n in cache.lengths)
        self.done = 0
        self.resumed = 0
        self.agg: dict[str, Any] = dict.fromkeys(self.SUMMED, 0)
        self.agg["seconds"] = 0.0
        self.shapes: dict[int, list] = {}
        self.progress = progress
        if progress:
            progress(0, self.total)

    def add(self, k: int, values: list[np.ndarray], stats: dict | None) -> None:
        """Chunk ``k``'s values; ``stats`` from :func:`score_chunk`, or None when read back from the cache."""
        if stats is None:
            self.resumed += 1
        else:
            for name in self.SUMMED:
                self.agg[name] += stats.get(name, 0)
            self.shapes[k] = stats["batch_shapes"]
        for i, v in zip(self.cache.indices(k), values, strict=True):
            self.values[i] = v
        self.done += self.cache.chunk_tokens(k)
        if self.progress:
            self.progress(self.done, self.total)

    def stats(self, seconds: float | None = None) -> dict:
        """The keys of :func:`score_values` for the work done (``seconds``: the wall time, default the
        summed scoring time) plus ``n_chunks``, ``resumed_chunks`` and ``cache_dir``."""
        agg = dict(self.agg, batch_shapes=[s for k in sorted(self.shapes) for s in self.shapes[k]])
        sec = agg["seconds"] if seconds is None else seconds
        agg["seconds"] = sec
        fed = agg["real_tokens"] - agg["shared_prefix_tokens"]
        return dict(
            n_sequences=len(self.values), **agg,
            padding_efficiency=(fed / agg["computed_tokens"]) if agg["computed_tokens"] else 1.0,
            tokens_per_s=(agg["real_tokens"] / sec) if sec > 0 else None,
            n_chunks=len(self.cache.chunks), resumed_chunks=self.resumed, cache_dir=str(self.cache.folder),
        )


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
    strategy: Strategy | str | None = "auto",
) -> list[np.ndarray]:
    """:func:`score_values` that writes its results chunk by chunk under ``cache_root`` and resumes
    from a previous, interrupted call with the same critic, options and sequences.

    The chunks live in ``cache_root/<key>/`` (``key`` hashes the manifest); that folder is removed
    after success unless ``keep`` (and ``cache_root`` too when it is left empty). ``stats`` gets the
    keys of :func:`score_values` (for the work done in this call) plus ``n_chunks``,
    ``resumed_chunks`` (read back from the cache) and ``cache_dir``. ``strategy``: as
    :func:`score_values` (recorded in the manifest).
    """
    seqs = _validate(sequences, critic.max_length, _vocab_size(critic))
    strat = resolve_strategy(strategy, critic.device.type, getattr(critic.backbone, "config", None),
                             attention_mask=attention_mask)
    cache = ChunkCache.open(cache_root, Path(critic.path).name, critic_fingerprint(critic), seqs,
                            token_budget=token_budget, chunk_tokens=chunk_tokens, attention_mask=attention_mask,
                            strategy=strat)
    res = ChunkResults(cache, progress)
    for k, batches in enumerate(cache.chunks):
        vals, st = cache.load(k), None
        if vals is None:
            inner = (lambda d, _n, _base=res.done: progress(_base + d, res.total)) if progress else None
            vals, st = score_chunk(critic, [seqs[i] for i in cache.indices(k)], batches,
                                   attention_mask=attention_mask, progress=inner)
            cache.save(k, vals)
        res.add(k, vals, st)
    if stats is not None:
        stats.update(res.stats(), strategy=strat.as_dict())
    if not keep:
        cache.remove()
    return res.values
