"""Streaming audit of tokens tables stored as Parquet, for runs larger than memory.

Same statistics as :func:`critic_audit.analysis.decompose.decompose` and
:func:`critic_audit.analysis.audit.audit` (definitions: docs/audit.md; the measurement is the MPO
paper's, arXiv:2610.35013), read in row batches. The order contract is what a streaming group-by
needs: each trajectory's rows are contiguous (one run of rows, positions strictly increasing), in any
order of trajectories (the tool writes them in its input order: ``step20-9`` before ``step20-10``; a
table sorted by ``(trajectory_id, position)`` is one such order). Each batch's complete trajectories
are reduced at once, and the rows of the trajectory still open at the batch edge are carried over to
the next batch (a trajectory may span any number of batches or files).

:class:`AuditStream` keeps, per trajectory, only its sufficient statistics: the kernel's sums
(:func:`critic_audit.analysis.decompose.trajectory_sums`: N, K, sum, SS_B, SS_W, ...), the three sums
of the critic-quality gate (policy tokens with a reward, mean and sum of squared deviations of
``reward - value``), the mean value of each assistant turn (``turns``, for ``monitor`` and the
turn-position plot) and a histogram of the value steps between consecutive policy tokens
(:class:`StepHistogram`). The per-trajectory statistics are identical, bit for bit, to those of the
in-memory path on the whole table (same kernel, same tokens in the same order per trajectory).

Memory: one batch (``batch_rows`` rows of the needed columns, plus the ``pyarrow`` read buffer of the
row group being read) plus the selected rows of the longest trajectory, plus O(B) per-trajectory
sums and O(turns) turn means.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from critic_audit.analysis.decompose import NSUMS, statistics_frame, trajectory_sums
from critic_audit.errors import ConfigError, InputError, SchemaError

SCOPES = ("assistant", "all")
_SORT_FIX = "write each trajectory's rows together, positions increasing (e.g. sort by trajectory_id, position)"
#: canonical dtypes of the token columns the stream reads (docs/tables.md)
_TOKEN_DTYPES = {"position": pl.Int32(), "turn": pl.Int32(), "response_mask": pl.Boolean(), "value": pl.Float32()}


def _paths(path_or_paths: str | Path | Iterable[str | Path]) -> list[Path]:
    if isinstance(path_or_paths, (str, Path)):
        p = Path(path_or_paths)
        if p.is_dir():
            files = sorted(p.glob("*.parquet"))
            if not files:
                raise InputError("no *.parquet file in the folder", path=p, fix="pass the tokens.parquet file")
            return files
        return [p]
    return [Path(p) for p in path_or_paths]


def _runs(ids: pa.Array | pa.ChunkedArray | pl.Series) -> tuple[np.ndarray, pl.Series]:
    """Runs of equal trajectory ids in a batch: (first row of each run (int64), run ids).

    Dictionary-encoded ids (how the reader decodes them; a chunked array's chunks may each have their
    own dictionary, as each Parquet row group has) are compared by index, chunk by chunk, then adjacent
    runs whose strings are equal are merged (a dictionary may repeat a string, a run may cross chunks);
    plain strings by value.
    """
    n = len(ids)
    chunks = ids.chunks if isinstance(ids, pa.ChunkedArray) else [ids]
    if n and isinstance(ids, (pa.Array, pa.ChunkedArray)) and pa.types.is_dictionary(ids.type):
        parts, off = [], 0
        for ch in chunks:
            if len(ch):
                starts, names = _dictionary_runs(ch)
                parts.append((starts + off, names))
            off += len(ch)
        starts = np.concatenate([p[0] for p in parts])
        names = pl.concat([p[1] for p in parts]) if len(parts) > 1 else parts[0][1]
        if names.len() > 1:  # merge runs whose strings are equal
            new = np.concatenate([[True], (names.slice(1) != names.slice(0, names.len() - 1)).to_numpy()])
            starts, names = starts[new], names.filter(pl.Series(new))
        return starts.astype(np.int64, copy=False), names
    tid = pl.Series(ids).cast(pl.String) if not isinstance(ids, pa.ChunkedArray) else pl.Series(ids.combine_chunks()).cast(pl.String)
    run = tid.rle_id().to_numpy()
    starts = np.concatenate([[0], np.flatnonzero(np.diff(run)) + 1]) if n > 1 else np.zeros(1, np.int64)
    return starts.astype(np.int64, copy=False), tid.gather(starts)


def _dictionary_runs(ids: pa.DictionaryArray) -> tuple[np.ndarray, pl.Series]:
    """Runs of equal indices of one dictionary array (not empty): first rows, and their strings."""
    ind = ids.indices  # read in place: pyarrow's to_numpy imports pandas, polars' conversion pyarrow.compute
    dt = np.dtype(f"int{ind.type.bit_width}")
    idx = np.frombuffer(ind.buffers()[1], dtype=dt, count=len(ind), offset=ind.offset * dt.itemsize)
    starts = np.concatenate([[0], np.flatnonzero(idx[1:] != idx[:-1]) + 1])
    words = ids.dictionary.to_pylist()
    return starts, pl.Series([words[i] for i in idx[starts].tolist()], dtype=pl.String)


def _codes(sel: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """The run index (int64) of each selected row, from the runs' first rows (no per-row index of all rows)."""
    counts = np.add.reduceat(sel, starts, dtype=np.int64) if sel.size else np.zeros(starts.size, np.int64)
    return np.repeat(np.arange(starts.size, dtype=np.int64), counts)


