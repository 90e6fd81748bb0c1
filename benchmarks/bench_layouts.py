"""Benchmark: ``check`` and ``analyze`` over a matrix of tokenized-row layouts, each against polars
reading the same file, measured in one run (issue 33, part 3).

Every layout holds the same B rollouts of T tokens (seeded; :func:`bench_check.make_arrays`: a
512-token prompt, assistant turns of 100-900 tokens between tool spans of 50-300, groups of 8 by
``uid``, values, PPO advantages / returns, trainer and sampler log-probs), written as:

  scalar_reward   a scalar ``reward`` column, no per-token rewards (the most common verl export)
  token_reward    only verl's per-token ``token_level_rewards`` (the outcome is their sum)
  both_rewards    bench_check.py's own layout: scalar ``reward`` and ``token_level_rewards``
  float64         every float column float64 (scalar reward)
  int32_leftpad   int32 ids and masks, ``attention_mask`` with left padding (prompts of varying length
                  padded on the left to the batch width), scalar reward
  large_list      every list column a ``large_list``
  nulls_off_mask  values and log-probs null off the response mask
  one_row_group   the whole file one row group (the others hold 256 rows per group)
  jsonl           JSON lines of the scalar_reward layout (polars' ``read_ndjson`` is the reference)
  step_rows       one row per turn (PrimeIntellect verifiers: ``prompt_ids``, ``completion_ids``,
                  ``completion_mask``, ``completion_logprobs``; the reward on the last step): no values,
                  so ``analyze`` needs a critic and is not run

Printed per layout and size, each figure from a fresh child process that first runs the same call
on a 4-row file of the layout (imports and first-call caches are not timed), then the call
``--repeats`` times (medians, as bench_check.py times its calls after a warm-up): polars' read
(``read_parquet`` / ``read_ndjson``), measured in a process of its own just before and just after each
call (read, check, read, analyze, read), and the call's wall time over the mean of the two reads
around it (``/read``; ``cpu/``: the same with CPU seconds of all threads) for ``check_rollouts`` and
for ``analyze`` (values given, ``plots=False``), ns per token of each call (wall), the peak RSS of
each call's process (``VmHWM``: warm-up and calls; ``ru_maxrss`` would count the bench's own RSS at
the fork), the trajectory counts of check and analyze (they must agree) and how check's rows were
read (``ReadReport.rows_read``: ``columnar`` is the fast path). Targets: check <= 3x read;
analyze <= 6x read and <= 1 GB.

With several ``--rows`` sizes (the smaller files are the first rows of the largest: the same groups)
it prints one table per size, with ns per token of each call, and then how cost grows with size: per
layout, ns per token of the read, check and analyze at each size and the ratio largest / smallest
(about 1: linear; a fixed cost shows as a higher figure at the smallest size), the peak RSS and the
kernel's share of each call's CPU (``sys``: page faults of fresh memory, which grow with array size).

    python benchmarks/bench_layouts.py [--rows 250 1000 4000] [--tokens 4096] [--layouts a,b] [--repeats 3]
                                       [--no-analyze] [--json figures.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_check import make_arrays  # noqa: E402

LAYOUTS = ("scalar_reward", "token_reward", "both_rewards", "float64", "int32_leftpad", "large_list",
           "nulls_off_mask", "one_row_group", "jsonl", "step_rows")


def _lists(a: np.ndarray, t, lengths: np.ndarray | None = None, large: bool = False, nulls: np.ndarray | None = None):
    """A list column of the rows of ``a`` (B, T) (each cut to ``lengths`` when given), of type ``t``."""
    import pyarrow as pa

    b, width = a.shape
    n = np.full(b, width, dtype=np.int64) if lengths is None else lengths
    keep = np.arange(width)[None, :] < n[:, None]
    flat = a[keep]
    mask = None if nulls is None else nulls[keep]
    child = pa.array(flat, type=t, mask=mask)
    offsets = np.concatenate([[0], np.cumsum(n)])
    if large:
        return pa.LargeListArray.from_arrays(pa.array(offsets, pa.int64()), child)
    return pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32), pa.int32()), child)


def _table(d: dict, layout: str):
    import pyarrow as pa

    B, T = d["ids"].shape
    f = pa.float64() if layout == "float64" else pa.float32()
    large = layout == "large_list"
    off = (d["mask"] == 0) if layout == "nulls_off_mask" else None
    cols: dict = {"uid": pa.array([f"prompt{i // 8}" for i in range(B)]),
                  "trajectory_id": pa.array([f"traj{i}" for i in range(B)])}
    if layout != "token_reward":
        cols["reward"] = pa.array(d["reward"].astype(np.float64))
    it = pa.int32() if layout == "int32_leftpad" else pa.int64()
    if layout == "int32_leftpad":  # prompts of 0-256 fewer tokens, padded on the left to the width T
        pad = np.random.default_rng(1).integers(0, 256, size=B)
        att = (np.arange(T)[None, :] >= pad[:, None]).astype(np.int64)
        cols["input_ids"] = _lists(np.where(att == 1, d["ids"], 0), it)
        cols["attention_mask"] = _lists(att, it)
        cols["response_mask"] = _lists(d["mask"] * att, it)
    else:
        cols["input_ids"] = _lists(d["ids"], it, large=large)
        cols["response_mask"] = _lists(d["mask"], it, large=large)
    cols["values"] = _lists(d["values"], f, large=large, nulls=off)
    if layout in ("token_reward", "both_rewards"):
        cols["token_level_rewards"] = _lists(d["rewards"], f, large=large)
    for name in ("advantages", "returns"):
        cols[name] = _lists(d[name], f, large=large)
    cols["old_log_probs"] = _lists(d["old"], f, large=large, nulls=off)
    cols["rollout_log_probs"] = _lists(d["sampler"], f, large=large, nulls=off)
    return pa.table(cols)


def _step_rows(d: dict):
    """One row per turn: each step's prompt is the sequence so far, its completion one policy turn."""
    import pyarrow as pa

    ids, mask, lp = d["ids"], d["mask"], d["sampler"]
    rows: dict[str, list] = {k: [] for k in ("trajectory_id", "uid", "prompt_ids", "completion_ids",
                                             "completion_mask", "completion_logprobs", "reward")}
    for i in range(ids.shape[0]):
        m = mask[i].astype(np.int8)
        edge = np.diff(m, prepend=0, append=0)
        starts, stops = np.flatnonzero(edge == 1), np.flatnonzero(edge == -1)
        for k, (a, b) in enumerate(zip(starts, stops)):
            rows["trajectory_id"].append(f"traj{i}")
            rows["uid"].append(f"prompt{i // 8}")
            rows["prompt_ids"].append(ids[i, :a])
            rows["completion_ids"].append(ids[i, a:b])
            rows["completion_mask"].append(np.ones(b - a, dtype=np.int64))
            rows["completion_logprobs"].append(lp[i, a:b])
            rows["reward"].append(float(d["reward"][i]) if k == len(starts) - 1 else None)
    return pa.table({"trajectory_id": rows["trajectory_id"], "uid": rows["uid"],
                     "prompt_ids": pa.array(rows["prompt_ids"], pa.list_(pa.int64())),
                     "completion_ids": pa.array(rows["completion_ids"], pa.list_(pa.int64())),
                     "completion_mask": pa.array(rows["completion_mask"], pa.list_(pa.int64())),
                     "completion_logprobs": pa.array(rows["completion_logprobs"], pa.list_(pa.float32())),
                     "reward": pa.array(rows["reward"], pa.float64())})


