"""Sampler vs trainer log-probs: per-token k3 KL and |delta|, per-turn and per-trajectory importance
weights (product and geometric mean), placeholders (see ``docs/check.md``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from critic_audit.check.core import (
    FAIL, PASS, SKIP, WARN, CheckContext, CheckOutcome, Example, _fmt, _median, _outcome, _with,
)
from critic_audit.check.data import CheckRollout

# --------------------------------------------------------------------------------------------- log-probs


def check_logprob_mismatch(rollouts: Sequence[CheckRollout], ctx: CheckContext) -> CheckOutcome:
    cfg = ctx.config
    make = _outcome("logprob_mismatch", "logprobs", "sampler vs trainer log-probs (k3 KL, |delta|, importance weights)",
                    "use a length-normalised weight (the geometric mean, exp(mean delta)) or token-level truncated "
                    "IS instead of the product exp(sum delta) over long sequences; align the inference and "
                    "training numerics (dtype, kernels, weight sync); never fill log-probs of positions the "
                    "sampler did not score with placeholders", ("NeMo-RL #2269", "sglang #2427", "Flash-RL #19"))
    have = _with(rollouts, "sampler_log_probs", "trainer_log_probs", "response_mask")
    if not have:
        return make(SKIP, reason="needs the sampler's and the trainer's log-probs of the same tokens (verl "
                                 "rollout_log_probs and old_log_probs), or rollout_log_probs and --policy CHECKPOINT")
    import torch

    from critic_audit.rl.diagnostics import turn_log_ratios

    floor = cfg.weight_floor
    lo, hi = (math.log(floor), -math.log(floor)) if floor > 0 else (-math.inf, math.inf)
    n_tok = n_missing = n_impossible = n_turns = n_turn_collapse = n_seq_collapse = n_ph_masked = 0
    k3_sum = 0.0
    max_delta, max_at = 0.0, None
    seq_prod, seq_geo, turn_k3 = [], [], []
    ex: list[Example] = []
    for r in have:
        s, t, m = np.asarray(r.sampler_log_probs, float), np.asarray(r.trainer_log_probs, float), r.response_mask
        k = r.turn_ids
        ok = m & np.isfinite(s) & np.isfinite(t)
        n_missing += int((m & ~ok).sum())
        imp = np.flatnonzero(ok & ((s > cfg.logprob_atol) | (t > cfg.logprob_atol)))
        n_impossible += int(imp.size)
        with np.errstate(invalid="ignore"):
            n_ph_masked += int((~m & ((s > cfg.logprob_atol) | (t > cfg.logprob_atol))).sum())
        for p in imp[:3]:
            side = "sampler" if s[p] > cfg.logprob_atol else "trainer"
            ex.append(Example(r.trajectory_id, int(k[p]), int(p), f"{side} log-prob {_fmt(max(s[p], t[p]))} > 0 on a "
                              "policy token (a placeholder? it enters the ratio as a real value)", 1e12))
        if not ok.any():
            continue
        delta = np.where(ok, t - s, 0.0)
        # k3 = r - 1 - log r with r = exp(delta) = pi_trainer / pi_sampler (Schulman, 2020): >= 0, unbiased
        # for KL(sampler || trainer) on tokens the sampler drew
        k3 = np.where(ok, np.expm1(delta) - delta, 0.0)
        n_tok += int(ok.sum())
        k3_sum += float(k3.sum())
        j = int(np.argmax(np.abs(delta)))
        if abs(delta[j]) > max_delta:
            max_delta, max_at = float(abs(delta[j])), (r.trajectory_id, int(k[j]), j, float(delta[j]))
        kk = torch.as_tensor(np.where(ok, k, -1))[None]
        log_prod, lengths = turn_log_ratios(torch.as_tensor(t)[None].nan_to_num(), torch.as_tensor(s)[None].nan_to_num(),
                                            kk, "product")
        log_prod, lengths = log_prod[0].numpy(), lengths[0].numpy()
        present = lengths > 0
        n_turns += int(present.sum())
        for q in np.flatnonzero(present & ((log_prod < lo) | (log_prod > hi))):
            n_turn_collapse += 1
            ex.append(Example(r.trajectory_id, int(q), None, f"turn {int(q)} product weight exp({_fmt(log_prod[q])}) = "
                              f"{_fmt(math.exp(log_prod[q]))} over {int(lengths[q])} tokens", abs(float(log_prod[q]))))
        turn_k3 += [float(k3[k == q].sum() / lengths[q]) for q in np.flatnonzero(present)]
        total, mean = float(delta.sum()), float(delta[ok].mean())
        seq_prod.append(total)
        seq_geo.append(mean)
        if total < lo or total > hi:
            n_seq_collapse += 1
            ex.append(Example(r.trajectory_id, None, None, f"sequence product weight exp({_fmt(total)}) = "
                              f"{_fmt(math.exp(total))} over {int(ok.sum())} tokens (geomean {_fmt(math.exp(mean))})",
                              1e6 + abs(total)))
    measured = {
        "k3_token_mean": k3_sum / n_tok if n_tok else None, "max_abs_delta": max_delta if n_tok else None,
        "turn_k3_max": max(turn_k3) if turn_k3 else None,
        "seq_product_weight_min": math.exp(min(seq_prod)) if seq_prod else None,
        "seq_product_weight_median": math.exp(_median(seq_prod)) if seq_prod else None,
        "seq_geomean_weight_min": math.exp(min(seq_geo)) if seq_geo else None,
        "seq_geomean_weight_median": math.exp(_median(seq_geo)) if seq_geo else None,
    }
    counts = {"trajectories_checked": len(have), "tokens_checked": n_tok, "tokens_missing": n_missing,
              "impossible_log_probs": n_impossible, "placeholders_on_masked_tokens": n_ph_masked,
              "turns_checked": n_turns, "turns_collapsed": n_turn_collapse,
              "trajectories_collapsed": n_seq_collapse}
    if max_at is not None and max_delta > cfg.delta_warn:
        tid, q, p, d = max_at
        ex.append(Example(tid, q, p, f"largest |delta|: trainer - sampler = {_fmt(d)} nats", max_delta))
    k3m = measured["k3_token_mean"]
    summary = (f"mean k3 {_fmt(k3m) if k3m is not None else 'n/a'}, max |delta| {_fmt(max_delta)}; product weight "
               f"collapsed in {n_seq_collapse} of {len(have)} trajectories, {n_turn_collapse} of {n_turns} turns")
    if n_impossible:
        summary = f"{n_impossible} impossible log-prob(s) > 0 on policy tokens; " + summary
    if n_seq_collapse or n_impossible:
        status = FAIL
    elif n_turn_collapse or n_missing or (k3m is not None and k3m > cfg.kl_warn) or max_delta > cfg.delta_warn:
        status = WARN
    else:
        status = PASS
    return make(status, summary=summary, counts=counts, measured=measured, examples=ex, n=cfg.examples)