class StepHistogram:
    """``|V_{t+1} - V_t|`` between consecutive policy tokens of the audited trajectories, at turn
    boundaries and inside turns, as counts over fixed bins (0, then :data:`PER_DECADE` log-spaced bins
    a decade from ``10**LO`` to ``10**HI``, then one overflow bin), with the exact count and sum of each
    kind (their means are exact; a quantile is the upper edge of its bin: within 2.4% of the value).

    Attributes:
        counts: (2, bins) int64, row 0 boundary steps, row 1 within-turn steps.
        n: (2,) int64 steps of each kind. total: (2,) float64 their sums (value units).
    """

    LO, HI, PER_DECADE = -12, 12, 100
    EDGES = np.concatenate([[0.0], 10.0 ** (LO + np.arange((HI - LO) * PER_DECADE + 1) / PER_DECADE), [np.inf]])

    def __init__(self) -> None:
        self.counts = np.zeros((2, self.EDGES.size), dtype=np.int64)
        self.n = np.zeros(2, dtype=np.int64)
        self.total = np.zeros(2, dtype=np.float64)

    def add_consecutive(self, traj: np.ndarray, turn: np.ndarray, values: np.ndarray, included: np.ndarray) -> None:
        """Count the steps between consecutive entries of ``values`` (float64) of one trajectory
        (``traj``: int codes, sorted) whose trajectory is ``included`` (bool per code); a step is a
        boundary step when ``turn`` changes. One pass without temporaries when numba is there."""
        if _nb_steps is not None and traj.size > 1:
            _nb_steps(traj, turn, values, included, float(self.LO), float(self.PER_DECADE), self.EDGES.size,
                      self.counts, self.n, self.total)
            return
        same = (traj[1:] == traj[:-1]) & included[traj[1:]]
        if same.any():
            self.add(np.abs(np.diff(values))[same], (turn[1:] != turn[:-1])[same])

    def add(self, steps: np.ndarray, boundary: np.ndarray) -> None:
        """Count ``steps`` (float64, finite, >= 0); ``boundary`` (bool, same shape) marks boundary steps."""
        for kind, sel in ((0, boundary), (1, ~boundary)):
            x = steps[sel]
            if x.size:
                with np.errstate(divide="ignore"):  # log10(0): the zero bin
                    k = np.floor((np.log10(x) - self.LO) * self.PER_DECADE)
                # bin j >= 1 holds [EDGES[j-1], EDGES[j]); 0 holds the zeros (to rounding at an edge)
                idx = np.where(x > 0, np.clip(k, -1, self.EDGES.size - 3) + 2, 0).astype(np.int64)
                self.counts[kind] += np.bincount(idx, minlength=self.EDGES.size)
                self.n[kind] += x.size
                self.total[kind] += float(x.sum())

    def points(self, kind: int) -> tuple[np.ndarray, np.ndarray]:
        """``(representative value, count)`` of each non-empty bin of ``kind`` (0 boundary, 1 within):
        0 for the zero bin, the geometric middle of a log bin, the lower edge of the overflow bin."""
        c = self.counts[kind]
        nz = np.flatnonzero(c)
        lo, hi = self.EDGES[np.maximum(nz - 1, 0)], self.EDGES[np.minimum(nz, self.EDGES.size - 1)]
        rep = np.where(nz == 0, 0.0, np.where(np.isinf(hi), lo, np.sqrt(lo * np.where(np.isinf(hi), lo, hi))))
        rep = np.where((nz == 1), hi, rep)  # below 10**LO: its upper edge
        return rep, c[nz]

    def quantile(self, q: float) -> float:
        """The upper edge of the bin holding the ``q`` quantile of both kinds together (0 when it is the
        zero bin; nan without steps)."""
        c = self.counts.sum(axis=0)
        n = int(c.sum())
        if n == 0:
            return float("nan")
        k = int(np.searchsorted(np.cumsum(c), q * n, side="left"))
        return 0.0 if k == 0 else float(self.EDGES[min(k, self.EDGES.size - 2)])

    def as_dict(self) -> dict[str, Any]:
        """JSON form: the bin layout, the exact counts and sums, the non-empty bins by index."""
        return {"layout": {"zero_bin": True, "lo_decade": self.LO, "hi_decade": self.HI, "per_decade": self.PER_DECADE},
                **{name: {"n": int(self.n[k]), "sum": float(self.total[k]),
                          "bins": {str(int(i)): int(self.counts[k, i]) for i in np.flatnonzero(self.counts[k])}}
                   for k, name in enumerate(("boundary", "within"))}}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> StepHistogram:
        """The histogram :meth:`as_dict` wrote (its layout must be this class's)."""
        h = cls()
        lay = d.get("layout") or {}
        if (lay.get("lo_decade"), lay.get("hi_decade"), lay.get("per_decade")) != (cls.LO, cls.HI, cls.PER_DECADE):
            raise InputError("steps.json has another bin layout", fix="re-run critic-audit analyze to rewrite it")
        for k, name in enumerate(("boundary", "within")):
            part = d.get(name) or {}
            h.n[k], h.total[k] = int(part.get("n", 0)), float(part.get("sum", 0.0))
            for i, c in (part.get("bins") or {}).items():
                h.counts[k, int(i)] = int(c)
        return h