def write_layout(d: dict, layout: str, folder: Path) -> Path:
    """Write ``layout`` of the arrays ``d`` into ``folder``; the file's path."""
    import polars as pl
    import pyarrow.parquet as pq

    if layout == "step_rows":
        path = folder / f"{layout}.parquet"
        pq.write_table(_step_rows(d), path, row_group_size=1024)
        return path
    table = _table(d, "scalar_reward" if layout == "jsonl" else layout)
    if layout == "jsonl":
        path = folder / f"{layout}.jsonl"
        pl.from_arrow(table).write_ndjson(path)
        return path
    path = folder / f"{layout}.parquet"
    pq.write_table(table, path, row_group_size=table.num_rows if layout == "one_row_group" else 256)
    return path


_CHILD = r"""
import json, sys, time
mode, path, out, warm, repeats = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])
if mode == "read":
    import polars as pl
    read = (lambda p: pl.read_ndjson(p)) if path.endswith(".jsonl") else (lambda p: pl.read_parquet(p))
    read(warm)
    run = lambda: (read(path).height, None)
elif mode == "check":
    from critic_audit.check import check_rollouts
    check_rollouts([warm])  # imports and first-call caches, on a 4-row file of the same layout
    def run():
        rep = check_rollouts([path])
        return rep.n_trajectories, {"status": rep.status, "fast": rep.input.get("rows_read"),
                                    "skipped": [c.id for c in rep.checks if c.status == "skipped"]}
else:
    from critic_audit.critic.options import ScoringConfig
    from critic_audit.pipeline import analyze
    analyze([warm], out + ".warm", scoring=[ScoringConfig()], plots=False)
    def run():
        res = analyze([path], out, scoring=[ScoringConfig()], plots=False, overwrite=True)
        return res.result.per_trajectory.height, {}
import resource
walls, cpus, syss = [], [], []
for _ in range(repeats):
    t, c, s = time.perf_counter(), time.process_time(), resource.getrusage(resource.RUSAGE_SELF).ru_stime
    n, extra = run()
    walls.append(time.perf_counter() - t)
    cpus.append(time.process_time() - c)
    syss.append(resource.getrusage(resource.RUSAGE_SELF).ru_stime - s)
# VmHWM: the peak RSS of this process's own address space (ru_maxrss would also count the parent's
# RSS at the fork, here the bench's arrays)
hwm = next(int(x.split()[1]) for x in open("/proc/self/status") if x.startswith("VmHWM:"))
print(json.dumps({"wall": sorted(walls)[len(walls) // 2], "cpu": sorted(cpus)[len(cpus) // 2],
                  "sys": sorted(syss)[len(syss) // 2], "rss_mb": hwm / 1024, "n": n, **(extra or {})}))
"""


