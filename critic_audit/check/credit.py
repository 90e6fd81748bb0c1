"""Credit checks on the trainer's own per-token figures: advantages zero on every turn but the last,
advantages computed by GAE over masked critic values, and turn ids that merge several assistant spans
(see ``docs/check.md``). Every figure is computed over the whole batch at once
(:class:`critic_audit.check.columns.Columns`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np

from critic_audit.check.kit import (
    CheckRollout, FAIL, PASS, SKIP, WARN, CheckContext, CheckOutcome, CheckSpec, Example, fmt, order_quantile, share,
    top,
)

#: turn positions reported one by one (later ones are pooled as ``{N}plus``)
_POSITIONS = 8
#: the (gamma, lambda) values tried when the trainer's are not given (common PPO / verl settings), most
#: common first; the search stops at the first pair that reproduces the stored advantages
GAMMAS = (1.0, 0.99, 0.999, 0.995, 0.98, 0.95)
LAMS = (1.0, 0.95, 0.99, 0.98, 0.97, 0.9, 0.8)
#: rows the (gamma, lambda) search runs on (the final comparison uses every row)
_INFER_ROWS = 8


# --------------------------------------------------------------------------------------------- advantages


def check_zero_advantage_turns(rollouts: Sequence[CheckRollout], ctx: CheckContext) -> CheckOutcome:
    """Turns whose per-token advantages are all exactly 0 before a last turn whose are not (SkyRL PR
    #1507), by turn position k over multi-turn rows. Fail when half or more of such earlier turns are
    zero, warn when some are; rows that are 0 throughout are counted apart. Needs ``advantages``."""
    make = CheckSpec("zero_advantage_turns", "credit", "advantages reach every turn, not only the last",
                    "give every turn of a trajectory its advantage at its own policy tokens: compute the scalar "
                    "(outcome) advantage, broadcast it to each step / turn and multiply by that step's own "
                    "response_mask (not the last step's mask copied to every step)", ("SkyRL PR #1507",))
    cols = ctx.columns
    rows = cols.rows_with("advantages", "response_mask") & (cols.n_turns >= 2)
    if not rows.any():
        return make(SKIP, reason="needs per-token advantages (verl `advantages`) on multi-turn rows")
    adv = cols.arrays["advantages"]
    live_turn = cols.turn_sum(cols.nonzero("advantages")) > 0  # a turn with a non-zero advantage
    sel = rows[cols.turn_row]
    last_live = np.zeros(cols.B, dtype=bool)
    last_live[cols.turn_row[cols.turn_last & live_turn & sel]] = True
    all_zero_rows = rows & (np.bincount(cols.turn_row[sel & live_turn], minlength=cols.B) == 0)
    earlier = sel & ~cols.turn_last & last_live[cols.turn_row]  # turns before a non-zero last turn
    zero = earlier & ~live_turn
    n_earlier, n_zero = int(earlier.sum()), int(zero.sum())
    measured: dict[str, float | None] = {"zero_share_earlier_turns": share(n_zero, n_earlier)}
    for k in range(_POSITIONS + 1):  # the share of all-zero turns by position, over multi-turn rows
        at = sel & ((cols.turn_k == k) if k < _POSITIONS else (cols.turn_k >= k))
        name = f"zero_share_turn_{k}" if k < _POSITIONS else f"zero_share_turn_{k}plus"
        if at.any():
            measured[name] = float((~live_turn[at]).mean())
    measured["zero_share_last_turn"] = float((~live_turn[sel & cols.turn_last]).mean())
    zero_rows = np.bincount(cols.turn_row[zero], minlength=cols.B)
    flagged = np.flatnonzero(zero_rows)
    ex: list[Example] = []
    for i in flagged[top(zero_rows[flagged] / cols.n_turns[flagged], ctx.config.examples)]:
        q = np.flatnonzero(zero & (cols.turn_row == i))
        last = int(np.flatnonzero(cols.turn_last & (cols.turn_row == i))[0])
        lv = np.nan_to_num(adv[cols.turn_start[last]:cols.turn_stop[last]])
        ex.append(Example(cols.ids[i], int(cols.turn_k[q[0]]), int(cols.pos[cols.turn_start[q[0]]]),
                          f"advantages are 0 on every token of {len(q)} of the {int(cols.n_turns[i]) - 1} turns before "
                          f"the last (turns {', '.join(str(int(k)) for k in cols.turn_k[q][:6])}); the last turn's "
                          f"are {fmt(float(lv[lv != 0][0]))}", float(len(q)) / float(cols.n_turns[i])))
    n_rows = int(rows.sum())
    counts = {"trajectories_checked": n_rows, "turns_checked": int(sel.sum()), "earlier_turns_checked": n_earlier,
              "earlier_turns_all_zero": n_zero, "trajectories": int(flagged.size),
              "trajectories_all_zero": int(all_zero_rows.sum())}
    zero_share = measured["zero_share_earlier_turns"]
    if n_zero:
        status = FAIL if zero_share is not None and zero_share >= 0.5 else WARN
        return make(status, summary=f"{n_zero} of {n_earlier} earlier turns ({100 * (zero_share or 0):.0f}%) in "
                    f"{int(flagged.size)} of {n_rows} trajectories train on advantage 0 while their last turn's is "
                    "not", counts=counts, measured=measured, examples=ex, n=ctx.config.examples)
    return make(PASS, summary=f"every turn before a non-zero last turn carries a non-zero advantage ({n_earlier} "
                f"earlier turns, {n_rows} trajectories; {int(all_zero_rows.sum())} trajectories are 0 throughout)",
                counts=counts, measured=measured)


def _padded(cols, idx: np.ndarray, x: np.ndarray, fill: float) -> np.ndarray:
    """(len(idx), T_max) float64 of the (N,) column ``x`` for rows ``idx``, ``fill`` past each row's end."""
    lengths = np.diff(cols.offsets)[idx]
    if len(idx) == cols.B and len(idx) and (lengths == lengths[0]).all():  # equal rows: a reshape
        return x.reshape(cols.B, int(lengths[0])).astype(np.float64, copy=False)
    out = np.full((len(idx), int(lengths.max()) if len(idx) else 0), fill, dtype=np.float64)
    # only the selected rows' tokens are touched (not every token of the batch)
    k = np.repeat(np.arange(len(idx)), lengths)
    pos = np.arange(int(lengths.sum())) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    out[k, pos] = x[np.repeat(cols.offsets[idx], lengths) + pos]
    return out


def _gae_pair(rewards: np.ndarray, values: np.ndarray, mask: np.ndarray, length: np.ndarray, gamma: float,
              lam: float) -> tuple[np.ndarray, np.ndarray]:
    """(B', T) float32 advantages of PPO's GAE (arXiv:1506.02438) two ways, over (B', T) ``rewards``,
    ``values`` (NaN read as 0), bool ``mask`` and (B',) row ``length``:

    * ``policy``: over policy tokens only (values under mask 0 never read; ``critic_audit.rl`` "gae");
    * ``masked_values``: every token from the row's first policy token to its end is a transition and
      reads its value, mask 0 included (ROLL PR #447's bug: values under mask 0 bootstrap the policy
      tokens before them), kept at policy tokens.

    numpy twins of :func:`critic_audit.rl.compute_advantages` "gae" (float32, as trainers store them;
    no torch import for ``check``).
    """
    t = np.arange(mask.shape[1])[None, :]
    first = np.where(mask.any(1), mask.argmax(1), mask.shape[1])[:, None]
    span = (t >= first) & (t < length[:, None])
    r, v = rewards.astype(np.float32), np.nan_to_num(values.astype(np.float32))
    return _policy_token_gae(r, v, mask, gamma, lam), np.where(mask, _policy_token_gae(r, v, span, gamma, lam), 0.0)


def _policy_token_gae(r: np.ndarray, v: np.ndarray, m: np.ndarray, gamma: float, lam: float) -> np.ndarray:
    """(B', T) float32 GAE over the policy tokens of the (B', T) bool ``m`` (0 elsewhere):
    ``delta_t = r_t + gamma V_t' - V_t``, ``A_t = delta_t + gamma lam A_t'``, t' the next policy token
    after t (V = 0 after the last), as ``critic_audit.rl``'s ``_policy_token_gae``."""
    b, n = m.shape
    v = np.where(m, v, np.float32(0.0))
    pos = np.where(m, np.arange(n)[None, :], n)
    at_or_after = np.minimum.accumulate(pos[:, ::-1], axis=1)[:, ::-1]
    nxt = np.concatenate([at_or_after[:, 1:], np.full((b, 1), n)], axis=1)
    next_v = np.take_along_axis(np.concatenate([v, np.zeros((b, 1), np.float32)], axis=1), nxt, axis=1)
    delta = np.where(m, r + np.float32(gamma) * next_v - v, np.float32(0.0))
    coef = np.where(m, np.float32(gamma * lam), np.float32(1.0))
    return np.where(m, _reverse_scan(delta, coef), np.float32(0.0))


def _reverse_scan(x: np.ndarray, c: np.ndarray) -> np.ndarray:
    """``y_t = x_t + c_t y_{t+1}`` backwards over the last axis (``y_T = 0``) in ceil(log2 T) doubling
    steps (Hillis & Steele, 1986), the numpy twin of :func:`critic_audit.rl.scan.reverse_linear_scan`."""
    y, c = x.copy(), c.copy()
    n, d = x.shape[-1], 1
    while d < n:
        y[..., :-d] += c[..., :-d] * y[..., d:]
        nc = np.zeros_like(c)
        nc[..., :-d] = c[..., :-d] * c[..., d:]
        c, d = nc, 2 * d
    return y


def _fit(stored: np.ndarray, cand: np.ndarray, mask: np.ndarray) -> tuple[np.ndarray, float]:
    """Per-row relative residual of ``stored`` against the best affine map of ``cand`` over the policy
    tokens of the whole batch (verl whitens advantages over the batch: an affine map), and the
    batch's relative residual. Residuals are RMS over a row's policy tokens / the spread of ``stored``."""
    # least squares stored ~ a * cand + b over policy tokens, from masked moments (no copies)
    m = mask.astype(np.float64)
    n = float(m.sum())
    s0, c0 = float((stored * m).sum()) / n, float((cand * m).sum()) / n
    ds, dc = (stored - s0) * m, (cand - c0) * m
    var, sd = float((dc * dc).sum()) / n, math.sqrt(float((ds * ds).sum()) / n)
    a = float((ds * dc).sum()) / n / var if var > 0 else 0.0
    err2 = (ds - a * dc) ** 2  # 0 at masked tokens
    per_row = np.sqrt(err2.sum(1) / np.maximum(m.sum(1), 1)) / (sd if sd > 0 else 1.0)
    return per_row, math.sqrt(float(err2.sum()) / n) / (sd if sd > 0 else 1.0)


def check_gae_masked_values(rollouts: Sequence[CheckRollout], ctx: CheckContext) -> CheckOutcome:
    """Stored ``advantages`` against PPO's GAE (arXiv:1506.02438) recomputed over policy tokens only
    and over the critic values under mask 0 (ROLL PR #447), each fitted by one affine map over the
    batch (whitening); gamma / lambda from the config or inferred. Fail on rows that match the
    masked-values version only; warn on values under mask 0 beyond ``masked_value_factor`` x the 99th
    percentile of |V| on policy tokens; skipped when neither version reproduces the advantages."""
    cfg = ctx.config
    make = CheckSpec("gae_masked_values", "credit", "advantages are GAE over policy tokens, not over masked critic values",
                    "apply response_mask to the values before GAE, or run GAE over policy tokens only (the next "
                    "value of a policy token is the next policy token's: verl's multi-turn GAE, "
                    "critic_audit.rl 'gae'); write values as 0 (or drop them) under mask 0", ("ROLL PR #447",))
    cols = ctx.columns
    rows = cols.rows_with("values", "advantages", "token_rewards", "response_mask") & (cols.n_turns >= 1)
    if not rows.any():
        return make(SKIP, reason="needs per-token values, rewards and advantages (verl values, token_level_rewards, "
                                 "advantages) of the same rows")
    idx = np.flatnonzero(rows)
    masked = _masked_values(cols, rows, idx, cfg.masked_value_factor)
    a_pol = cols.arrays["advantages"][masked.policy]
    if not a_pol.size or float(np.nanmax(a_pol)) == float(np.nanmin(a_pol)):
        return make(SKIP, reason="the stored advantages are constant on policy tokens: nothing to compare")
    del a_pol
    gamma, lam, how = _gamma_lambda(cols, idx, masked.gap, cfg)
    tol = cfg.gae_rtol
    # a sample of rows (those where the two versions can differ first, spread over the batch) settles a
    # clean batch; every row is compared once the sample shows the bug (or gae_rows = 0)
    rows_cmp = _rows_to_compare(masked.gap, cfg.gae_rows)
    c = _compare(cols, idx[rows_cmp], gamma, lam, tol)
    if c.bad.any() and len(rows_cmp) < len(idx):
        rows_cmp = np.arange(len(idx))
        c = _compare(cols, idx[rows_cmp], gamma, lam, tol)
    idx_all, idx = idx, idx[rows_cmp]
    measured = {"gamma": float(gamma), "lam": float(lam), "residual_policy_tokens_gae": c.all_ok,
                "residual_masked_values_gae": c.all_bug, "masked_value_p99_policy": masked.scale,
                "masked_value_max": masked.max_abs}
    n_big = int(masked.big_at.size)
    counts = {"trajectories_checked": int(len(idx_all)), "trajectories_compared": int(len(idx)),
              "trajectories_informative": int(c.differ.sum()),
              "trajectories": int(c.bad.sum()), "trajectories_policy_token_gae": int(c.good.sum()),
              "large_values_under_mask_0": n_big}
    ex = _gae_examples(cols, idx, c, masked, cfg.examples)
    with_gl = f"gamma {fmt(gamma)}, lambda {fmt(lam)} {how}"
    if len(idx) < len(idx_all):
        with_gl += f"; compared on a sample of {len(idx)} of {len(idx_all)} trajectories"
    if c.bad.any():
        return make(FAIL, summary=f"{int(c.bad.sum())} of {int(c.differ.sum())} informative trajectories carry "
                    f"advantages of GAE over masked critic values ({with_gl})", counts=counts, measured=measured,
                    examples=ex, n=cfg.examples)
    if min(c.all_ok, c.all_bug) >= tol:
        return make(SKIP, reason=f"the stored advantages are not PPO GAE of these values and rewards under any gamma / "
                    f"lambda tried (best relative residual {fmt(min(c.all_ok, c.all_bug))} at {with_gl}): another "
                    "estimator (GRPO, RLOO, a turn-level one) or values from another critic pass",
                    counts=counts, measured=measured,
                    examples=ex if n_big else (), n=cfg.examples)
    if n_big:
        return make(WARN, summary=f"advantages are GAE over policy tokens ({with_gl}), but {n_big} value(s) under mask "
                    f"0 exceed {fmt(cfg.masked_value_factor)}x the 99th percentile of |V| on policy tokens",
                    counts=counts, measured=measured, examples=ex, n=cfg.examples)
    return make(PASS, summary=f"advantages are GAE over policy tokens ({with_gl}; {int(c.good.sum())} of "
                f"{int(c.differ.sum())} informative trajectories tell the two apart)", counts=counts, measured=measured)


@dataclasses.dataclass(frozen=True)
class _MaskedValues:
    """The values under mask 0 a masked-values GAE reads, over the flat (N,) columns of the checked rows.

    Attributes:
        under: (N,) bool, tokens under mask 0 after their row's first policy token.
        policy: (N,) bool, the policy tokens of the checked rows.
        scale: the 99th percentile of |V| on those policy tokens (0.0 when there are none).
        big_at: int64 flat positions of the values under mask 0 beyond ``masked_value_factor x scale``.
        gap: (len(idx),) bool, the checked rows where the two GAE versions can differ.
        max_abs: the largest |V| under mask 0 (None when no token is under mask 0).
    """

    under: np.ndarray
    policy: np.ndarray
    scale: float
    big_at: np.ndarray
    gap: np.ndarray
    max_abs: float | None


def _masked_values(cols, rows: np.ndarray, idx: np.ndarray, factor: float) -> _MaskedValues:
    """The :class:`_MaskedValues` of the rows ``idx`` (``rows``: the same as a (B,) bool) with the
    warning threshold ``factor`` x the 99th percentile of |V| on policy tokens."""
    # over the flat columns: the values under mask 0 after each row's first policy token (the ones a
    # masked-values GAE reads), the scale of |V| on policy tokens, the rows with such tokens
    v_flat = cols.arrays["values"]
    first_turn = np.concatenate([[0], np.cumsum(cols.n_turns)[:-1]])[idx]
    edge = np.zeros(cols.N + 1, dtype=np.int8)
    np.add.at(edge, cols.turn_start[first_turn], 1)
    np.add.at(edge, cols.offsets[idx + 1], -1)
    under_flat = np.cumsum(edge[:-1], dtype=np.int8).astype(bool) & ~cols.mask
    pol = cols.mask if rows.all() else cols.mask & cols.tokens_of(rows)
    v_pol = np.abs(v_flat[pol])
    scale = order_quantile(v_pol, 0.99) if v_pol.size else 0.0  # (np.quantile's number, no full partition)
    del v_pol
    at = np.flatnonzero(under_flat)  # (the values under mask 0 only: no (N,) |V| copy)
    v_under = np.abs(v_flat[at])
    with np.errstate(invalid="ignore"):
        big_at = at[v_under > factor * max(scale, 1e-8)]
    gap = cols.row_sum(under_flat)[idx] > 0  # rows where the two versions can differ
    masked_max = float(np.nanmax(v_under)) if at.size else None
    return _MaskedValues(under_flat, pol, scale, big_at, gap, masked_max)


def _padded_rows(cols, sel: np.ndarray):
    """(mask, values, rewards, stored advantages, under mask 0, lengths) of rows ``sel``, padded."""
    m = _padded(cols, sel, cols.mask, 0.0) > 0  # (the selected rows only: no (N,) float copy of the mask)
    n = np.diff(cols.offsets)[sel]
    t = np.arange(m.shape[1])[None, :]
    first = np.where(m.any(1), m.argmax(1), m.shape[1])[:, None]
    return (m, _padded(cols, sel, cols.arrays["values"], 0.0),
            np.nan_to_num(_padded(cols, sel, cols.arrays["token_rewards"], 0.0)),
            np.nan_to_num(_padded(cols, sel, cols.arrays["advantages"], 0.0)), (t >= first) & (t < n[:, None]) & ~m, n)


def _gamma_lambda(cols, idx: np.ndarray, gap: np.ndarray, cfg) -> tuple[float, float, str]:
    """``(gamma, lambda, how)``: the config's, or the pair of :data:`GAMMAS` x :data:`LAMS` that
    reproduces the stored advantages best on :data:`_INFER_ROWS` of the rows ``idx`` (those of ``gap``
    first), stopping at the first one within ``gae_rtol / 10``."""
    # gamma and lambda: given, or the pair that reproduces the stored advantages best on a few rows
    if cfg.gamma is not None and cfg.lam is not None:
        return cfg.gamma, cfg.lam, "given"
    sub = np.concatenate([np.flatnonzero(gap), np.flatnonzero(~gap)])[:_INFER_ROWS]
    m_s, v_s, r_s, a_s, _, n_s = _padded_rows(cols, idx[sub])
    best, tried = (math.inf, 1.0, 1.0), 0
    pairs = [(g, lm) for g in ((cfg.gamma,) if cfg.gamma is not None else GAMMAS)
             for lm in ((cfg.lam,) if cfg.lam is not None else LAMS)]
    for g, lm in pairs:
        pair = _gae_pair(r_s, v_s, m_s, n_s, g, lm)
        res = min(_fit(a_s, c, m_s)[1] for c in pair)
        tried += 1
        if res < best[0]:
            best = (res, g, lm)
        if res < cfg.gae_rtol / 10:  # reproduced: no need to try the rest
            break
    _, gamma, lam = best
    return gamma, lam, f"inferred (best of {tried} of {len(pairs)} pairs tried on {len(sub)} rows)"


def _rows_to_compare(gap: np.ndarray, gae_rows: int) -> np.ndarray:
    """Indices into the checked rows to compare: all of them, or (when ``gae_rows`` is set and
    smaller) ``gae_rows`` spread evenly over those of ``gap``, topped up with the others if too few."""
    if gae_rows and len(gap) > gae_rows:
        pool = np.flatnonzero(gap) if gap.sum() >= gae_rows else np.concatenate([np.flatnonzero(gap),
                                                                                  np.flatnonzero(~gap)])
        return np.sort(pool[np.linspace(0, len(pool) - 1, gae_rows).round().astype(np.int64)])
    return np.arange(len(gap))


@dataclasses.dataclass(frozen=True)
class _Comparison:
    """The stored advantages of some rows against the two GAE versions (rows of the padded arrays).

    Attributes:
        r_ok, r_bug: per-row relative residuals against GAE over policy tokens / over masked values.
        all_ok, all_bug: the same over the compared rows at once.
        differ: bool per row, the two versions differ there (the row is informative).
        bad: bool per row, informative and matching the masked-values version only.
        good: bool per row, informative and matching the policy-token version.
        values: (rows, T_max) float64 padded critic values; ``under``: bool, the tokens under mask 0.
    """

    r_ok: np.ndarray
    r_bug: np.ndarray
    all_ok: float
    all_bug: float
    differ: np.ndarray
    bad: np.ndarray
    good: np.ndarray
    values: np.ndarray
    under: np.ndarray


def _compare(cols, sel: np.ndarray, gamma: float, lam: float, tol: float) -> _Comparison:
    """Compare the rows ``sel`` against both GAE versions under ``gamma``, ``lam`` (a row matches a
    version when its relative residual is below ``tol``; informative when they differ by 10 x tol)."""
    m, v, r, a, under, n = _padded_rows(cols, sel)
    ok, bug = _gae_pair(r, v, m, n, gamma, lam)
    r_ok, all_ok = _fit(a, ok, m)
    r_bug, all_bug = _fit(a, bug, m)
    sd = float(ok[m].std()) or 1.0
    diff = np.sqrt((np.where(m, ok - bug, 0.0) ** 2).sum(1) / np.maximum(m.sum(1), 1)) / sd
    differ = diff > 10 * tol
    return _Comparison(r_ok, r_bug, all_ok, all_bug, differ, differ & (r_bug < tol) & (r_ok >= tol),
                       differ & (r_ok < tol), v, under)


def _gae_examples(cols, idx: np.ndarray, c: _Comparison, masked: _MaskedValues, n: int) -> list[Example]:
    """The examples: the ``bad`` rows of ``c`` (compared rows ``idx``) that match the masked-values
    GAE best, then values under mask 0 beyond the threshold, up to ``2 * n`` in all."""
    ex: list[Example] = []
    for j in np.flatnonzero(c.bad)[top(-c.r_bug[c.bad], n)]:
        i = int(idx[j])
        at = np.flatnonzero(c.under[j])
        p = int(at[np.argmax(np.abs(c.values[j, at]))]) if at.size else None
        ex.append(Example(cols.ids[i], None if p is None else _prev_turn_of(cols, i, p), p,
                          f"stored advantages match GAE over the masked critic values (residual {fmt(c.r_bug[j])}), "
                          f"not over policy tokens only (residual {fmt(c.r_ok[j])}); largest value under mask 0: "
                          f"{fmt(float(c.values[j, p])) if p is not None else 'n/a'}", 1e6 - float(c.r_bug[j])))
    v_flat = cols.arrays["values"]
    for q in masked.big_at[: max(0, 2 * n - len(ex))]:
        i = int(np.searchsorted(cols.offsets, q, side="right") - 1)
        p, v = int(q - cols.offsets[i]), float(v_flat[q])
        ex.append(Example(cols.ids[i], _prev_turn_of(cols, i, p), p, f"value {fmt(v)} under mask 0 "
                          f"({fmt(abs(v) / max(masked.scale, 1e-8))}x the 99th percentile of |V| on policy tokens)",
                          abs(v)))
    return ex


def _prev_turn_of(cols, i: int, pos: int) -> int | None:
    k = cols.turn[cols.row_slice(i)][: pos + 1]
    k = k[k >= 0]
    return int(k[-1]) if k.size else None


# --------------------------------------------------------------------------------------------- turn ids


def check_turn_ids(rollouts: Sequence[CheckRollout], ctx: CheckContext) -> CheckOutcome:
    """Logged per-token turn ids (``turn_ids`` / ``turn_index``) against the mask's runs and, with a
    tokenizer, the template's assistant turns: fail when several spans share one id (AReaL PR #1666)."""
    make = CheckSpec("turn_ids", "credit", "one logged turn id per assistant span (mask runs, template turns)",
                    "number the turns where the chat template's assistant turns are: a new id at each assistant "
                    "span (each run of response_mask == 1), the same id on all of its tokens; turn-level "
                    "estimators (turn GAE, MPO) read these ids", ("AReaL PR #1666",))
    cols = ctx.columns
    rows = cols.rows_with("logged_turn_ids", "response_mask") & (cols.n_turns >= 1)
    if not rows.any():
        return make(SKIP, reason="the rollouts carry no per-token turn ids (turn_ids / turn_index)")
    lt = cols.arrays["logged_turn_ids"]
    pol = cols.mask & cols.tokens_of(rows)
    missing = pol & ~np.isfinite(lt)
    # per mask run (turn): its logged id (at its first token) and whether the id changes inside it
    first_id = lt[cols.turn_start]
    same = np.ones(len(lt), dtype=bool)
    same[1:] = (lt[1:] == lt[:-1]) | (np.isnan(lt[1:]) & np.isnan(lt[:-1]))
    changes = cols.turn_sum((~same).astype(np.float64)) - (~same[cols.turn_start]).astype(np.float64)
    sel = rows[cols.turn_row] & np.isfinite(first_id)
    # distinct ids over a row's runs: (row, id) pairs of K_all turns
    pairs = np.unique(np.stack([cols.turn_row[sel], first_id[sel].astype(np.int64)], axis=1), axis=0)
    per_row = np.bincount(pairs[:, 0], minlength=cols.B) if pairs.size else np.zeros(cols.B, dtype=np.int64)
    per_turn_split = changes > 0
    spans = cols.n_turns.copy()
    source = "mask runs"
    if ctx.markers is not None:  # the template's assistant turns, where the tokenizer finds them in the ids
        from critic_audit.check.markers import expected_turns

        for i in np.flatnonzero(rows):
            r = rollouts[i]
            if r.token_ids is None or r.mask_from_template:
                continue
            found = expected_turns(r.token_ids, ctx.markers)
            if len(found) > int(spans[i]):  # more template turns than mask runs: count ids inside them
                x = lt[cols.row_slice(i)]
                inside = np.concatenate([x[a:b] for a, b, _ in found])
                spans[i], per_row[i] = len(found), np.unique(inside[np.isfinite(inside)]).size
        source = "mask runs and the template's assistant turns"
    merged = rows & (spans >= 2) & (per_row < spans) & (per_row > 0)
    split = int((per_turn_split & rows[cols.turn_row]).sum())
    ex: list[Example] = []
    for i in np.flatnonzero(merged)[top((spans - per_row)[merged], ctx.config.examples)]:
        sl = cols.row_slice(i)
        vals = np.unique(lt[sl][cols.mask[sl] & np.isfinite(lt[sl])]).astype(np.int64)
        starts = cols.pos[cols.turn_start[cols.turn_row == i]][:6]
        ex.append(Example(cols.ids[i], None, None, f"{int(spans[i])} assistant spans ({source}; runs start at "
                          f"{', '.join(map(str, starts.tolist()))}) carry {len(vals)} turn id(s) "
                          f"({', '.join(map(str, vals[:6].tolist()))})", float(spans[i] - per_row[i])))
    n_rows = int(rows.sum())
    multi = int((rows & (spans >= 2)).sum())
    counts = {"trajectories_checked": n_rows, "multi_turn_trajectories": multi, "trajectories": int(merged.sum()),
              "turns_with_several_ids": split, "policy_tokens_without_id": int(missing.sum())}
    measured = {"share_merged": share(int(merged.sum()), multi)}
    if merged.any():
        return make(FAIL, summary=f"{int(merged.sum())} of {multi} multi-turn trajectories give several assistant spans "
                    f"one turn id (compared with the {source})", counts=counts, measured=measured, examples=ex,
                    n=ctx.config.examples)
    return make(PASS, summary=f"each assistant span has its own turn id ({multi} multi-turn trajectories; "
                f"{split} mask run(s) carry several ids)", counts=counts, measured=measured)