#: :func:`_steps_kernel`'s bin lookup: the binary exponents it covers (``math.frexp``'s: about 1e-14 to
#: 3e13), and the bits of mantissa that split each into cells (1,024 cells: 0.07% of a value wide, a bin 2.3%)
_CELL_E0, _CELL_E1, _CELL_BITS = -45, 46, 10


def _steps_kernel() -> Any:
    """The numba kernel of :meth:`StepHistogram.add_consecutive` (None without numba).

    A step's bin is ``floor((log10(d) - LO) * PER_DECADE)`` (clipped), as :meth:`StepHistogram.add`
    computes it; ``log10`` cost most of the pass (15 ns a step), so the bin is looked up instead:
    ``d = m * 2**e`` falls in the cell ``(e, m's top bits)`` (read from its float64 bits), and a table
    built once per bin layout holds the bin of every cell that no bin edge comes near (the formula evaluated at the
    cell's ends widened by 1e-13 relative, hundreds of float64 steps: the same bin for every ``d`` in
    it, whatever the last bits of ``log10``); the cells an edge crosses (about 3 in 100), zeros and
    values outside the table's range are computed with ``log10`` as before. The same bins, bit for
    bit, at about a third of the cost."""
    from critic_audit.analysis.decompose import HAVE_NUMBA

    if not HAVE_NUMBA:
        return None
    import math

    from numba import njit

    @njit(cache=True, nogil=True)
    def cells(lo, per, nbins, e0, e1, bits):  # pragma: no cover - compiled
        m = 1 << bits
        table = np.empty((e1 - e0) * m, dtype=np.int16)
        for e in range(e0, e1):
            for j in range(m):
                a = math.ldexp(0.5 + 0.5 * j / m, e) * (1.0 - 1e-13)
                b = math.ldexp(0.5 + 0.5 * (j + 1) / m, e) * (1.0 + 1e-13)
                # the steps kernel's formula at both ends (inlined: a call to another kernel defined
                # here would keep numba from caching this one)
                ka = min(max(int(math.floor((math.log10(a) - lo) * per)), -1), nbins - 3) + 2
                kb = min(max(int(math.floor((math.log10(b) - lo) * per)), -1), nbins - 3) + 2
                table[(e - e0) * m + j] = ka if ka == kb else -1  # -1: an edge is near, compute
        return table

    @njit(cache=True, nogil=True)
    def steps(traj, turn, v, incl, lo, per, nbins, counts, n, total, table, e0, e1, bits):  # pragma: no cover - compiled
        m = 1 << bits
        buf = np.empty(1, dtype=np.float64)
        raw = buf.view(np.int64)  # d's bits: exponent and mantissa as frexp gives them, without a call
        for i in range(1, traj.shape[0]):
            c = traj[i]
            if c != traj[i - 1] or not incl[c]:
                continue
            d = abs(v[i] - v[i - 1])
            kind = 0 if turn[i] != turn[i - 1] else 1
            k = -1
            if d > 0:
                buf[0] = d
                e = (raw[0] >> 52) - 1022  # frexp's exponent (d normal: m in [0.5, 1))
                if e0 <= e < e1:
                    k = table[(e - e0) * m + ((raw[0] >> (52 - bits)) & (m - 1))]
            if k < 0:  # zero, out of the table, or an edge near: the formula itself
                k = 0
                if d > 0:
                    k = int(math.floor((math.log10(d) - lo) * per))
                    k = min(max(k, -1), nbins - 3) + 2
            counts[kind, k] += 1
            n[kind] += 1
            total[kind] += d

    def run(traj, turn, v, incl, lo, per, nbins, counts, n, total):
        key = (float(lo), float(per), int(nbins))  # the table holds the bins of these settings only
        table = _CELLS.get(key)
        if table is None:
            table = _CELLS[key] = cells(lo, per, nbins, _CELL_E0, _CELL_E1, _CELL_BITS)
        steps(traj, turn, v, incl, lo, per, nbins, counts, n, total, table, _CELL_E0, _CELL_E1, _CELL_BITS)

    return run


#: the bin tables of _steps_kernel (93k cells each), one per histogram layout ``(LO, PER_DECADE, bins)``,
#: each built on first use (a few ms)
_CELLS: dict[tuple[float, float, int], np.ndarray] = {}
_nb_steps = _steps_kernel()


def _quality_kernel() -> Any:
    """The numba kernel of :meth:`AuditStream._quality_sums` (None without numba): the sums ``bincount``
    forms (each trajectory's terms added in token order from 0.0), so the results are the same bits."""
    from critic_audit.analysis.decompose import HAVE_NUMBA

    if not HAVE_NUMBA:
        return None
    import math

    from numba import njit

    @njit(cache=True, nogil=True)
    def quality(pc, pv, reward, out):  # pragma: no cover - compiled
        L = reward.shape[0]
        n = np.zeros(L)
        s = np.zeros(L)
        for i in range(pc.shape[0]):
            r = reward[pc[i]]
            if not math.isnan(r):
                n[pc[i]] += 1.0
                s[pc[i]] += r - pv[i]
        mean = np.zeros(L)
        for c in range(L):
            mean[c] = s[c] / (n[c] if n[c] > 0 else 1.0)
        m2 = np.zeros(L)
        for i in range(pc.shape[0]):
            r = reward[pc[i]]
            if not math.isnan(r):
                d = (r - pv[i]) - mean[pc[i]]
                m2[pc[i]] += d * d
        for c in range(L):
            if n[c] > 0:
                out[c, 0] = n[c]
                out[c, 1] = mean[c]
                out[c, 2] = m2[c]

    return quality