def _child(mode: str, path: Path, out: Path, warm: Path, repeats: int) -> dict:
    """Run ``mode`` (read / check / analyze) on ``path`` ``repeats`` times in a fresh process: the
    median wall and CPU seconds of the call (after a warm-up call on ``warm``), the process's peak RSS
    and the trajectory count."""
    p = subprocess.run([sys.executable, "-c", _CHILD, mode, str(path), str(out), str(warm), str(repeats)],
                       capture_output=True, text=True)
    if p.returncode:
        line = (p.stderr.strip().splitlines() or ["?"])[-1]
        return {"error": line[:160]}
    return json.loads(p.stdout.strip().splitlines()[-1])


def _ratios(got: dict, before: dict, after: dict) -> dict:
    """``got``'s figures with its ratio to the mean of the two reads around it (wall and CPU)."""
    if "error" in got:
        return got
    if "error" in before or "error" in after:
        return {"error": f"read: {before.get('error') or after.get('error')}"}
    read, read_cpu = (before["wall"] + after["wall"]) / 2, (before["cpu"] + after["cpu"]) / 2
    return {**got, "read": read, "read_cpu": read_cpu, "ratio": got["wall"] / read, "cpu_ratio": got["cpu"] / read_cpu}


def measure(layout: str, d: dict, small: dict, repeats: int, analyze: bool) -> dict:
    """Write ``layout`` of the arrays ``d`` and time check and analyze on it, each between two reads of
    polars in a process of their own (read, check, read, analyze, read: a shared machine's load changes
    slowly): ``{"mb", "check": {...}, "analyze": {...}}``, each with ``wall`` / ``cpu`` (median seconds),
    ``rss_mb``, ``n`` and its ratios to the reads (``ratio``, ``cpu_ratio``), or ``error``."""
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "warm").mkdir()
        warm = write_layout(small, layout, Path(tmp) / "warm")
        path = write_layout(d, layout, Path(tmp))
        out = {"mb": path.stat().st_size / 2**20}
        r0 = _child("read", path, Path(tmp) / "unused", warm, repeats)
        c = _child("check", path, Path(tmp) / "unused", warm, repeats)
        r1 = _child("read", path, Path(tmp) / "unused", warm, repeats)
        out["check"] = _ratios(c, r0, r1)
        if layout == "step_rows":
            out["analyze"] = {"error": "n/a: no values"}
        elif not analyze:
            out["analyze"] = {"error": "not run"}
        else:
            a = _child("analyze", path, Path(tmp) / "audit", warm, repeats)
            r2 = _child("read", path, Path(tmp) / "unused", warm, repeats)
            out["analyze"] = _ratios(a, r1, r2)
        return out


