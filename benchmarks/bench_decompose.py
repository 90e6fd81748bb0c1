"""Benchmark: the per-trajectory between/within-turn decomposition (AUDIT.md; MPO, arXiv:2610.35013).

Synthetic tokens (seeded): trajectories with a random number of turns (2-20) of random lengths
(1-400 tokens), int32 trajectory index, int32 turn index, float32 values (trajectory offset + turn offset
+ noise), sorted by trajectory. Compared, in one run:

  (a) numpy reference: per-trajectory SS_T / SS_B / SS_W with ``numpy.bincount`` (written below;
      only the three sums, fewer statistics than ours);
  (b) naive pandas: ``groupby(trajectory).apply`` of a per-trajectory function, timed on a subsample
      of whole trajectories (``--pandas-tokens``) and scaled linearly to tokens/s;
  (c) ours: ``critic_audit.analysis.decompose.decompose`` (every statistic, exclusions, DataFrame);
  (d) ours streaming: ``critic_audit.analysis.stream.decompose_parquet`` over the same tokens written
      as a canonical tokens Parquet table (string ids, all rows policy tokens).

Timings are medians over ``--repeats`` runs (after one untimed warm-up: numba compiles or loads its
cache). Peak memory is measured in a fresh subprocess per method (see the printed note).

    python benchmarks/bench_decompose.py [--tokens 50000000] [--repeats 3] [--pandas-tokens 1000000]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


def make_tokens(n_tokens: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """(traj int32, turn int32, values float32, B) for exactly ``n_tokens`` tokens, sorted by traj."""
    rng = np.random.default_rng(seed)
    est_turns = n_tokens // 200 + 64
    k_per = rng.integers(2, 21, size=est_turns // 2 + 16)  # turns per trajectory
    traj_of_turn = np.repeat(np.arange(k_per.size, dtype=np.int32), k_per)
    lens = rng.integers(1, 401, size=traj_of_turn.size)
    while lens.sum() < n_tokens:  # (only for tiny n_tokens)
        lens = lens * 2
    cum = np.cumsum(lens)
    G = int(np.searchsorted(cum, n_tokens) + 1)
    traj_of_turn, lens = traj_of_turn[:G], lens[:G].copy()
    lens[-1] -= int(cum[G - 1] - n_tokens)
    first_turn = np.concatenate([[0], np.cumsum(k_per)[:-1]])
    turn_idx = (np.arange(G) - first_turn[traj_of_turn]).astype(np.int32)
    B = int(traj_of_turn[-1] + 1)
    traj = np.repeat(traj_of_turn, lens)
    seg = np.repeat(turn_idx, lens)
    turn_effect = (rng.normal(size=B)[traj_of_turn] + rng.normal(size=G) * 0.8).astype(np.float32)
    v = rng.standard_normal(n_tokens, dtype=np.float32) * np.float32(0.5)
    v += np.repeat(turn_effect, lens)
    return traj, seg, v, B


def numpy_reference(traj: np.ndarray, seg: np.ndarray, v: np.ndarray, B: int):
    """Per-trajectory SS_T, SS_B, SS_W with numpy.bincount (two-pass, float64)."""
    t = traj.astype(np.int64)
    change = np.empty(t.size, dtype=bool)
    change[0] = True
    change[1:] = (t[1:] != t[:-1]) | (seg[1:] != seg[:-1])
    g = np.cumsum(change) - 1
    G = int(g[-1] + 1)
    x = v.astype(np.float64)
    N = np.bincount(t, minlength=B)
    m = np.bincount(t, x, B) / N
    n_g = np.bincount(g, minlength=G)
    m_g = np.bincount(g, x, G) / n_g
    d = x - m[t]
    ss_t = np.bincount(t, d * d, B)
    r = x - m_g[g]
    ss_w = np.bincount(t, r * r, B)
    g_t = t[change]
    ss_b = np.bincount(g_t, n_g * (m_g - m[g_t]) ** 2, B)
    return ss_t, ss_b, ss_w


def pandas_naive(traj: np.ndarray, seg: np.ndarray, v: np.ndarray):
    """groupby(trajectory).apply of a per-trajectory pandas function (the naive way)."""
    import pandas as pd

    df = pd.DataFrame({"traj": traj, "turn": seg, "value": v.astype(np.float64)})

    def one(g):
        m = g["value"].mean()
        turns = g.groupby("turn")["value"]
        mk, nk = turns.transform("mean"), turns.transform("size")
        ss_t = ((g["value"] - m) ** 2).sum()
        ss_w = ((g["value"] - mk) ** 2).sum()
        tm = turns.mean()
        ss_b = (turns.size() * (tm - m) ** 2).sum()
        del nk
        return pd.Series({"ss_total": ss_t, "ss_between": ss_b, "ss_within": ss_w})

    return df.groupby("traj")[["turn", "value"]].apply(one)


def write_parquet(path: Path, traj: np.ndarray, seg: np.ndarray, v: np.ndarray) -> None:
    import polars as pl

    df = pl.DataFrame({"b": traj, "turn": seg, "value": v})
    df = df.with_columns(
        trajectory_id=pl.format("traj-{}", pl.col("b").cast(pl.String).str.zfill(8)),
        position=pl.int_range(pl.len(), dtype=pl.Int32).over("b"),
        response_mask=pl.lit(True),
    ).select("trajectory_id", "position", "turn", "response_mask", "value")
    df.write_parquet(path, row_group_size=1 << 20)


def timed(fn, repeats: int) -> tuple[float, list[float]]:
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts), ts


def _rss_kib() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * (os.sysconf("SC_PAGE_SIZE") // 1024)


def _hwm_kib() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM"):
                return int(line.split()[1])
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def _reset_peak() -> bool:
    """Reset the peak resident size (VmHWM) of this process (Linux >= 4.0); False if not possible."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def child_memory(method: str, folder: str, batch_rows: int) -> None:
    """Fresh process: warm up, load the arrays, then measure the peak during one call."""
    import tracemalloc

    from critic_audit.analysis.decompose import decompose
    from critic_audit.analysis.stream import decompose_parquet

    small = [np.zeros(10, np.int32), np.arange(10, dtype=np.int32) // 5, np.arange(10, dtype=np.float32)]
    decompose(*small)  # numba: compile or load the cache before measuring
    numpy_reference(*small, 1)
    if method == "stream":
        fn = lambda: decompose_parquet(Path(folder) / "tokens.parquet", batch_rows=batch_rows)  # noqa: E731
        inputs = 0
    else:
        traj = np.load(Path(folder) / "traj.npy")
        seg = np.load(Path(folder) / "seg.npy")
        v = np.load(Path(folder) / "v.npy")
        B = int(traj[-1]) + 1
        inputs = traj.nbytes + seg.nbytes + v.nbytes
        fn = {"ours": lambda: decompose(traj, seg, v, B), "numpy": lambda: numpy_reference(traj, seg, v, B)}[method]
    rss0 = _rss_kib()
    reset = _reset_peak()
    base = _hwm_kib() if reset else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    tracemalloc.start()
    fn()
    tm_peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    peak = _hwm_kib() if reset else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB
    print(json.dumps({"inputs": inputs, "extra_rss": (peak - rss0) * 1024, "tracemalloc_peak": tm_peak,
                      "rss_before": rss0 * 1024, "peak_reset": reset, "hwm_before": base * 1024}))


def measure_memory(method: str, folder: str, batch_rows: int) -> dict:
    out = subprocess.run([sys.executable, __file__, "--_child", method, "--_folder", folder,
                          "--batch-rows", str(batch_rows)], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=50_000_000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--pandas-tokens", type=int, default=1_000_000)
    ap.add_argument("--batch-rows", type=int, default=1 << 20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--_child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--_folder", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args._child:
        child_memory(args._child, args._folder, args.batch_rows)
        return

    from critic_audit.analysis import decompose as dmod
    from critic_audit.analysis.stream import decompose_parquet

    t0 = time.perf_counter()
    traj, seg, v, B = make_tokens(args.tokens, args.seed)
    N = traj.size
    in_bytes = traj.nbytes + seg.nbytes + v.nbytes
    print(f"tokens N={N:,}  trajectories B={B:,}  turns={int(np.count_nonzero(np.diff(seg) != 0) + 1):,}  "
          f"seed={args.seed}  (generated in {time.perf_counter() - t0:.1f}s)")
    print(f"inputs: traj int32 + turn int32 + value float32 = {in_bytes / 2**20:.0f} MiB;  "
          f"cpu cores: {os.cpu_count()}, numba: {dmod.HAVE_NUMBA}"
          + (f" ({dmod.numba.get_num_threads()} threads)" if dmod.HAVE_NUMBA else "")
          + f";  medians of {args.repeats} repeats")

    t0 = time.perf_counter()
    ours_df = dmod.decompose(traj, seg, v, B)  # warm-up: numba compile or cache load
    print(f"warm-up (numba compile/cache load + first run): {time.perf_counter() - t0:.2f}s")
    results = {}

    med, ts = timed(lambda: numpy_reference(traj, seg, v, B), args.repeats)
    results["numpy"] = N / med
    ref = numpy_reference(traj, seg, v, B)
    for name, col in zip(("ss_total", "ss_between", "ss_within"), ref):
        got = ours_df[name].to_numpy()
        ok = np.isfinite(got)
        err = np.max(np.abs(got[ok] - col[ok]) / np.maximum(1.0, np.abs(col[ok])))
        assert err < 1e-9, (name, err)
    print(f"(a) numpy bincount reference:   {N / med / 1e6:8.1f} M tokens/s  (median {med:.2f}s)")

    # pandas on a subsample of whole trajectories
    cut = int(np.searchsorted(traj, traj[min(args.pandas_tokens, N) - 1], side="right"))
    med_p, _ = timed(lambda: pandas_naive(traj[:cut], seg[:cut], v[:cut]), args.repeats)
    results["pandas"] = cut / med_p
    print(f"(b) pandas groupby().apply:     {cut / med_p / 1e6:8.3f} M tokens/s  (timed on a subsample of "
          f"{cut:,} tokens / {int(traj[cut - 1]) + 1} trajectories, median {med_p:.2f}s; "
          f"scaled linearly to N: ~{N / (cut / med_p):.0f}s)")

    med_o, ts = timed(lambda: dmod.decompose(traj, seg, v, B), args.repeats)
    results["ours"] = N / med_o
    print(f"(c) ours, decompose():          {N / med_o / 1e6:8.1f} M tokens/s  (median {med_o:.2f}s; "
          f"runs {', '.join(f'{t:.2f}' for t in ts)}s)")

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "tokens.parquet"
        t0 = time.perf_counter()
        write_parquet(path, traj, seg, v)
        size = path.stat().st_size
        print(f"    (wrote {path.name}: {size / 2**20:.0f} MiB in {time.perf_counter() - t0:.1f}s)")
        decompose_parquet(path, batch_rows=args.batch_rows)  # warm (page cache)
        med_s, _ = timed(lambda: decompose_parquet(path, batch_rows=args.batch_rows), args.repeats)
        results["stream"] = N / med_s
        streamed = decompose_parquet(path, batch_rows=args.batch_rows)
        same = streamed.drop("trajectory_id").equals(ours_df)
        print(f"(d) ours, decompose_parquet():  {N / med_s / 1e6:8.1f} M tokens/s  (median {med_s:.2f}s; "
              f"batch_rows={args.batch_rows:,}; reads + decodes the Parquet file from the page cache; "
              f"result identical to (c): {same})")

        print()
        print(f"ours / numpy reference: {results['ours'] / results['numpy']:6.1f}x")
        print(f"ours / naive pandas:    {results['ours'] / results['pandas']:6.0f}x")
        print(f"streaming / numpy ref:  {results['stream'] / results['numpy']:6.1f}x")

        np.save(Path(tmp) / "traj.npy", traj)
        np.save(Path(tmp) / "seg.npy", seg)
        np.save(Path(tmp) / "v.npy", v)
        del ours_df, streamed
        print()
        print("peak memory, each in a fresh subprocess: warm-up, load the inputs (np.load), reset the peak\n"
              "resident size (/proc/self/clear_refs, else ru_maxrss), one call. 'extra RSS' = peak RSS during the\n"
              "call (VmHWM) - RSS before it: every allocation (numpy, numba, polars, pyarrow); 'tracemalloc'\n"
              "sees numpy/Python allocations only. peak / inputs = (inputs + extra RSS) / inputs.")
        for method in ("numpy", "ours", "stream"):
            mem = measure_memory(method, tmp, args.batch_rows)
            label = {"numpy": "(a) numpy reference", "ours": "(c) ours", "stream": "(d) streaming"}[method]
            extra, tm = mem["extra_rss"] / 2**20, mem["tracemalloc_peak"] / 2**20
            if method == "stream":
                print(f"{label:22s} extra RSS {extra:8.0f} MiB, tracemalloc {tm:7.0f} MiB "
                      f"(inputs stay on disk: Parquet {size / 2**20:.0f} MiB; bounded by batch_rows)")
            else:
                print(f"{label:22s} extra RSS {extra:8.0f} MiB, tracemalloc {tm:7.0f} MiB;  "
                      f"peak / inputs = {(mem['inputs'] / 2**20 + extra) / (in_bytes / 2**20):.2f}x "
                      f"(inputs {mem['inputs'] / 2**20:.0f} MiB)")


if __name__ == "__main__":
    main()