_nb_quality = _quality_kernel()


class _Open:
    """The selected rows of the trajectory still open at a batch edge (carried to the next batch)."""

    def __init__(self) -> None:
        self.seg: list[np.ndarray] = []
        self.val: list[np.ndarray] = []
        self.mask: list[np.ndarray] = []
        self.turn: list[np.ndarray] = []

    def arrays(self) -> tuple[np.ndarray, ...]:
        def cat(xs: list[np.ndarray], dt: Any) -> np.ndarray:
            return np.concatenate([x.astype(dt, copy=False) for x in xs]) if xs else np.zeros(0, dt)

        return cat(self.seg, np.int64), cat(self.val, np.float32), cat(self.mask, bool), cat(self.turn, np.int64)

    def size(self) -> int:
        return sum(a.size for a in self.seg)


class AuditStream:
    """Per-trajectory sufficient statistics of an audit, accumulated batch by batch (module docstring).

    With a trajectories table (:meth:`add_trajectories` before the tokens), token rows of a trajectory
    it does not hold are an error; without one (``derive=True``), trajectories are numbered in the
    order they appear. Feed token batches with :meth:`add_tokens` (each trajectory's rows contiguous,
    positions strictly increasing), then call :meth:`finish`.
    """

    def __init__(self, scope: str = "assistant", *, derive: bool = False) -> None:
        if scope not in SCOPES:
            raise ConfigError(f"unknown scope {scope!r}", fix="use scope 'assistant' or 'all'")
        self.scope, self.derive = scope, derive
        self.index: dict[str, int] = {}  # trajectory id -> row of the trajectories table
        self.part_index: list[dict[str, int] | None] = []  # per part: its ids -> row (ids qualified per part)
        self.reward: list[np.ndarray] = []
        self.part_of: list[np.ndarray] = []
        self.excluded_before: set[int] = set()
        self._rows: list[np.ndarray] = []  # emitted trajectories' rows, and their sums / quality sums
        self._sums: list[np.ndarray] = []
        self._q: list[np.ndarray] = []
        self._turns: list[tuple[np.ndarray, ...]] = []
        self.steps = StepHistogram()
        self.cur_id: str | None = None  # the open trajectory
        self.cur_part = 0
        self.cur_last_pos = 0
        self.open = _Open()
        self.carry_mask: bool | None = None  # scope all: response_mask of the open trajectory's last selected row
        self.seg_counter = 0
        self.seen: set[str] = set()  # trajectories whose rows have started
        self.n_rows = 0

    # ------------------------------------------------------------------ trajectories

    def add_trajectories(self, ids: Sequence[str], reward: np.ndarray, *, pre_excluded: Iterable[str] = (),
                         index: dict[str, int] | None = None) -> int:
        """Register one part's trajectories (in table order) and return the part number to pass to
        :meth:`add_tokens` for its tokens. ``index``: the part's token ids -> row, when its ids were
        qualified (default: ``ids`` in order after the rows registered so far). Raises SchemaError on an
        id already registered by another part without ``index``."""
        base = len(self.index)
        if index is None:
            index = {}
            for i, t in enumerate(ids):
                if t in self.index:
                    raise SchemaError(f"trajectory id {t!r} appears in more than one input",
                                      fix="give every rollout a unique id")
                index[t] = base + i
        for t, i in zip(ids, range(base, base + len(ids))):
            self.index[t] = i
        self.part_index.append(index)
        self.reward.append(np.asarray(reward, dtype=np.float64))
        self.part_of.append(np.full(len(ids), len(self.part_index) - 1, dtype=np.int32))
        pre = set(pre_excluded)
        self.excluded_before.update(index[t] for t in pre if t in index)
        return len(self.part_index) - 1

    def _lookup(self, ids: list[str], part: int, path: Path) -> np.ndarray:
        """Rows of ``ids`` (a part's token ids); when deriving, a new id gets the next row."""
        if self.derive:
            rows = []
            for t in ids:
                if t not in self.index:
                    self.index[t] = len(self.index)
                rows.append(self.index[t])
            return np.asarray(rows, dtype=np.int64)
        idx = self.part_index[part] or {}
        found = [idx.get(t, -1) for t in ids]
        if -1 in found:
            bad = ids[found.index(-1)]
            raise SchemaError(f"token rows of trajectory {bad!r} belong to a trajectory missing from the "
                              "trajectories table", path=path, record=f"trajectory {bad!r}",
                              fix="write both tables from the same rollouts")
        return np.asarray(found, dtype=np.int64)

    # ------------------------------------------------------------------ tokens

    def add_tokens(self, rb: pa.RecordBatch | pa.Table | pl.DataFrame, path: Path, row0: int, part: int = 0) -> None:
        """Reduce one batch of token rows (``trajectory_id``, ``position``, ``response_mask``, ``value``,
        and ``turn`` when needed) of part ``part``; ``row0``: its first row in ``path`` (for messages).

        Raises:
            SchemaError: see :func:`decompose_parquet`.
        """
        n = rb.height if isinstance(rb, pl.DataFrame) else rb.num_rows
        if n == 0:
            return
        self.n_rows += n
        if isinstance(rb, pl.DataFrame):
            ids_arrow: pa.Array | pl.Series = rb["trajectory_id"].cast(pl.String)
            df = rb.drop("trajectory_id")
        else:
            ids_arrow = rb.column("trajectory_id")
            df = pl.from_arrow(rb.drop_columns(["trajectory_id"]))  # type: ignore[assignment]
        assert isinstance(df, pl.DataFrame)
        from critic_audit.schema import cast_columns

        df = cast_columns(df, {c: t for c, t in _TOKEN_DTYPES.items() if c in df.columns}, "tokens", path=str(path))
        self._check_nulls(ids_arrow, df, path, row0)
        starts, start_ids = _runs(ids_arrow)
        cont = self._check_order(starts, start_ids, df, path, row0)
        sel, seg, val, msk, turn, codes = self._select(df, starts, cont, path, row0)
        self._advance(start_ids, cont, codes, seg, val, msk, turn, part, path)
        self.cur_last_pos = int(df["position"][-1])

    def _check_nulls(self, ids_arrow: pa.Array | pl.Series, df: pl.DataFrame, path: Path, row0: int) -> None:
        for col in ("trajectory_id", "position", "response_mask"):
            ids_nulls = ids_arrow.null_count() if isinstance(ids_arrow, pl.Series) else ids_arrow.null_count
            nulls = ids_nulls if col == "trajectory_id" else df[col].null_count()
            if nulls:
                is_null = ids_arrow.is_null() if col == "trajectory_id" else df[col].is_null()
                at = row0 + int(np.flatnonzero(np.asarray(is_null))[0])
                raise SchemaError(f"column {col!r} has null values", path=path, record=at,
                                  fix=f"fill {col} in every token row")

    def _check_order(self, starts: np.ndarray, start_ids: pl.Series, df: pl.DataFrame,
                     path: Path, row0: int) -> bool:
        """Each trajectory's rows one contiguous run (no trajectory reappears after another one
        started), positions strictly increasing within a trajectory. Returns whether the batch
        continues the open trajectory."""
        cont = self.cur_id is not None and start_ids[0] == self.cur_id
        new_ids = start_ids.slice(1) if cont else start_ids
        dup = new_ids.is_duplicated().to_numpy() if new_ids.len() > 1 else np.zeros(new_ids.len(), bool)
        new_list = new_ids.to_list()
        again = np.fromiter((x in self.seen for x in new_list), dtype=bool, count=len(new_list))
        bad = dup | again
        if bad.any():
            i = int(np.flatnonzero(bad)[0]) + (1 if cont else 0)
            raise SchemaError(
                f"the rows of trajectory {start_ids[i]!r} are not contiguous: it reappears after other "
                "trajectories started (a streaming read needs each trajectory's rows together)",
                path=path, record=row0 + int(starts[i]), fix=_SORT_FIX)
        self.seen.update(new_list)
        pos = df["position"].to_numpy()
        bad_pos = pos[1:] <= pos[:-1]
        bad_pos[starts[1:] - 1] = False  # a new trajectory starts there
        if bad_pos.any() or (cont and pos[0] <= self.cur_last_pos):
            i = 0 if (cont and pos[0] <= self.cur_last_pos) else int(np.flatnonzero(bad_pos)[0]) + 1
            r = int(np.searchsorted(starts, i, side="right")) - 1
            raise SchemaError(
                f"positions of trajectory {start_ids[r]!r} are not strictly increasing (position {pos[i]} "
                f"after {pos[i - 1] if i else self.cur_last_pos})", path=path, record=row0 + i, fix=_SORT_FIX)
        return cont

    def _select(self, df: pl.DataFrame, starts: np.ndarray, cont: bool, path: Path,
                row0: int) -> tuple[np.ndarray, ...]:
        """The rows that enter the decomposition (as :func:`critic_audit.analysis.audit.audit` selects
        them) and their segment, value, response_mask, turn (-1 where null) and run index."""
        R = starts.size
        mask = df["response_mask"].to_numpy()
        vcol = df["value"]
        nulls = vcol.null_count()
        has_value = vcol.is_not_null().to_numpy() if nulls else None
        missing = mask & ~has_value if has_value is not None else None
        if missing is not None and missing.any():
            raise SchemaError(f"{int(missing.sum())} policy token(s) have no critic value", path=path,
                              record=row0 + int(np.flatnonzero(missing)[0]),
                              fix="pass --critic to score them, or fill the value column")
        sel = mask if self.scope == "assistant" else (has_value if has_value is not None else np.ones(mask.size, bool))
        sel_s = pl.Series(sel)
        val = vcol.filter(sel_s).to_numpy()  # no null left: read in place
        if self.scope == "assistant":
            turn_s = df["turn"].filter(sel_s)
            if turn_s.null_count():
                at = row0 + int(np.flatnonzero(sel)[int(np.flatnonzero(turn_s.is_null().to_numpy())[0])])
                raise SchemaError("a policy token (response_mask true) has no turn", path=path, record=at,
                                  fix="number the assistant turns of every policy token")
            seg = turn_s.to_numpy()
            return sel, seg, val, np.ones(seg.size, bool), seg, _codes(sel, starts)
        # scope all: each maximal run of equal response_mask among the selected rows of a trajectory
        codes = _codes(sel, starts)
        m_sel = mask[sel]
        turn = df["turn"].fill_null(-1).to_numpy()[sel] if "turn" in df.columns else None
        if turn is not None and (m_sel & (turn < 0)).any():
            at = row0 + int(np.flatnonzero(sel)[int(np.flatnonzero(m_sel & (turn < 0))[0])])
            raise SchemaError("a policy token (response_mask true) has no turn", path=path, record=at,
                              fix="number the assistant turns of every policy token")
        change = np.ones(m_sel.size, dtype=bool)
        if m_sel.size:
            change[1:] = (m_sel[1:] != m_sel[:-1]) | (codes[1:] != codes[:-1])
            if cont and codes[0] == 0 and self.carry_mask is not None:
                change[0] = bool(m_sel[0]) != self.carry_mask
        seg = self.seg_counter + np.cumsum(change, dtype=np.int64)
        if seg.size:
            self.seg_counter = int(seg[-1])
        open_rows = codes == R - 1
        if open_rows.any():
            self.carry_mask = bool(m_sel[open_rows][-1])
        elif not (cont and R == 1):
            self.carry_mask = None
        return sel, seg, val, m_sel, seg if turn is None else turn, codes

    def _advance(self, start_ids: pl.Series, cont: bool, codes: np.ndarray, seg: np.ndarray, val: np.ndarray,
                 msk: np.ndarray, turn: np.ndarray, part: int, path: Path) -> None:
        """Emit the trajectories the batch completed; keep the rows of the last one (still open). The
        open trajectory, when the batch ends it, is emitted alone (its carried rows and the batch's
        rows of it): the batch's own arrays are never copied behind the carried rows."""
        R = start_ids.len()
        if cont and R == 1:  # the whole batch continues the open trajectory
            for lst, a in ((self.open.seg, seg), (self.open.val, val), (self.open.mask, msk), (self.open.turn, turn)):
                lst.append(a)
        else:
            first = 0
            if self.cur_id is not None:  # the open trajectory ends in this batch (cont) or before it
                k = int(np.searchsorted(codes, 1)) if cont else 0
                if k:
                    for lst, a in ((self.open.seg, seg), (self.open.val, val), (self.open.mask, msk),
                                   (self.open.turn, turn)):
                        lst.append(a[:k])
                oseg, oval, omsk, oturn = self.open.arrays()
                self._emit([self.cur_id], [self.cur_part], np.zeros(oseg.size, np.int64), oseg, oval, omsk, oturn,
                           path=path)
                if cont:
                    first = 1
                    codes, seg, val, msk, turn = codes[k:] - 1, seg[k:], val[k:], msk[k:], turn[k:]
            cut = int(np.searchsorted(codes, R - 1 - first))
            if R - 1 > first:
                ids = start_ids.slice(first, R - 1 - first).to_list()
                self._emit(ids, [part] * len(ids), codes[:cut], seg[:cut], val[:cut], msk[:cut], turn[:cut],
                           path=path)
            self.open = _Open()
            for lst, a in ((self.open.seg, seg), (self.open.val, val), (self.open.mask, msk), (self.open.turn, turn)):
                lst.append(a[cut:])
        self.cur_id = start_ids[R - 1]
        self.cur_part = part

    def _emit(self, ids: list[str], parts: list[int], codes: np.ndarray, seg: np.ndarray, val: np.ndarray,
              msk: np.ndarray, turn: np.ndarray, *, path: Path) -> None:
        """Reduce complete trajectories: ``codes`` 0..len(ids)-1 (sorted) of their selected rows."""
        L = len(ids)
        if len(set(parts)) == 1:
            rows = self._lookup(ids, parts[0], path)
        else:
            rows = np.concatenate([self._lookup([t], p, path) for t, p in zip(ids, parts)])
        sums = trajectory_sums(codes, seg, val, num_trajectories=L, serial=True)
        self._rows.append(rows)
        self._sums.append(sums)
        pol = msk if not msk.all() else None
        pc = codes[pol] if pol is not None else codes
        pv = (val[pol] if pol is not None else val).astype(np.float64)
        pt = turn[pol] if pol is not None else turn
        first = np.ones(pc.size, dtype=bool)
        first[1:] = (pc[1:] != pc[:-1]) | (pt[1:] != pt[:-1])
        at = np.flatnonzero(first)  # first token of each turn
        self._check_turns(ids, pc[at], pt[at], path)
        self._q.append(self._quality_sums(rows, pc, pv, L))
        if at.size:
            cnt = np.diff(np.append(at, pc.size))
            self._turns.append((rows[pc[at]], pt[at].astype(np.int32), cnt, np.add.reduceat(pv, at) / cnt))
        code = statistics_codes(sums)
        incl = (code == 0) & np.fromiter((r not in self.excluded_before for r in rows.tolist()), bool, count=L)
        self.steps.add_consecutive(pc, pt, pv, incl)

    def _check_turns(self, ids: list[str], tc: np.ndarray, tt: np.ndarray, path: Path) -> None:
        """A turn id never reappears after another turn of its trajectory (turns are contiguous runs);
        ``tc``, ``tt``: trajectory code and turn id of each run of equal (code, turn) in token order."""
        pairs = np.stack([tc, tt], axis=1)
        if pairs.shape[0] and not (np.diff(pairs[:, 1])[np.diff(pairs[:, 0]) == 0] > 0).all():
            uniq, counts = np.unique(pairs, axis=0, return_counts=True)
            if (counts > 1).any():
                c, k = uniq[int(np.flatnonzero(counts > 1)[0])]
                raise SchemaError(f"tokens table breaks a row rule: turn_reappears (a turn id reappears after "
                                  f"another turn of the same trajectory; first: trajectory {ids[int(c)]!r} "
                                  f"turn {int(k)})", path=path, record=f"trajectory {ids[int(c)]!r}",
                                  fix="give every policy token its turn and keep each turn one contiguous run "
                                      "(docs/tables.md)")

    def _quality_sums(self, rows: np.ndarray, pc: np.ndarray, pv: np.ndarray, L: int) -> np.ndarray:
        """(L, 3): policy tokens with a reward, mean and sum of squared deviations of ``reward - value``
        (NaN without a reward), the operations of :func:`critic_audit.analysis.audit.audit`'s in order."""
        reward = self._reward_of(rows)
        if _nb_quality is not None:  # one pass per sum, the same additions in the same order
            out = np.full((L, 3), np.nan)
            _nb_quality(pc, pv, reward, out)
            return out
        r = reward[pc]
        ok = ~np.isnan(r)
        b, err = pc[ok], r[ok] - pv[ok]
        n = np.bincount(b, minlength=L).astype(np.float64)
        with np.errstate(invalid="ignore"):  # a non-finite value: NaN sums (its trajectory is excluded)
            mean = np.bincount(b, weights=err, minlength=L) / np.where(n > 0, n, 1.0)
            m2 = np.bincount(b, weights=(err - mean[b]) ** 2, minlength=L)
        have = n > 0
        return np.stack([np.where(have, n, np.nan), np.where(have, mean, np.nan), np.where(have, m2, np.nan)], axis=1)

    def _reward_of(self, rows: np.ndarray) -> np.ndarray:
        if self.derive or not self.reward:
            return np.full(rows.size, np.nan)
        if len(self.reward) > 1:
            self.reward = [np.concatenate(self.reward)]
            self.part_of = [np.concatenate(self.part_of)]
        return self.reward[0][rows]

    def finish(self) -> dict[str, Any]:
        """Close the open trajectory and return the accumulated statistics: ``sums`` (B, NSUMS),
        ``quality`` (B, 3), ``part`` (B,) int32 (the part each trajectory was registered by),
        ``turns`` (rows, turn, n_tokens, mean_value arrays), ``steps`` (:class:`StepHistogram`),
        ``ids`` (B trajectory ids in row order, as registered)."""
        if self.cur_id is not None:
            seg, val, msk, turn = self.open.arrays()
            self._emit([self.cur_id], [self.cur_part], np.zeros(seg.size, np.int64), seg, val, msk, turn,
                       path=Path("?"))
            self.cur_id = None
        B = len(self.index)
        sums = np.zeros((B, NSUMS), dtype=np.float64)
        q = np.full((B, 3), np.nan)
        for rows, s, qq in zip(self._rows, self._sums, self._q):
            sums[rows] = s
            q[rows] = qq
        turns = tuple(np.concatenate([t[i] for t in self._turns]) if self._turns else np.zeros(0, dt)
                      for i, dt in enumerate((np.int64, np.int32, np.int64, np.float64)))
        ids = [""] * B
        for t, i in self.index.items():
            ids[i] = t
        self._reward_of(np.zeros(0, np.int64))
        part = self.part_of[0] if self.part_of and not self.derive else np.zeros(B, np.int32)
        return {"sums": sums, "quality": q, "part": part, "turns": turns, "steps": self.steps, "ids": ids}


