"""Benchmark critic inference on real tau-bench airline rollouts with the SmolLM2-135M backbone.

Compares, in one run:

1. naive: one trajectory at a time, float32, a plain ``backbone(input_ids)`` + head per trajectory;
2. ``score_values`` in float32 (sorted batching under a token budget, right padding, no mask);
3. ``score_values`` in bfloat16 (head still float32);
4. optionally (``--with-mask``) ``score_values`` float32 passing the padding mask;
5. ``score_values_cached`` (resumable: chunks written to a cache folder) in bfloat16, after the others.

Prints tokens/s of each, the speed-up over naive, padding efficiency, and the max abs difference of the
values against naive; then the padding efficiency of sorted batching vs batching in input order under
the same token budget (computed from the batch plans, no model run), and a ratio summary. The critic is the cached SmolLM2 backbone with a random value head (timing and
agreement do not depend on the head being trained).

Usage::

    python benchmarks/bench_inference.py            # 30 shortest trajectories (~1 min of bf16, ~5 of fp32 on 2 cores)
    python benchmarks/bench_inference.py --n 30 --select first --max-tokens 4096
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from critic_audit.critic import (
    cached_backbone,
    load_critic,
    load_tokenizer,
    plan_batches,
    save_critic,
    score_values,
    score_values_cached,
)

DATA = Path("/work/shared/data/tau_bench_airline/historical_trajectories/gpt-4o-airline.json")


def render(messages: list[dict]) -> list[dict]:
    """Chat messages -> plain {role, content} with tool calls written out as text."""
    out = []
    for m in messages:
        text = m.get("content") or ""
        for tc in m.get("tool_calls") or []:
            fn = tc.get("function", tc)
            args = fn.get("arguments")
            if not isinstance(args, str):
                args = json.dumps(args)
            text += f"\n<tool_call>{json.dumps({'name': fn.get('name'), 'arguments': args})}</tool_call>"
        out.append({"role": m.get("role", "user"), "content": text})
    return out


def tokenize(tokenizer, records: list[dict], max_tokens: int) -> list[np.ndarray]:
    seqs = []
    for r in records:
        ids = tokenizer.apply_chat_template(render(r["traj"]), tokenize=True)
        ids = ids["input_ids"] if hasattr(ids, "keys") else ids
        seqs.append(np.asarray(ids[:max_tokens], dtype=np.int64))
    return seqs


def naive(critic, seqs: list[np.ndarray]) -> tuple[list[np.ndarray], float]:
    t0 = time.perf_counter()
    out = []
    with torch.inference_mode():
        for s in seqs:
            h = critic.backbone(input_ids=torch.as_tensor(s)[None]).last_hidden_state[0].float()
            v = critic.head(h)[:, 0].numpy()
            vals = np.full(len(s), np.nan, dtype=np.float32)
            vals[1:] = v[:-1]
            out.append(vals)
    return out, time.perf_counter() - t0


def max_diff(a: list[np.ndarray], b: list[np.ndarray]) -> float:
    return max(float(np.nanmax(np.abs(x - y))) if len(x) > 1 else 0.0 for x, y in zip(a, b, strict=True))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=DATA)
    ap.add_argument("--n", type=int, default=30, help="number of trajectories")
    ap.add_argument("--select", choices=["shortest", "first"], default="shortest")
    ap.add_argument("--max-tokens", type=int, default=8192, help="truncate each trajectory (<= critic context)")
    ap.add_argument("--token-budget", type=int, default=16384)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (keep <= free cores)")
    ap.add_argument("--padding-only", action="store_true",
                    help="only print the padding-efficiency table (no model run); try with --select first --n 200")
    ap.add_argument("--chunk-tokens", type=int, default=16384, help="chunk size of the resumable run")
    ap.add_argument("--with-mask", action="store_true", help="also time score_values with the padding mask")
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    backbone = cached_backbone("smollm2-135m", progress=lambda m: print(m, file=sys.stderr))
    tok = load_tokenizer(backbone)
    records = json.loads(args.data.read_text())
    if args.select == "shortest":
        lengths = [len(json.dumps(r["traj"])) for r in records]
        records = [records[i] for i in np.argsort(lengths, kind="stable")[: args.n]]
    else:
        records = records[: args.n]
    seqs = tokenize(tok, records, args.max_tokens)
    n_tok = sum(len(s) - 1 for s in seqs)
    if args.padding_only:
        padding_table(seqs, args.token_budget)
        return 0
    print(
        f"{len(seqs)} trajectories, {n_tok} scored positions, lengths {min(map(len, seqs))}-{max(map(len, seqs))}"
        f" (mean {np.mean([len(s) for s in seqs]):.0f}); torch {torch.__version__}, {torch.get_num_threads()} threads,"
        f" attn sdpa"
    )

    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as tmp:
        critic_dir = save_critic(backbone, rng.normal(0, 0.05, 576), 0.1, Path(tmp) / "critic")
        c32 = load_critic(critic_dir, device="cpu", dtype="float32")
        c16 = load_critic(critic_dir, device="cpu", dtype="bfloat16")

    # warm-up (one-time kernel selection / oneDNN primitive creation)
    with torch.inference_mode():
        for c in (c32, c16):
            c.backbone(input_ids=torch.as_tensor(seqs[0][:256])[None])

    # Interleaved: the trajectories are cut into the chunks score_values would batch together, and
    # every method runs on each chunk in turn (rotating the order), so that load from other processes
    # on a shared machine hits all methods alike.
    methods = [("naive loop, fp32", c32, None), ("score_values, fp32", c32, False), ("score_values, bf16", c16, False)]
    if args.with_mask:
        methods.insert(2, ("score_values, fp32, with mask", c32, True))
    chunks = plan_batches([len(s) - 1 for s in seqs], args.token_budget)
    vals = {m[0]: [None] * len(seqs) for m in methods}
    secs = dict.fromkeys(vals, 0.0)
    real = dict.fromkeys(vals, 0)
    computed = dict.fromkeys(vals, 0)
    for k, chunk in enumerate(chunks):
        sub = [seqs[i] for i in chunk]
        for j in range(len(methods)):
            label, c, mask = methods[(j + k) % len(methods)]
            if mask is None:
                out, sec = naive(c, sub)
                n = sum(len(x) - 1 for x in sub)
                real[label] += n
                computed[label] += n
            else:
                st: dict = {}
                out = score_values(c, sub, token_budget=args.token_budget, stats=st, attention_mask=mask)
                sec = st["seconds"]
                real[label] += st["real_tokens"]
                computed[label] += st["computed_tokens"]
            secs[label] += sec
            for i, v in zip(chunk, out, strict=True):
                vals[label][i] = v
        print(f"  chunk {k + 1}/{len(chunks)}: {len(chunk)} x {max(len(x) for x in sub) - 1} done", file=sys.stderr)
    rows = []
    v_naive = vals[methods[0][0]]
    for label, _, _ in methods:
        rows.append((label, real[label] / secs[label], secs[label], real[label] / computed[label], max_diff(vals[label], v_naive)))

    # resumable scoring (bf16): same batches, plus one chunk file per ~chunk_tokens positions
    with tempfile.TemporaryDirectory() as cache:
        st: dict = {}
        cached = score_values_cached(c16, seqs, Path(cache), token_budget=args.token_budget,
                                     chunk_tokens=args.chunk_tokens, stats=st)
    label = f"score_values_cached, bf16 ({st['n_chunks']} chunks)"
    rows.append((label, st["real_tokens"] / st["seconds"], st["seconds"], st["padding_efficiency"],
                 max_diff(cached, v_naive)))
    bf16_label = "score_values, bf16"
    same = max_diff(cached, vals[bf16_label])

    base = rows[0][1]
    print(f"{'method':40s} {'tokens/s':>9s} {'seconds':>8s} {'x naive':>8s} {'pad eff':>8s} {'max|dv| vs naive':>17s}")
    for label, tps, sec, eff, diff in rows:
        print(f"{label:40s} {tps:9.0f} {sec:8.1f} {tps / base:8.2f} {eff:8.3f} {diff:17.2e}")
    scale = float(np.nanmax(np.abs(np.concatenate([v[1:] for v in v_naive]))))
    print(f"(value scale: max |v| = {scale:.3f})")

    padding_table(seqs, args.token_budget)
    tps = {label: t for label, t, *_ in rows}
    f32 = tps["score_values, fp32"]
    print("ratio summary:")
    print(f"  score_values fp32 / naive fp32          {f32 / base:6.2f}x")
    print(f"  score_values bf16 / score_values fp32   {tps[bf16_label] / f32:6.2f}x")
    print(f"  score_values bf16 / naive fp32          {tps[bf16_label] / base:6.2f}x")
    print(f"  cached bf16 / score_values bf16         {rows[-1][1] / tps[bf16_label]:6.2f}x"
          f"  (values identical: max|dv| = {same:.1e}; run after the others, not interleaved)")
    return 0


def padding_table(seqs: list[np.ndarray], token_budget: int) -> None:
    """Padding efficiency (real / computed positions) of sorted batching vs input order, from the plans."""
    fed = [len(s) - 1 for s in seqs]

    def eff_of(batches: list[list[int]]) -> float:
        return sum(fed[i] for b in batches for i in b) / sum(len(b) * max(fed[i] for i in b) for b in batches)

    def in_order(budget: int) -> list[list[int]]:
        out, cur, width = [], [], 0
        for i, n in enumerate(fed):
            if cur and (len(cur) + 1) * max(width, n) > budget:
                out.append(cur)
                cur, width = [], 0
            cur.append(i)
            width = max(width, n)
        return out + ([cur] if cur else [])

    print(f"padding efficiency (real / computed positions), {len(seqs)} sequences of {min(fed) + 1}-{max(fed) + 1} tokens:")
    print(f"  {'budget':>7s} {'sorted (ours)':>14s} {'input order':>12s}")
    for budget in sorted({4096, 8192, token_budget, 32768, 65536}):
        print(f"  {budget:7d} {eff_of(plan_batches(fed, budget)):14.3f} {eff_of(in_order(budget)):12.3f}")


if __name__ == "__main__":
    raise SystemExit(main())
