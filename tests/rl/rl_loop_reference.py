"""Plain-Python loop references for the vectorized code in critic_audit.rl.

Row by row, token by token, on Python lists of floats: slow and obvious, written from the spec's
formulas, sharing no code with the library. Every function takes plain lists for one row (or a batch of
rows) and returns lists.
"""

from __future__ import annotations

import math
import statistics


def turns_of_row(mask: list[bool]) -> list[list[int]]:
    """The positions of each maximal run of True, in order."""
    turns: list[list[int]] = []
    inside = False
    for t, m in enumerate(mask):
        if m and not inside:
            turns.append([])
        if m:
            turns[-1].append(t)
        inside = m
    return turns


def turn_ids_row(mask: list[bool]) -> list[int]:
    ids = [-1] * len(mask)
    for k, positions in enumerate(turns_of_row(mask)):
        for t in positions:
            ids[t] = k
    return ids


def policy_gae_row(
    rewards: list[float],
    values: list[float],
    mask: list[bool],
    discounts: list[float] | float,
    lam: float,
) -> tuple[list[float], list[float]]:
    """GAE over policy tokens only; discounts[t] multiplies the next policy token's value."""
    T = len(mask)
    g = discounts if isinstance(discounts, list) else [discounts] * T
    positions = [t for t in range(T) if mask[t]]
    adv = [0.0] * T
    ret = [0.0] * T
    last = 0.0
    for i in reversed(range(len(positions))):
        t = positions[i]
        next_value = values[positions[i + 1]] if i + 1 < len(positions) else 0.0
        delta = rewards[t] + g[t] * next_value - values[t]
        last = delta + g[t] * lam * last
        adv[t] = last
        ret[t] = last + values[t]
    return adv, ret


def mae_row(
    rewards: list[float],
    values: list[float],
    mask: list[bool],
    gamma: float,
    lam: float,
    lam_intra: float,
    beta: float,
    lam_critic: float = 1.0,
    in_place: bool = False,
) -> tuple[list[float], list[float], list[float]]:
    """MPO's MAE for one row. Returns (token advantages, returns, turn advantages)."""
    T = len(mask)
    turns = turns_of_row(mask)
    K = len(turns)
    R = [sum(rewards[t] for t in turn) for turn in turns]
    V = [values[turn[0]] for turn in turns] + [0.0]
    A_turn = [0.0] * K
    running = 0.0
    for k in reversed(range(K)):
        delta = R[k] + gamma * V[k + 1] - V[k]
        running = delta + gamma * lam * running
        A_turn[k] = running
    adv = [0.0] * T
    for k, turn in enumerate(turns):
        G = R[k] + gamma * V[k + 1]
        n = len(turn)
        d = []
        for j in range(n):
            t = turn[j]
            if j < n - 1:
                nxt = values[turn[j + 1]]
                d.append((rewards[t] if in_place else 0.0) + nxt - values[t])
            else:
                if in_place:
                    d.append(rewards[t] + gamma * V[k + 1] - values[t])
                else:
                    d.append(G - values[t])
        a = [0.0] * n
        for j in range(n):
            a[j] = sum(lam_intra**l * d[j + l] for l in range(n - j))
        mean_a = sum(a) / n
        for j in range(n):
            adv[turn[j]] = A_turn[k] + beta * (a[j] - mean_a)
    discounts = [1.0] * T
    for turn in turns:
        discounts[turn[-1]] = gamma
    _, ret = policy_gae_row(rewards, values, mask, discounts, lam_critic)
    return adv, ret, A_turn


def group_advantages(
    scores: list[float], groups: list[int], kind: str, eps: float = 1e-6
) -> list[float]:
    """grpo / dr_grpo / rloo on per-row scores, with verl's singleton conventions."""
    out = []
    for i, s in enumerate(scores):
        members = [scores[j] for j in range(len(scores)) if groups[j] == groups[i]]
        if kind == "rloo":
            others = [scores[j] for j in range(len(scores)) if groups[j] == groups[i] and j != i]
            out.append(s - (sum(others) / len(others) if others else 0.0))
            continue
        if len(members) < 2:
            mean, std = 0.0, 1.0
        else:
            mean, std = statistics.mean(members), statistics.stdev(members)
        out.append((s - mean) / (std + eps) if kind == "grpo" else s - mean)
    return out


def reward_to_go_row(rewards: list[float], mask: list[bool]) -> list[float]:
    T = len(mask)
    out = [0.0] * T
    for t in range(T):
        if mask[t]:
            out[t] = sum(rewards[t:])
    return out


def length_lambda(n_policy: int, alpha: float) -> float:
    lam = 1.0 - 1.0 / (alpha * n_policy) if n_policy > 0 else 0.0
    return min(max(lam, 0.0), 1.0)


def turn_log_ratio_row(logp: list[float], old: list[float], mask: list[bool], mode: str) -> list[float]:
    out = []
    for turn in turns_of_row(mask):
        s = sum(logp[t] - old[t] for t in turn)
        out.append(s / len(turn) if mode == "geomean" else s)
    return out


def reverse_scan_row(x: list[float], c: list[float]) -> list[float]:
    y = [0.0] * len(x)
    nxt = 0.0
    for t in reversed(range(len(x))):
        nxt = x[t] + c[t] * nxt
        y[t] = nxt
    return y


def whiten(values: list[float]) -> list[float]:
    n = len(values)
    mean = sum(values) / n
    var = sum((v - mean) ** 2 for v in values) / (n - 1)
    return [(v - mean) / math.sqrt(var + 1e-8) for v in values]