def statistics_codes(sums: np.ndarray) -> np.ndarray:
    """Exclusion code of each trajectory of ``sums`` (0 = included; :func:`critic_audit.analysis.decompose.statistics`)."""
    from critic_audit.analysis.decompose import statistics

    return statistics(sums)["code"]


def _batches(files: list[Path], columns: list[str],
             batch_rows: int) -> Iterator[tuple[pa.RecordBatch | pa.Table | pl.DataFrame, Path, int, int]]:
    """``(batch, file, first row, file number)`` of the ``columns`` of each tokens file in order."""
    for k, path in enumerate(files):
        yield from file_batches(path, columns, batch_rows, part=k)


def file_batches(path: Path, columns: list[str], batch_rows: int = 1 << 20,
                 part: int = 0) -> Iterator[tuple[pa.RecordBatch | pa.Table | pl.DataFrame, Path, int, int]]:
    """``(batch, path, first row, part)`` of one tokens Parquet file, trajectory ids dictionary-decoded.

    Raises:
        InputError: a missing or unreadable file. SchemaError: a missing column. ConfigError: no ``value``
            column (optional in docs/tables.md: the tokens are to be scored by a critic).
    """
    if not path.exists():
        raise InputError("file not found", path=path, fix="pass the path of a tokens Parquet file")
    try:
        pf = pq.ParquetFile(path, read_dictionary=["trajectory_id"])  # ids as indices: cheaper to decode
    except Exception as e:  # noqa: BLE001 - pyarrow raises many types for a corrupt file
        raise InputError(f"cannot read Parquet ({(str(e).strip().splitlines() or [type(e).__name__])[0]})",
                         path=path, fix="re-write the tokens table") from None
    have = set(pf.schema_arrow.names)
    for col in columns:
        if col == "value" and col not in have:  # optional (docs/tables.md): the tokens are to be scored
            raise ConfigError("no critic values to audit (the tokens table has no value column)", path=path,
                              fix="pass --critic CHECKPOINT_DIR")
        if col not in have:
            raise SchemaError(f"missing column {col!r} in the tokens table", path=path,
                              fix="write the tokens table with the canonical columns (docs/tables.md)")
    if 0 < pf.metadata.num_rows <= batch_rows and pf.metadata.num_row_groups > 1:
        # one batch: polars reads the whole (small) file on every core, and the per-batch work runs once
        try:
            yield _read_whole(pf, path, columns), path, 0, part
            return
        except (OSError, pl.exceptions.ComputeError, pa.ArrowException):  # the row-group reader names it below
            pass
    row0 = 0
    for rb in pf.iter_batches(batch_size=batch_rows, columns=columns):
        yield rb, path, row0, part
        row0 += rb.num_rows


