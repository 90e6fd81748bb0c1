"""Benchmark: ``critic-audit analyze`` on a whole run's verl dumps, at several sizes, against polars
reading the same tokens files, measured in one run.

Each size is a dump folder written by the project's own :func:`critic_audit.io.verl_dump.dump_verl_batch`
(seeded): ``--steps`` training steps of ``--rows`` rows x ``--tokens`` tokens (a 512-token prompt, then
assistant turns of 100-900 tokens separated by 50-300 tool tokens), ``values`` given (a per-turn level
plus token noise, so the audit has structure to find), ``token_level_rewards`` with the 0/1 outcome on
the last policy token, ``uid`` in groups of 8. The folders are written once per size and kept under
``--dir`` (re-used when present: writing 100M tokens takes minutes).

Printed per size, from one run:

  (a) polars: ``pl.read_parquet`` of every ``step_*.tokens.parquet`` of the folder, one after the other
      (the reference; in a fresh subprocess, peak RSS too; the median of ``--read-repeat`` runs, 3: cheap);
  (b) ``critic-audit analyze DIR --out OUT`` in a fresh subprocess (defaults: values given, so no critic
      and the streamed path; plots and reports written, PNG and SVG, drawn by analyze's second process,
      ``critic_audit.plot_process``): wall time, its ratio to (a) (target <= 5), CPU time of all threads
      of both processes and its ratio to (a)'s (the robust figure on a shared, loaded machine), time per
      token (wall and CPU) and peak resident memory (``ru_maxrss``: the largest of the two processes,
      the main one; the plot process peaks at ~260 MB beside it; target <= 1.5 GB); the median of
      ``--repeat`` runs (1: the 100M-token size takes tens of seconds);

then the ratio of the largest size's peak RSS to the smallest's (target <= 1.25: flat), and a table.

Before the sizes, ``analyze`` runs once on a tiny dump (1 step of 16 x 512 tokens, not measured): the
numba kernels are compiled into their on-disk cache as by any first run after an install or an edit, so
that no size pays a one-time compilation.

The load average of the machine is printed with each size and at the end (other processes slow the
wall times down, and the ratios with them); docs/audit.md ("A whole run on one machine") has the
figures measured.

    nice -n 10 python benchmarks/bench_scale.py [--steps 8 30 96] [--rows 256] [--tokens 4096] [--dir DIR]
        [--repeat 1] [--read-repeat 3] [--no-plots]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


def write_run(folder: Path, steps: int, rows: int, tokens: int, seed: int = 0) -> None:
    """Write ``steps`` verl batches of ``rows x tokens`` into ``folder`` with ``dump_verl_batch``."""
    from critic_audit.io.verl_dump import dump_verl_batch

    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    p = min(512, tokens // 8)
    r = tokens - p
    for step in range(steps):
        if (folder / f"step_{step:08d}.tokens.parquet").exists():
            continue
        mask = np.zeros((rows, r), dtype=bool)
        level = np.zeros((rows, r), dtype=np.float32)
        for i in range(rows):  # turns of 100-900 tokens, tool spans of 50-300
            pos = 0
            while pos < r:
                n = int(rng.integers(100, 900))
                mask[i, pos:pos + n] = True
                level[i, pos:pos + n] = rng.normal()
                pos += n + int(rng.integers(50, 300))
        values = (level + 0.3 * rng.normal(size=(rows, r))).astype(np.float32)
        reward = rng.integers(0, 2, size=rows).astype(np.float32)
        values += 0.5 * reward[:, None]  # a critic that knows something
        last = r - 1 - np.argmax(mask[:, ::-1], axis=1)
        tlr = np.zeros((rows, r), dtype=np.float32)
        tlr[np.arange(rows), last] = reward
        batch = {
            "prompts": rng.integers(0, 150_000, size=(rows, p)), "responses": rng.integers(0, 150_000, size=(rows, r)),
            "response_mask": mask, "values": values, "token_level_rewards": tlr,
            "uid": np.array([f"s{step}p{i // 8}" for i in range(rows)], dtype=object),
        }
        dump_verl_batch(batch, folder, step=step)


def _child(cmd: list[str]) -> tuple[float, float, float, int, str]:
    """(wall seconds, CPU seconds of all its threads, peak RSS in MB, exit code, stderr tail) of ``cmd`` in
    a fresh process (``getrusage`` of a wrapper that runs only it, so no earlier child counts)."""
    wrapper = ("import resource, subprocess, sys, time; t = time.perf_counter(); "
               "p = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True); "
               "sys.stderr.write(p.stderr[-2000:]); r = resource.getrusage(resource.RUSAGE_CHILDREN); "
               "print(time.perf_counter() - t, r.ru_utime + r.ru_stime, r.ru_maxrss, p.returncode)")
    out = subprocess.run([sys.executable, "-c", wrapper, *cmd], capture_output=True, text=True, check=True)
    wall, cpu, kb, rc = out.stdout.split()
    return float(wall), float(cpu), int(kb) / 1024, int(rc), out.stderr


def _load() -> str:
    """The machine's load average (1, 5 and 15 minutes), as ``uptime`` prints it."""
    return ", ".join(f"{x:.2f}" for x in os.getloadavg())