def _row(layout: str, m: dict, tokens: int) -> str:
    """One line of the per-size table."""
    c, a = m["check"], m["analyze"]
    line = f"{layout:15s} {m['mb']:5.0f} {c.get('read', float('nan')):6.3f} "
    for r in (c, a):
        line += (f"{r['wall']:7.2f} {r['ratio']:6.2f} {r['cpu_ratio']:5.2f} {1e9 * r['wall'] / tokens:6.0f} "
                 f"{r['rss_mb']:6.0f}  " if "error" not in r else f"{r['error'][:34]:>34s}  ")
    return line + f"{c.get('n', '-')!s:>6s} {a.get('n', '-')!s:>6s}  {c.get('fast')}"


def _growth(results: dict, layouts: list[str], sizes: list[int], tokens: int) -> None:
    """How cost grows with size: per layout, ns per token of check and analyze (wall; CPU of all threads)
    at each size and their ratio largest / smallest (1.0: linear; above: superlinear), the peak RSS and
    the kernel's share of the call's CPU (system time: first touches of fresh memory)."""
    lo, hi = sizes[0], sizes[-1]
    print(f"\nhow cost grows with size ({lo} -> {hi} rows): ns/token wall (CPU) at each size, largest / smallest; "
          "peak RSS MB")
    for layout in layouts:
        parts = []
        for kind in ("read", "check", "analyze"):
            src = "check" if kind == "read" else kind
            got = [results[(layout, b)][src] for b in sizes]
            if any("error" in g for g in got):
                continue
            w = [1e9 * (g["read"] if kind == "read" else g["wall"]) / (b * tokens) for g, b in zip(got, sizes)]
            cpu = [1e9 * (g["read_cpu"] if kind == "read" else g["cpu"]) / (b * tokens) for g, b in zip(got, sizes)]
            rss = "" if kind == "read" else " RSS " + "/".join(f"{g['rss_mb']:.0f}" for g in got)
            if kind != "read":  # the kernel's share of the CPU (page faults of fresh memory)
                rss += " sys " + "/".join(f"{100 * g['sys'] / max(g['cpu'], 1e-9):.0f}%" for g in got)
            parts.append(f"{kind} " + "/".join(f"{x:.0f}" for x in w) + f" ({'/'.join(f'{x:.0f}' for x in cpu)}) "
                         f"x{w[-1] / w[0]:.2f} (x{cpu[-1] / cpu[0]:.2f}){rss}")
        print(f"{layout:15s} " + "; ".join(parts))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, nargs="+", default=[1000], help="rows per file; several: one table per size")
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--layouts", default=",".join(LAYOUTS))
    ap.add_argument("--repeats", type=int, default=3, help="calls per child process (median)")
    ap.add_argument("--no-analyze", action="store_true")
    ap.add_argument("--json", type=Path, help="also write every figure to this JSON file")
    args = ap.parse_args()
    layouts = [x for x in args.layouts.split(",") if x]
    unknown = [x for x in layouts if x not in LAYOUTS]
    if unknown:
        raise SystemExit(f"unknown layout(s) {unknown}; choose from {list(LAYOUTS)}")
    sizes = sorted(set(args.rows))
    full = make_arrays(sizes[-1], args.tokens)  # the smaller files are its first rows (same groups of 8)
    small = {k: v[:4] for k, v in full.items()}
    results: dict = {}
    for rows in sizes:
        d = {k: v[:rows] for k, v in full.items()}
        tokens = rows * args.tokens
        print(f"\n{rows} rows x {args.tokens} tokens = {tokens / 1e6:.1f}M tokens per layout")
        print(f"{'layout':15s} {'MB':>5s} {'read s':>6s} {'check s':>7s} {'/read':>6s} {'cpu/':>5s} {'ns/tok':>6s} "
              f"{'RSS MB':>6s}  {'analyze s':>7s} {'/read':>6s} {'cpu/':>5s} {'ns/tok':>6s} {'RSS MB':>6s}  "
              f"{'n chk':>6s} {'n ana':>6s}  rows read")
        for layout in layouts:
            m = results[(layout, rows)] = measure(layout, d, small, args.repeats, not args.no_analyze)
            print(_row(layout, m, tokens), flush=True)
            if m["check"].get("skipped") and rows == sizes[0]:
                print(f"{'':15s} check skipped: {', '.join(m['check']['skipped'])}")
    if len(sizes) > 1:
        _growth(results, layouts, sizes, args.tokens)
    if args.json:
        args.json.write_text(json.dumps([{"layout": k[0], "rows": k[1], "tokens": k[1] * args.tokens, **v}
                                         for k, v in results.items()], indent=1) + "\n")


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