def _read_whole(pf: pq.ParquetFile, path: Path, columns: list[str]) -> pa.Table:
    """The ``columns`` of a whole (small) tokens file as one batch: the trajectory ids as dictionary
    indices, one chunk per row group with its own dictionary (pyarrow: runs are found on integers, no
    string is built per row; the chunks are neither unified nor concatenated, which cost more than the
    read), the others read by polars on every core."""
    others = [c for c in columns if c != "trajectory_id"]
    ids = pf.read(columns=["trajectory_id"]).column(0)
    cols = pl.read_parquet(path, columns=others, use_pyarrow=False).to_arrow()
    return pa.Table.from_arrays([ids, *(cols.column(c) for c in others)], names=["trajectory_id", *others])


def token_columns(scope: str, *, turn: bool = True) -> list[str]:
    """The token columns the stream reads (``turn``: also with scope ``"all"``, which needs it only for
    the turn means and value steps of the policy tokens)."""
    return ["trajectory_id", "position", "response_mask", "value"] + (["turn"] if turn or scope == "assistant" else [])


def decompose_parquet(
    path_or_paths: str | Path | Iterable[str | Path],
    *,
    scope: str = "assistant",
    batch_rows: int = 1 << 20,
) -> pl.DataFrame:
    """Per-trajectory decomposition of a tokens table read from Parquet in row batches.

    Args:
        path_or_paths: a tokens Parquet file, a folder (its ``*.parquet`` files in name order) or a
            sequence of files read in the given order as one table. Needed columns (docs/tables.md):
            ``trajectory_id`` (str), ``position`` (int), ``response_mask`` (bool), ``value`` (float),
            and ``turn`` (int) for scope ``"assistant"``. Each trajectory's rows contiguous, positions
            strictly increasing, across files too.
        scope: ``"assistant"``: the rows with ``response_mask`` true, one group per ``turn``;
            ``"all"``: the rows with a non-null ``value`` (every policy row must have one), one group
            per maximal run of equal ``response_mask`` among those rows of a trajectory. As in
            :func:`critic_audit.analysis.audit.audit`.
        batch_rows: rows per batch read (memory: about 30 bytes a row, plus the longest trajectory's
            selected rows, plus the output).

    Returns:
        One row per trajectory present in the table (B rows, in table order): ``trajectory_id`` then
        the columns of :func:`critic_audit.analysis.decompose.decompose` (a trajectory without a
        selected token is excluded as ``no_tokens``). Identical to ``decompose`` on the whole selected
        table, whatever ``batch_rows``.

    Raises:
        SchemaError: a trajectory's rows not contiguous (it reappears after another one started) or
            its positions not strictly increasing; a turn id that reappears in a trajectory;
            a missing column; nulls in ``trajectory_id``, ``position``, ``response_mask``; a policy row
            without ``value`` or (scope assistant) ``turn``.
        InputError: a path that does not exist, or a folder without Parquet files.
        ConfigError: an unknown ``scope`` or ``batch_rows < 1``.
    """
    if scope not in SCOPES:
        raise ConfigError(f"unknown scope {scope!r}", fix="use scope 'assistant' or 'all'")
    if batch_rows < 1:
        raise ConfigError(f"batch_rows must be positive, got {batch_rows}", fix="use e.g. batch_rows=1_000_000")
    state = AuditStream(scope, derive=True)
    for rb, path, row0, _ in _batches(_paths(path_or_paths), token_columns(scope, turn=False), batch_rows):
        state.add_tokens(rb, path, row0, part=0)
    out = state.finish()
    return statistics_frame(out["sums"]).insert_column(0, pl.Series("trajectory_id", out["ids"], dtype=pl.String))