def _median(runs: list[tuple]) -> tuple[float, float, float]:
    """Median wall, CPU and peak RSS (each its own median) of ``_child`` results."""
    return tuple(float(np.median([r[i] for r in runs])) for i in range(3))  # type: ignore[return-value]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, nargs="+", default=[8, 30], help="steps per size (one size each)")
    ap.add_argument("--rows", type=int, default=256)
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()) / "critic_audit_bench_scale")
    ap.add_argument("--no-plots", action="store_true", help="analyze with --no-plots")
    ap.add_argument("--repeat", type=int, default=1, help="analyze runs per size (median reported)")
    ap.add_argument("--read-repeat", type=int, default=3, help="polars reads per size (median reported)")
    args = ap.parse_args()
    import pyarrow.parquet as pq

    tiny = args.dir / "run_warmup"
    write_run(tiny, 1, 16, 512)
    _child([sys.executable, "-m", "critic_audit.cli", "analyze", str(tiny), "--out", str(args.dir / "audit_warmup"),
            "--overwrite"])
    rows = []
    for steps in args.steps:
        folder = args.dir / f"run_{steps}x{args.rows}x{args.tokens}"
        t0 = time.perf_counter()
        write_run(folder, steps, args.rows, args.tokens)
        files = sorted(folder.glob("step_*.tokens.parquet"))[:steps]
        n_tok = sum(pq.ParquetFile(f).metadata.num_rows for f in files)
        size = sum(f.stat().st_size for f in files) / 2**20
        print(f"size {steps} steps: {n_tok / 1e6:.1f}M tokens in {len(files)} tokens files ({size:.0f} MB; "
              f"{time.perf_counter() - t0:.0f} s to write or find); load average {_load()}", flush=True)
        read = ("import sys, polars as pl\n"
                "for f in sys.argv[1:]: pl.read_parquet(f)\n")
        subprocess.run([sys.executable, "-c", read, *map(str, files)], check=True)  # warm the page cache
        t_read, c_read, read_mb = _median([_child([sys.executable, "-c", read, *map(str, files)])
                                           for _ in range(args.read_repeat)])
        out = args.dir / f"audit_{steps}"
        cmd = [sys.executable, "-m", "critic_audit.cli", "analyze", str(folder), "--out", str(out), "--overwrite",
               *(["--no-plots"] if args.no_plots else [])]
        runs = [_child(cmd) for _ in range(args.repeat)]
        for r in runs:
            if r[3]:
                print(r[4], file=sys.stderr)
        wall, cpu, mb = _median(runs)
        rc = max(r[3] for r in runs)
        print(f"  (a) polars read  {t_read:7.2f} s wall, {c_read:7.2f} s CPU, peak RSS {read_mb:6.0f} MB", flush=True)
        print(f"  (b) analyze      {wall:7.2f} s wall = {wall / t_read:5.2f}x the read (target <= 5), "
              f"{cpu:7.2f} s CPU = {cpu / c_read:5.2f}x, {1e9 * wall / n_tok:6.0f} ns/token wall, "
              f"{1e9 * cpu / n_tok:5.0f} ns/token CPU, "
              f"peak RSS {mb:6.0f} MB (target <= 1536; exit {rc})", flush=True)
        rows.append((steps, n_tok, t_read, wall, mb, c_read, cpu))
    print(f"load average at the end {_load()} (1, 5, 15 min; 2 cores)")
    if len(rows) > 1:
        lo, hi = min(rows, key=lambda r: r[1]), max(rows, key=lambda r: r[1])
        print(f"RATIO peak RSS {hi[1] / 1e6:.1f}M / {lo[1] / 1e6:.1f}M tokens = {hi[4] / lo[4]:.2f} (target <= 1.25)")
    for steps, n_tok, t_read, wall, mb, c_read, cpu in rows:
        print(f"RATIO analyze / read at {n_tok / 1e6:.1f}M tokens = {wall / t_read:.2f} wall, {cpu / c_read:.2f} CPU "
              f"(target <= 5); peak {mb:.0f} MB")
    print("| tokens | polars read wall / CPU (s) | analyze wall / CPU (s) | ratio wall / CPU | ns/token wall / CPU "
          "| peak RSS (MB) |")
    print("|---|---|---|---|---|---|")
    for steps, n_tok, t_read, wall, mb, c_read, cpu in rows:
        print(f"| {n_tok / 1e6:.1f}M | {t_read:.2f} / {c_read:.2f} | {wall:.2f} / {cpu:.2f} | "
              f"{wall / t_read:.2f} / {cpu / c_read:.2f} | {1e9 * wall / n_tok:.0f} / {1e9 * cpu / n_tok:.0f} | {mb:.0f} |")


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
