"""Sampler vs trainer log-probs: per-token k3 KL and |delta|, per-turn and per-trajectory importance
weights (product and geometric mean), placeholders (see ``docs/check.md``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from critic_audit.check.columns import Columns
from critic_audit.check.kit import (
    CheckRollout, FAIL, PASS, SKIP, WARN, CheckContext, CheckOutcome, CheckSpec, Example, fmt, order_median, top,
)

#: turn positions reported one by one (later ones are pooled as ``{N}plus``)
_POSITIONS = 8

#: |trainer - sampler| above this many nats (a ratio beyond e^100 = 2.7e43) is no numerical mismatch
#: but a broken entry (a placeholder, a logit, a value from another field): counted as ``extreme_deltas``,
#: a failure, and left out of the other figures, which then cannot overflow
EXTREME_DELTA = 100.0


def _exp(x: float) -> float:
    """``exp(x)`` capped at the largest float (1.8e308) instead of an OverflowError."""
    return math.exp(x) if x < 709.0 else (math.exp(709.0) if x < 709.78 else 1.7976931348623157e308)


def _exp_text(x: float) -> str:
    """``exp(x)`` written with 4 significant digits, also beyond the float range (``exp(800) = 5.726e+347``)."""
    if x < 700.0:
        return fmt(math.exp(x))
    e10 = x / math.log(10.0)
    k = math.floor(e10)
    return f"{10.0 ** (e10 - k):.4g}e+{k}"

# --------------------------------------------------------------------------------------------- log-probs


def check_logprob_mismatch(rollouts: Sequence[CheckRollout], ctx: CheckContext) -> CheckOutcome:
    cfg = ctx.config
    make = CheckSpec("logprob_mismatch", "logprobs", "sampler vs trainer log-probs (k3 KL, |delta|, importance weights)",
                    "use a length-normalised weight (the geometric mean, exp(mean delta)) or token-level truncated "
                    "IS instead of the product exp(sum delta) over long sequences; align the inference and "
                    "training numerics (dtype, kernels, weight sync); never fill log-probs of positions the "
                    "sampler did not score with placeholders", ("NeMo-RL #2269", "sglang #2427", "Flash-RL #19"))
    cols = ctx.columns
    rows = cols.rows_with("sampler_log_probs", "trainer_log_probs", "response_mask")
    if not rows.any():
        return make(SKIP, reason="needs the sampler's and the trainer's log-probs of the same tokens (verl "
                                 "rollout_log_probs and old_log_probs), or rollout_log_probs and --policy CHECKPOINT")
    n_rows = int(rows.sum())
    floor = cfg.weight_floor
    lo, hi = (math.log(floor), -math.log(floor)) if floor > 0 else (-math.inf, math.inf)
    tok = None if rows.all() else cols.tokens_of(rows)
    s, t = cols.arrays["sampler_log_probs"], cols.arrays["trainer_log_probs"]
    m = cols.mask if tok is None else cols.mask & tok
    _, ok, delta = _ratios(ctx)  # NaN / inf entries never enter the figures (nonfinite_log_probs)
    extreme = cols._cache["extreme_deltas"]
    n_extreme = int(extreme.sum())
    n_missing = int((m & ~ok).sum()) - n_extreme
    with np.errstate(invalid="ignore"):
        above = (s > cfg.logprob_atol) | (t > cfg.logprob_atol)
    imp = np.flatnonzero(ok & above)
    n_impossible = int(imp.size)
    n_ph_masked = int((above & ~cols.mask if tok is None else tok & ~cols.mask & above).sum())
    ex = _extreme_examples(cols, extreme, cfg.examples)
    for j in imp[: cfg.examples]:
        side = "sampler" if s[j] > cfg.logprob_atol else "trainer"
        ex.append(Example(cols.ids[cols.row[j]], int(cols.turn[j]), int(cols.pos[j]), f"{side} log-prob "
                          f"{fmt(max(s[j], t[j]))} > 0 on a policy token (a placeholder? it enters the ratio as a "
                          "real value)", 1e12))
    # k3 = r - 1 - log r with r = exp(delta) = pi_trainer / pi_sampler (Schulman, 2020): >= 0, unbiased
    # for KL(sampler || trainer) on tokens the sampler drew
    turn_k3_sum = cols.turn_sum(delta, fn=_k3)  # delta is 0 off ok, so is k3; ok tokens are policy tokens
    n_tok = int(ok.sum())
    k3_sum = float(turn_k3_sum.sum())
    j = _argmax_abs(delta)
    max_delta = float(abs(delta[j])) if n_tok else 0.0
    # per turn (MPO arXiv:2610.35013, as critic_audit.rl.turn_log_ratios): log prod_j r_j = sum_j delta_j
    log_prod = cols.turn_sum(delta)  # delta and k3 are 0 off ok
    lengths = ok_per_turn(cols, ok)
    present = lengths > 0
    collapsed = np.flatnonzero(present & ((log_prod < lo) | (log_prod > hi)))
    n_turns, n_turn_collapse = int(present.sum()), int(collapsed.size)
    for q in collapsed[top(np.abs(log_prod[collapsed]), cfg.examples)]:
        ex.append(Example(cols.ids[cols.turn_row[q]], int(cols.turn_k[q]), None, f"turn {int(cols.turn_k[q])} product "
                          f"weight exp({fmt(log_prod[q])}) = {_exp_text(log_prod[q])} over {int(lengths[q])} "
                          "tokens", abs(float(log_prod[q]))))
    turn_k3 = turn_k3_sum[present] / lengths[present]
    # per trajectory: the product weight exp(sum_t delta_t) and the geometric mean exp(mean_t delta_t)
    # (ok tokens are policy tokens, so a row's sums are those of its turns)
    cnt = cols.row_of_turns(lengths)
    live = cnt > 0
    total = cols.row_of_turns(log_prod)[live]
    mean = total / cnt[live]
    coll = np.flatnonzero((total < lo) | (total > hi))
    n_seq_collapse = int(coll.size)
    live_rows = np.flatnonzero(live)
    for c in coll[top(np.abs(total[coll]), cfg.examples)]:
        ex.append(Example(cols.ids[live_rows[c]], None, None, f"sequence product weight exp({fmt(total[c])}) = "
                          f"{_exp_text(total[c])} over {int(cnt[live_rows[c]])} tokens (geomean "
                          f"{_exp_text(mean[c])})", 1e6 + abs(float(total[c]))))
    measured = {
        "k3_token_mean": k3_sum / n_tok if n_tok else None, "max_abs_delta": max_delta if n_tok else None,
        "turn_k3_max": float(turn_k3.max()) if turn_k3.size else None,
        "seq_product_weight_min": _exp(total.min()) if total.size else None,
        "seq_product_weight_median": _exp(float(np.median(total))) if total.size else None,
        "seq_geomean_weight_min": _exp(mean.min()) if mean.size else None,
        "seq_geomean_weight_median": _exp(float(np.median(mean))) if mean.size else None,
    }
    counts = {"trajectories_checked": n_rows, "tokens_checked": n_tok, "tokens_missing": n_missing,
              "impossible_log_probs": n_impossible, "placeholders_on_masked_tokens": n_ph_masked,
              "turns_checked": n_turns, "turns_collapsed": n_turn_collapse,
              "trajectories_collapsed": n_seq_collapse, "extreme_deltas": n_extreme}
    if n_tok and max_delta > cfg.delta_warn:
        ex.append(Example(cols.ids[cols.row[j]], int(cols.turn[j]), int(cols.pos[j]), "largest |delta|: trainer - "
                          f"sampler = {fmt(delta[j])} nats", max_delta))
    k3m = measured["k3_token_mean"]
    summary = (f"mean k3 {fmt(k3m) if k3m is not None else 'n/a'}, max |delta| {fmt(max_delta)}; product weight "
               f"collapsed in {n_seq_collapse} of {n_rows} trajectories, {n_turn_collapse} of {n_turns} turns")
    if n_impossible:
        summary = f"{n_impossible} impossible log-prob(s) > 0 on policy tokens; " + summary
    if n_extreme:
        summary = (f"{n_extreme} broken log-prob pair(s), |trainer - sampler| > {EXTREME_DELTA:g} nats (left out "
                   "of the figures); " + summary)
    counts["turns_without_sampler_log_probs"] = n_zero = _zero_turns(cols, rows)
    if n_seq_collapse or n_impossible or n_extreme:
        status = FAIL
    else:  # a warning names its reasons in the summary
        why = _warn_reasons(cfg, n_turn_collapse, n_missing, n_zero, k3m, max_delta)
        status = WARN if why else PASS
        summary += "; warn: " + "; ".join(why) if why else ""
    return make(status, summary=summary, counts=counts, measured=measured, examples=ex, n=cfg.examples)


# --------------------------------------------------------------------------------------------- non-finite

#: the log-prob fields, as named in the report (verl names)
_LOGPROB_FIELDS = {"sampler_log_probs": "rollout_log_probs", "trainer_log_probs": "old_log_probs"}


def check_nonfinite_log_probs(rollouts: Sequence[CheckRollout], ctx: CheckContext) -> CheckOutcome:
    """NaN / +inf / -inf entries of ``rollout_log_probs`` and ``old_log_probs`` (torchtitan PR #3602),
    counted per field and kind, on policy and on masked tokens; fail on any policy token, warn on
    masked ones only. The other log-prob figures leave these entries out."""
    from critic_audit.io.tokenized import NONFINITE_CODES

    make = CheckSpec("nonfinite_log_probs", "logprobs", "log-probs are finite (no NaN / inf from the engine)",
                    "find why the engine emits them (corrupted generation, e.g. a CUDA-graph capture bug, or "
                    "garbage logits) and drop or regenerate those rollouts; never let a NaN reach the loss: mask "
                    "with torch.where, not by multiplying (NaN * 0 = NaN)", ("torchtitan PR #3602",))
    cols = ctx.columns
    fields = [f for f in _LOGPROB_FIELDS if f in cols.has]
    if not fields:
        return make(SKIP, reason="the rollouts carry no log-probs (rollout_log_probs / old_log_probs)")
    counts: dict[str, int] = {"trajectories_checked": int(cols.rows_with(fields[0]).sum() if len(fields) == 1 else
                                                          (cols.rows_with(fields[0]) | cols.rows_with(fields[1])).sum())}
    ex: list[Example] = []
    on_policy = on_masked = 0
    bad_rows = np.zeros(cols.B, dtype=bool)
    seen = []
    for f in fields:
        name = _LOGPROB_FIELDS[f]
        codes = cols.nonfinite.get(f)
        tok = cols.tokens_of(cols.has[f])
        counts[f"{name}_tokens_checked"] = int((tok & cols.mask).sum())
        for c, label in NONFINITE_CODES.items():
            key = {"NaN": "nan", "+inf": "posinf", "-inf": "neginf"}[label]
            counts[f"{name}_{key}"] = 0 if codes is None else int(((codes == c) & cols.mask).sum())
        if codes is None:
            continue
        pol, msk = (codes > 0) & cols.mask, (codes > 0) & ~cols.mask
        on_policy += int(pol.sum())
        on_masked += int(msk.sum())
        counts[f"{name}_on_masked_tokens"] = int(msk.sum())
        bad_rows[np.unique(cols.row[pol | msk])] = True
        if pol.any():
            seen.append(f"{name}: " + ", ".join(f"{counts[f'{name}_' + k]} {lab}" for k, lab in
                                               (("nan", "NaN"), ("posinf", "+inf"), ("neginf", "-inf"))
                                               if counts[f"{name}_{k}"]))
        for j in np.flatnonzero(pol)[: ctx.config.examples]:
            ex.append(Example(cols.ids[cols.row[j]], int(cols.turn[j]), int(cols.pos[j]),
                              f"{name} is {NONFINITE_CODES[int(codes[j])]} on a policy token", 2.0))
        for j in np.flatnonzero(msk)[: ctx.config.examples]:
            ex.append(Example(cols.ids[cols.row[j]], None, int(cols.pos[j]),
                              f"{name} is {NONFINITE_CODES[int(codes[j])]} on a masked token", 1.0))
    counts["tokens_on_policy"], counts["tokens_on_masked"] = on_policy, on_masked
    counts["trajectories"] = int(bad_rows.sum())
    if on_policy:
        return make(FAIL, summary=f"{on_policy} non-finite log-prob(s) on policy tokens in {int(bad_rows.sum())} "
                    f"trajectories ({'; '.join(seen)}); left out of the mismatch figures", counts=counts,
                    examples=ex, n=ctx.config.examples)
    if on_masked:
        return make(WARN, summary=f"{on_masked} non-finite log-prob(s), all on masked tokens (harmless only if the "
                    "loss masks with where, not a product)", counts=counts, examples=ex, n=ctx.config.examples)
    return make(PASS, summary=f"every log-prob is finite ({', '.join(_LOGPROB_FIELDS[f] for f in fields)})",
                counts=counts)


# --------------------------------------------------------------------------------------------- ratios


def ok_per_turn(cols: Columns, ok: np.ndarray) -> np.ndarray:
    """(K_all,) float64 count of the compared tokens (``ok`` of :func:`_ratios`) per turn, computed
    once per run."""
    return cols._lazy("ok_per_turn", lambda: cols.turn_sum(ok))


def _k3(d: np.ndarray) -> np.ndarray:
    """k3 = r - 1 - log r = expm1(delta) - delta per token (Schulman, 2020), of float64 ``d``."""
    out = np.expm1(d)
    out -= d
    return out


def _ratio(d: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """The importance ratio exp(delta) of float64 ``d``, delta capped at 50 nats (no overflow); into
    ``out`` when given (``d`` itself: in place)."""
    out = np.minimum(d, 50.0, out=out)
    return np.exp(out, out=out)


def _argmax_abs(x: np.ndarray) -> int:
    """``np.argmax(np.abs(x))`` (the first index of the largest magnitude) without an (N,) copy."""
    if not x.size:
        return 0
    hi, lo = int(np.argmax(x)), int(np.argmin(x))
    if x[hi] != -x[lo]:
        return hi if x[hi] > -x[lo] else lo
    return min(hi, lo)


def _extreme_examples(cols, extreme: np.ndarray, n: int) -> list[Example]:
    """The first ``n`` tokens whose |trainer - sampler| is above :data:`EXTREME_DELTA`, as examples."""
    s, t = cols.arrays["sampler_log_probs"], cols.arrays["trainer_log_probs"]
    return [Example(cols.ids[cols.row[j]], int(cols.turn[j]), int(cols.pos[j]),
                    f"sampler log-prob {fmt(s[j])}, trainer {fmt(t[j])}: |delta| > {EXTREME_DELTA:g} nats, a "
                    "broken entry (placeholder, logit or another field?), left out of the figures", 1e13)
            for j in np.flatnonzero(extreme)[:n]]


def _zero_turns(cols: Columns, rows: np.ndarray) -> int:
    """Turns of the ``rows`` whose sampler log-probs were all 0.0 / missing (left out by :func:`_ratios`)."""
    zero = cols._cache.get("zero_logprob_turns")
    return int(zero[rows[cols.turn_row]].sum()) if zero is not None and zero.size else 0


def _warn_reasons(cfg: Any, n_turn_collapse: int, n_missing: int, n_zero: int, k3m: float | None,
                  max_delta: float) -> list[str]:
    """Why logprob_mismatch warns, one phrase per reason (empty: it passes)."""
    why = [f"{n_turn_collapse} turn product weight(s) collapsed"] if n_turn_collapse else []
    if n_missing:
        why.append(f"{n_missing} policy token(s) lack a finite log-prob on either side" + (
            f", {n_zero} turn(s) with every sampler log-prob exactly 0.0 (a fill, not compared)" if n_zero else ""))
    if k3m is not None and k3m > cfg.kl_warn:
        why.append(f"mean k3 above {fmt(cfg.kl_warn)}")
    if max_delta > cfg.delta_warn:
        why.append(f"max |delta| above {fmt(cfg.delta_warn)}")
    return why


def real_log_prob_turns(cols: Columns) -> np.ndarray:
    """(K_all,) float64: per policy turn of ``cols``, how many sampler log-probs are real (finite and
    not exactly 0.0, verl's fill for positions the sampler did not score); computed once per run."""
    def make() -> np.ndarray:
        s = cols.arrays["sampler_log_probs"]
        with np.errstate(invalid="ignore"):
            real = s != 0
            real &= np.isfinite(s)
        return cols.turn_sum(real)  # summed in float64 by reduceat, no copy of the bool column
    return cols._lazy("real_log_prob_turns", make)


def no_logprob_turns(cols: Columns) -> np.ndarray:
    """(K_all,) bool: policy turns of :class:`critic_audit.check.columns.Columns` ``cols`` with no real
    sampler log-prob: every entry NaN / missing or exactly 0.0 (verl fills positions the sampler did not
    score with 0.0), in a turn of >= 2 tokens (a single 0.0 may be a real log-prob, a forced token:
    a 1-token turn counts only when its entry is missing). One rule for untrained_turns (the turn was
    not sampled with log-probs) and logprob_mismatch (such a turn is missing, not compared)."""
    s = cols.arrays["sampler_log_probs"]
    if not len(cols.turn_start):
        return np.zeros(0, dtype=bool)
    none = real_log_prob_turns(cols) == 0
    return none & ((cols.turn_len >= 2) | np.isnan(s[cols.turn_start]))


def _ratios(ctx: CheckContext):
    """(rows, ok, delta) over the columns: policy tokens with both log-probs finite and
    |trainer - sampler| <= :data:`EXTREME_DELTA`, delta = trainer - sampler (float64, 0 elsewhere);
    None when no row carries both. The tokens left out as extreme are cached as ``extreme_deltas``;
    ``ratio_tokens_all`` caches ``(ok, delta)`` of the same tokens with the turns of sampler log-probs
    that are all 0.0 kept in (:func:`length_deltas`). One float64 (N,) array in all."""
    cols = ctx.columns
    if "ratios" in cols._cache:
        return cols._cache["ratios"]
    rows = cols.rows_with("sampler_log_probs", "trainer_log_probs", "response_mask")
    out, extreme = None, np.zeros(0, dtype=bool)
    if rows.any():
        s, t = cols.arrays["sampler_log_probs"], cols.arrays["trainer_log_probs"]
        ok = cols.mask & np.isfinite(s)
        ok &= np.isfinite(t)
        if not rows.all():
            ok &= cols.tokens_of(rows)
        with np.errstate(over="ignore", invalid="ignore"):
            delta = np.subtract(t, s, dtype=np.float64)
            within = delta <= EXTREME_DELTA
            within &= delta >= -EXTREME_DELTA
        zero = no_logprob_turns(cols) & (cols.turn_len > 0)
        cols._cache["zero_logprob_turns"] = zero
        if zero.any():  # turns whose sampler log-probs are all 0.0: missing (counted), not compared
            sel = np.zeros(cols.N, dtype=bool)
            sel[cols.mask] = np.repeat(zero, cols.turn_len)  # policy tokens in turn order (Columns.gturn)
            all_ok = ok & within
            cols._cache["ratio_tokens_all"] = (all_ok, np.where(all_ok, delta, 0.0))
            ok &= ~sel
        extreme = ok & ~within
        ok &= within
        delta[~ok] = 0.0
        out = rows, ok, delta
        cols._cache.setdefault("ratio_tokens_all", (ok, delta))
    cols._cache["extreme_deltas"] = extreme
    cols._cache["ratios"] = out
    return out


def length_deltas(ctx: CheckContext) -> tuple[np.ndarray, np.ndarray] | None:
    """``(ok, delta)``, (N,) each: the policy tokens of rows with both log-probs that are finite and
    within :data:`EXTREME_DELTA` of each other, turns of all-0.0 sampler log-probs included (unlike
    :func:`_ratios`), and trainer - sampler there (float64, 0 elsewhere); None when no row carries
    both. Shared with :func:`_ratios` (no second pass) when no turn is all 0.0."""
    if _ratios(ctx) is None:
        return None
    return ctx.columns._cache["ratio_tokens_all"]


def check_truncated_sampling_bias(rollouts: Sequence[CheckRollout], ctx: CheckContext) -> CheckOutcome:
    """The importance ratio r = exp(trainer - sampler) per policy token and its mean per trajectory:
    fail (warn) when the mean over trajectories is ``ratio_shift_fail`` (``ratio_shift_warn``) or more
    below 1, below 1 in >= 90% of trajectories, with an sd across trajectories smaller than the shift
    and a 95% interval below 1: the kept-mass bias of sampler log-probs renormalised over a truncated
    (top-p / top-k / min-p) support (TRL #6789, TRL PR #7269)."""
    cfg = ctx.config
    make = CheckSpec("truncated_sampling_bias", "logprobs", "the importance ratio is not shifted below 1 as a whole "
                    "(truncated-sampling bias)",
                    "the sampler's log-probs are likely renormalised over the top-p / top-k / min-p support (vLLM "
                    "processed_logprobs) while the trainer's are over the full vocabulary, so every ratio carries "
                    "the kept mass S: renormalise the trainer's log-probs over the same kept set (sampling-mask "
                    "replay), or sample training rollouts with top_p = 1, top_k = 0, min_p = 0",
                    ("TRL #6789", "TRL PR #7269"))
    got = _ratios(ctx)
    if got is None:
        return make(SKIP, reason="needs the sampler's and the trainer's log-probs of the same tokens")
    rows, ok, delta = got
    cols = ctx.columns
    n_tok = int(ok.sum())
    if n_tok == 0:
        return make(SKIP, reason="no policy token has both log-probs finite")
    cnt = cols.row_of_turns(ok_per_turn(cols, ok))  # ok tokens are policy tokens: rows = sums of turns
    live = cnt > 0
    # each trajectory's mean ratio (the ratio taken block by block, 0 off ok: no (N,) copy)
    row_mean = (cols.row_of_turns(cols.turn_sum(delta, where=ok, fn=_ratio))[live] / cnt[live])
    n = int(live.sum())
    on = delta[ok]
    _ratio(on, out=on)  # in place: one copy of the compared tokens
    mean = float(on.mean())
    traj_mean, traj_sd = float(row_mean.mean()), float(row_mean.std(ddof=1)) if n > 1 else 0.0
    half = 1.96 * traj_sd / math.sqrt(n) if n > 1 else math.nan  # over trajectories (tokens within one correlate)
    below = float((row_mean < 1.0).mean())
    shift = 1.0 - traj_mean
    measured = {"mean_ratio": mean, "median_ratio": order_median(on),
                "trajectory_mean_ratio": traj_mean, "trajectory_mean_ratio_ci_low": traj_mean - half if n > 1 else None,
                "trajectory_mean_ratio_ci_high": traj_mean + half if n > 1 else None,
                "trajectory_mean_ratio_sd": traj_sd, "share_trajectories_below_1": below,
                "share_tokens_below_1": np.count_nonzero(delta < 0) / n_tok}  # (delta is 0 off ok)
    counts = {"trajectories_checked": n, "tokens_checked": n_tok}
    uniform = below >= 0.9 and traj_sd < shift and (n < 2 or traj_mean + half < 1.0)
    ex: list[Example] = []
    if shift >= cfg.ratio_shift_warn and uniform:
        ids = np.flatnonzero(live)
        for j in top(1.0 - row_mean, cfg.examples):
            ex.append(Example(cols.ids[ids[j]], None, None, f"mean importance ratio {fmt(float(row_mean[j]))} over "
                              f"{int(cnt[ids[j]])} tokens", float(1.0 - row_mean[j])))
        status = FAIL if shift >= cfg.ratio_shift_fail else WARN
        return make(status, summary=f"the mean importance ratio is {fmt(traj_mean)} [{fmt(traj_mean - half)}, "
                    f"{fmt(traj_mean + half)}], below 1 in {100 * below:.0f}% of {n} trajectories (sd "
                    f"{fmt(traj_sd)}): a uniform shift, as when the sampler's log-probs are renormalised over a "
                    f"truncated support (kept mass ~ {fmt(traj_mean)})", counts=counts, measured=measured,
                    examples=ex, n=cfg.examples)
    return make(PASS, summary=f"mean importance ratio {traj_mean:.4f} (sd {fmt(traj_sd)} over {n} trajectories): "
                "no uniform shift below 1", counts=counts, measured=measured)


_LENGTH_BUCKETS = ((1, 64), (65, 256), (257, 1024), (1025, None))


def check_turn_logprob_mismatch(rollouts: Sequence[CheckRollout], ctx: CheckContext) -> CheckOutcome:
    """Mean |trainer - sampler| per turn (verl PR #5229), token-weighted by turn index and by turn
    length over the batch, the worst turn (>= 4 tokens) named; warn above ``turn_delta_warn`` nats."""
    cfg = ctx.config
    make = CheckSpec("turn_logprob_mismatch", "logprobs", "sampler vs trainer log-probs per turn (by turn index and "
                    "turn length)",
                    "find what differs in the diverging turns: a re-tokenized context (the template's rendering "
                    "vs the ids the sampler saw), a tool-output span counted as policy tokens, or a stale weight "
                    "sync; compare the turn's token ids with the sampler's", ("verl PR #5229",))
    got = _ratios(ctx)
    if got is None:
        return make(SKIP, reason="needs the sampler's and the trainer's log-probs of the same tokens")
    rows, ok, delta = got
    cols = ctx.columns
    if not (rows & (cols.n_turns >= 2)).any():
        return make(SKIP, reason="no multi-turn rollout carries both log-probs (logprob_mismatch covers single turns)")
    sel = rows[cols.turn_row]
    n_ok = ok_per_turn(cols, ok)  # delta is 0 off ok
    abs_sum = cols.turn_sum(delta, fn=np.abs)  # (block by block: no (N,) copy of |delta|)
    present = sel & (n_ok > 0)
    per_turn = np.where(present, abs_sum / np.where(n_ok > 0, n_ok, 1), np.nan)  # mean |delta| of each turn
    measured: dict[str, float | None] = {}
    for k in range(_POSITIONS + 1):  # token-weighted over the batch, as verl's per-round metric
        at = present & ((cols.turn_k == k) if k < _POSITIONS else (cols.turn_k >= k))
        if at.any():
            key = f"mean_abs_delta_turn_{k}" if k < _POSITIONS else f"mean_abs_delta_turn_{k}plus"
            measured[key] = float(abs_sum[at].sum() / n_ok[at].sum())
    for lo, hi in _LENGTH_BUCKETS:
        at = present & (cols.turn_len >= lo) & (cols.turn_len <= (hi if hi is not None else np.inf))
        if at.any():
            measured[f"mean_abs_delta_len_{lo}_{hi if hi is not None else 'up'}"] = \
                float(abs_sum[at].sum() / n_ok[at].sum())
    big = present & (n_ok >= 4)
    worst = int(np.nanargmax(np.where(big, per_turn, -np.inf))) if big.any() else None
    measured["worst_turn_mean_abs_delta"] = float(per_turn[worst]) if worst is not None else None
    flagged = np.flatnonzero(big & (per_turn > cfg.turn_delta_warn))
    ex: list[Example] = []
    for q in flagged[top(per_turn[flagged], cfg.examples)]:
        seg = np.abs(delta[cols.turn_start[q]:cols.turn_stop[q]])
        ex.append(Example(cols.ids[cols.turn_row[q]], int(cols.turn_k[q]), int(cols.pos[cols.turn_start[q]] + np.argmax(seg)),
                          f"turn {int(cols.turn_k[q])} ({int(cols.turn_len[q])} tokens): mean |trainer - sampler| "
                          f"{fmt(float(per_turn[q]))} nats, largest {fmt(float(seg.max()))} at this position",
                          float(per_turn[q])))
    counts = {"trajectories_checked": int(rows.sum()), "turns_checked": int(present.sum()),
              "turns_above_threshold": int(flagged.size)}
    where = ""
    if worst is not None:
        where = (f"; worst: {cols.ids[cols.turn_row[worst]]} turn {int(cols.turn_k[worst])} "
                 f"({fmt(float(per_turn[worst]))} nats over {int(cols.turn_len[worst])} tokens)")
    if flagged.size:
        return make(WARN, summary=f"{int(flagged.size)} of {int(present.sum())} turns have a mean |trainer - sampler| above "
                    f"{fmt(cfg.turn_delta_warn)} nats{where}", counts=counts, measured=measured, examples=ex,
                    n=cfg.examples)
    return make(PASS, summary=f"no turn's mean |trainer - sampler| exceeds {fmt(cfg.turn_delta_warn)} nats "
                f"({int(present.sum())} turns){where}", counts=counts, measured=measured)
