"""Benchmark: MAE and our GAE (log2 T vectorized steps) against a verl-style GAE loop over tokens.

The reference is verl's multi-turn ``compute_gae_advantage_return``: a Python loop over the T token
positions, vectorized over the batch, that skips masked (observation) tokens. Our ``gae`` must agree
with it within 1e-5 at every policy token.

    python benchmarks/bench_advantages.py [--rows 64] [--tokens 4096] [--turns 8 32] [--repeats 5] [--threads 1]

Prints, for each K: median wall time of each method, the speed-up of each over the loop, and the max
absolute difference between our GAE and the loop (advantages and returns).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from critic_audit.rl import GAEConfig, MAEConfig, RolloutBatch, compute_advantages


def verl_style_gae_loop(
    token_rewards: torch.Tensor, values: torch.Tensor, response_mask: torch.Tensor, gamma: float, lam: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """verl's GAE with observation skipping: one Python iteration per token position."""
    mask = response_mask.to(values.dtype)
    B, T = values.shape
    nextvalues = torch.zeros(B, dtype=values.dtype)
    lastgaelam = torch.zeros(B, dtype=values.dtype)
    advantages_reversed = []
    for t in reversed(range(T)):
        delta = token_rewards[:, t] + gamma * nextvalues - values[:, t]
        lastgaelam_ = delta + gamma * lam * lastgaelam
        # skip values and TD-errors on observation tokens
        nextvalues = values[:, t] * mask[:, t] + (1 - mask[:, t]) * nextvalues
        lastgaelam = lastgaelam_ * mask[:, t] + (1 - mask[:, t]) * lastgaelam
        advantages_reversed.append(lastgaelam)
    advantages = torch.stack(advantages_reversed[::-1], dim=1)
    returns = advantages + values
    return advantages * mask, returns * mask


def make_batch(B: int, T: int, K: int, seed: int = 0) -> RolloutBatch:
    """B agent episodes of K turns in T positions: prompt, K policy turns separated by tool outputs,
    trailing padding; outcome reward 0/1 on the last policy token, small intermediate turn rewards."""
    g = torch.Generator().manual_seed(seed)
    mask = torch.zeros(B, T, dtype=torch.bool)
    rewards = torch.zeros(B, T)
    for b in range(B):
        used = int(torch.randint(64, 256, (1,), generator=g))  # prompt
        budget = int((T - used) * float(torch.empty(1).uniform_(0.6, 1.0, generator=g)))  # rest is padding
        shares = torch.rand(2 * K - 1, generator=g) + 0.05
        spans = (shares / shares.sum() * budget).long().clamp(min=1).tolist()
        for i, n in enumerate(spans):
            n = min(n, T - used)
            if i % 2 == 0 and n > 0:  # a policy turn
                mask[b, used : used + n] = True
                rewards[b, used + n - 1] = 0.1 * float(torch.rand(1, generator=g))
            used += n
        last = int(mask[b].nonzero().max())
        rewards[b, last] = float(torch.randint(0, 2, (1,), generator=g))
    values = torch.rand(B, T, generator=g)
    return RolloutBatch(rewards, values, mask)


def median_time(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--turns", type=int, nargs="+", default=[8, 32])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--threads", type=int, default=1,
        help="torch intra-op threads for both sides (default 1: on a small shared CPU, OpenMP barriers "
        "dominate ops this size when another process holds a core; 0 keeps torch's default)",
    )
    args = parser.parse_args()
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    gamma, lam = 1.0, 0.95
    gae_cfg = GAEConfig(gamma=gamma, lam=lam, whiten=False)
    mae_cfg = MAEConfig(whiten=False)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, B={args.rows}, T={args.tokens}, float32")
    header = f"{'K':>4} {'loop ms':>9} {'gae ms':>8} {'mae ms':>8} {'gae x':>7} {'mae x':>7} {'max|dA|':>9} {'max|dR|':>9}"
    print(header)
    worst = 0.0
    for K in args.turns:
        batch = make_batch(args.rows, args.tokens, K)
        args_loop = (batch.token_rewards, batch.values, batch.response_mask, gamma, lam)
        t_loop = median_time(lambda: verl_style_gae_loop(*args_loop), args.repeats)
        t_gae = median_time(lambda: compute_advantages("gae", batch, gae_cfg), args.repeats)
        t_mae = median_time(lambda: compute_advantages("mae", batch, mae_cfg), args.repeats)
        adv_loop, ret_loop = verl_style_gae_loop(*args_loop)
        adv, ret = compute_advantages("gae", batch, gae_cfg)
        m = batch.response_mask
        d_adv = float((adv - adv_loop)[m].abs().max())
        d_ret = float((ret - ret_loop)[m].abs().max())
        worst = max(worst, d_adv, d_ret)
        print(
            f"{K:>4} {t_loop * 1e3:>9.1f} {t_gae * 1e3:>8.1f} {t_mae * 1e3:>8.1f} "
            f"{t_loop / t_gae:>6.1f}x {t_loop / t_mae:>6.1f}x {d_adv:>9.2e} {d_ret:>9.2e}"
        )
    status = "OK" if worst <= 1e-5 else "FAIL"
    print(f"GAE vs loop max abs difference {worst:.2e} ({status}, tolerance 1e-5)")
    if worst > 1e-5:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
