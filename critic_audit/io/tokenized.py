"""Read already-tokenized rollouts straight into the canonical tables (no chat template).

Two row layouts, in Parquet (read row group by row group) or JSON / JSONL (JSONL line by line):

* **sequence rows** (verl-style): ``input_ids`` (list of ints), ``response_mask`` (same length, 1 on
  policy tokens; turn k = the k-th run of 1s; or verl's DataProto layout, over the R response tokens
  beside ``prompts`` + ``responses`` = ``input_ids``: :func:`_verl_layout`), optional ``attention_mask`` (positions with 0 are
  padding and dropped), ``values`` (same length; ``values[t]`` is V of the state before token t, as
  verl stores it, so it becomes the canonical ``value`` at position t), ``old_log_probs`` (length
  checked, not stored), ``reward`` (a number, or per-token rewards that are summed), ``success``, an
  id (``trajectory_id``, ``id``, ``traj_id``), a group (``group_id``, ``uid``, ``prompt_id``, ...) and
  a training ``step`` (-> ``checkpoint``). Per-token arrays that the tables have no column for (the
  per-token rewards with their positions, ``old_log_probs``, the sampler's ``rollout_log_probs``,
  ``returns``) are kept beside them in :attr:`TokenSequence.token_arrays` (read by ``critic-audit check``).
* **step rows** (PrimeIntellect verifiers): ``prompt_ids``, ``completion_ids``, optional
  ``completion_mask`` (default all 1) and ``reward``, one row per model call; consecutive rows with
  the same id are the steps of one rollout. A row may instead hold all its steps in a ``trajectory``
  list (each step with those fields, directly or under ``tokens``). Each step's prompt must extend the
  sequence so far (the previous prompt and completion); the tokens it adds are environment tokens
  (mask 0), then the completion's tokens carry its mask. The rollout's reward is the row's ``reward``
  (for step rows: the last step's).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from critic_audit.errors import InputError
from critic_audit.io.records import (
    JSONL_SUFFIXES, MAX_MAGNITUDE, REWARD_KEYS, ReadOptions, ReadReport, RecordContext, convert_records, error, finite_number,
    iter_json_records, iter_jsonl, number_array, record_fields, short, type_name,
)
from critic_audit.schema import TOKEN_SCHEMA, TRAJECTORY_SCHEMA, json_problem, validate, value_error

__all__ = ["read_tokenized", "iter_tokenized", "is_tokenized_record", "tokenized_columns", "sequences_to_tables",
           "TokenSequence", "steps_to_sequence", "steps_turn_starts", "steps_log_probs", "sniff_record", "sniff_file", "read_file"]

TOK_ID_KEYS = ("trajectory_id", "id", "traj_id")
TOK_GROUP_KEYS = ("group_id", "uid", "prompt_id", "task_id", "question_id", "instance_id", "example_id")
#: Fields holding token data (not repeated in the metadata).
_TOKEN_FIELDS = ("input_ids", "response_mask", "attention_mask", "values", "old_log_probs", "prompt_ids",
                 "completion_ids", "completion_mask", "prompt_mask", "completion_logprobs", "trajectory",
                 "position_ids", "token_level_rewards", "token_level_scores", "advantages", "returns",
                 "rollout_log_probs", "turn_ids", "turn_index", "prompts", "responses")
#: verl ``DataProto`` fields over the response only ([B, R], the last R of ``input_ids``' P + R tokens):
#: a row in that layout has them placed at the response's positions (:func:`_verl_layout`)
RESPONSE_FIELDS = ("response_mask", "values", "old_log_probs", "rollout_log_probs", "ref_log_prob", "advantages",
                   "returns", "token_level_rewards", "token_level_scores", "turn_ids")
#: :attr:`TokenSequence.token_arrays` name -> the row fields it is read from (the first present wins).
SIDE_ARRAYS: dict[str, tuple[str, ...]] = {
    "token_rewards": ("token_level_rewards", "token_level_scores", "reward", "score"),
    "old_log_probs": ("old_log_probs",),
    "rollout_log_probs": ("rollout_log_probs",),
    "returns": ("returns",),
    "advantages": ("advantages",),
    "turn_ids": ("turn_ids", "turn_index"),
}
#: :data:`SIDE_ARRAYS` whose entries may be NaN / +-inf (log-probs from an engine that emits them):
#: kept, and their positions named in :attr:`TokenSequence.nonfinite`, instead of refusing the row.
NONFINITE_OK = ("old_log_probs", "rollout_log_probs")
#: :attr:`TokenSequence.nonfinite` codes: what a non-finite entry was.
NONFINITE_CODES = {1: "NaN", 2: "+inf", 3: "-inf"}


def nonfinite_codes(x: np.ndarray, real: np.ndarray | None = None) -> np.ndarray | None:
    """(T,) int8 code per entry of ``x`` (0 finite or not ``real``; :data:`NONFINITE_CODES`: 1 NaN,
    2 +inf, 3 -inf), or None when every ``real`` entry is finite. ``real``: (T,) bool, False at
    nulls (a null is "no entry", not a NaN); default all True."""
    bad = ~np.isfinite(x)
    if real is not None:
        bad &= real
    if not bad.any():
        return None
    with np.errstate(invalid="ignore"):
        return np.where(bad, np.where(np.isnan(x), 1, np.where(x > 0, 2, 3)), 0).astype(np.int8)


def is_tokenized_record(rec: Any) -> bool:
    """A sequence row or a step row (used by format detection)."""
    if not isinstance(rec, Mapping):
        return False
    if "input_ids" in rec and "response_mask" in rec:
        return True
    if "prompt_ids" in rec and "completion_ids" in rec:
        return True
    traj = rec.get("trajectory")
    if isinstance(traj, list) and traj and isinstance(traj[0], Mapping):
        st = traj[0].get("tokens") if isinstance(traj[0].get("tokens"), Mapping) else traj[0]
        return "prompt_ids" in st and "completion_ids" in st
    return False


def sniff_record(rec: Any, options: ReadOptions) -> bool:
    return is_tokenized_record(rec)


def sniff_file(path: Path, head: str, options: ReadOptions) -> bool:
    """A Parquet file whose columns are tokenized rows."""
    if not path.name.lower().endswith(".parquet"):
        return False
    try:
        return tokenized_columns(list(pl.read_parquet_schema(path)))
    except Exception:  # corrupt: the canonical-table reader reports it
        return False


def tokenized_columns(columns: list[str]) -> bool:
    """Parquet columns of a tokenized file (as opposed to a canonical tokens table)."""
    cols = set(columns)
    return {"input_ids", "response_mask"} <= cols or {"prompt_ids", "completion_ids"} <= cols


@dataclass
class TokenSequence:
    """One tokenized rollout on its way to the canonical tables."""

    trajectory_id: str
    token_ids: np.ndarray
    response_mask: np.ndarray
    values: np.ndarray | None
    reward: float | None
    success: bool | None
    group_id: str | None
    checkpoint: str | None
    source: str | None
    metadata: dict[str, Any]
    #: per-token side arrays (T,) float (float64; a Parquet file's float32 columns stay float32) aligned
    #: with ``token_ids`` (NaN = no entry), named as in
    #: :data:`SIDE_ARRAYS`; ``token_rewards`` keeps each reward at its own position (the tables only
    #: hold the row's sum). A field that is not a list of numbers of the row's length is left out and
    #: named in ``metadata["side_array_problems"]``; ``metadata["rewards_on_padding"]`` counts non-zero
    #: rewards at dropped padding positions; ``metadata["token_rewards_field"]`` names the field read.
    token_arrays: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)
    #: :data:`SIDE_ARRAYS` name -> (T,) int8, :data:`NONFINITE_CODES` where the row holds NaN or +-inf
    #: (not a null: a null is "no entry"), 0 elsewhere; those entries are NaN in ``token_arrays``. Only
    #: fields with such entries appear.
    nonfinite: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)
    #: (T,) bool, True at the first policy token of each turn, for rows built from steps (one LLM call
    #: per step: turn k = step k even when no prompt token separates two completions); None: turn k =
    #: the k-th run of ``response_mask == 1``.
    turn_starts: np.ndarray | None = None
    #: Where the row was read in its file, ``{index} (line {n})`` (:meth:`RecordContext.label`), for errors
    #: raised after reading (``check``'s side-array lengths name file and line); None: not known.
    record: str | None = None

    def __post_init__(self) -> None:
        """Every reader of token ids builds one (tokenized rows, ATIF and NeMo Gym token ids): its text
        fields are checked here, as :class:`critic_audit.schema.Conversation` checks its own (a lone
        surrogate cannot be written as UTF-8; nesting past the bound), so the reader skips and counts it."""
        bad = json_problem({"id": self.trajectory_id, "group_id": self.group_id, "checkpoint": self.checkpoint,
                            "source": self.source, "metadata": self.metadata})
        if bad is not None:
            raise value_error(bad, f"trajectory {short(self.trajectory_id, 40)}")


def _int_list(v: Any, name: str, ctx: RecordContext, *, mask: bool = False) -> np.ndarray:
    if isinstance(v, np.ndarray) and v.ndim == 1 and v.dtype.kind in "iu" + ("b" if mask else ""):
        arr = v.astype(np.int64, copy=False)  # a column-wise reader's view: checked whole
        if arr.size == 0 or (arr.min() >= 0 and arr.max() <= (1 if mask else 2**31 - 1)):
            return arr  # (a uint64 beyond int64 wraps below 0: the entry loop below names it)
    if hasattr(v, "tolist") and not isinstance(v, (list, str)):
        v = v.tolist()
    if not isinstance(v, list):
        raise error(ctx, "bad_tokens", f"{name} is {type_name(v)} {short(v, 40)}, not a list",
                    f"write {name} as a list of integers")
    lo, hi = (0, 1) if mask else (0, 2**31 - 1)
    try:
        arr = np.asarray(v)
    except (ValueError, TypeError, OverflowError):
        arr = np.asarray([], dtype=object)
    if arr.ndim == 1 and (arr.dtype.kind in "iub" or arr.size == 0) and (arr.dtype.kind != "b" or mask):
        arr = arr.astype(np.int64) if arr.size else np.zeros(0, dtype=np.int64)
        if arr.size == 0 or (arr.min() >= lo and arr.max() <= hi):
            return arr
    for i, x in enumerate(v):  # find the first bad entry for the message
        ok = (isinstance(x, bool) and mask) or (isinstance(x, int) and not isinstance(x, bool)) \
            or (isinstance(x, float) and x.is_integer())
        if not ok or not (lo <= x <= hi):
            want = "0/1" if mask else "a token id (0 <= id < 2^31)"
            raise error(ctx, "bad_tokens", f"{name}[{i}] = {short(x, 30)} is not {want}",
                        f"write {name} as a list of {'0/1 values' if mask else 'non-negative integer ids'}")
    return np.asarray([int(x) for x in v], dtype=np.int64)


def _float_list(v: Any, name: str, ctx: RecordContext, *, nonfinite_ok: bool = False) -> np.ndarray:
    if hasattr(v, "tolist") and not isinstance(v, (list, str)):
        v = v.tolist()
    if not isinstance(v, list):
        raise error(ctx, "bad_values", f"{name} is {type_name(v)} {short(v, 40)}, not a list",
                    f"write {name} as a list of numbers")
    out = number_array(v, finite=not nonfinite_ok)
    if out is None:  # find the first bad entry for the message
        i, x = next((i, x) for i, x in enumerate(v) if x is not None and finite_number(x) is None
                    and not (nonfinite_ok and isinstance(x, float)))
        raise error(ctx, "bad_values", f"{name}[{i}] = {short(x, 30)} is not a finite number",
                    f"write {name} as a list of finite numbers (null where unknown)")
    with np.errstate(invalid="ignore"):
        big = np.isfinite(out) & (np.abs(out) > MAX_MAGNITUDE)  # (+-inf of NONFINITE_OK fields: kept, counted)
    if big.any():
        i = int(np.flatnonzero(big)[0])
        raise error(ctx, "bad_values", f"{name}[{i}] = {out[i]:g} is out of range (|x| > {MAX_MAGNITUDE:g}: the "
                    "audit's statistics would overflow)", f"write {name} at its real scale (null where unknown)")
    return out


def _same_len(arr: np.ndarray, n: int, name: str, ctx: RecordContext) -> None:
    if len(arr) != n:
        raise error(ctx, "length_mismatch", f"{name} has {len(arr)} entries, input_ids {n}",
                    f"give {name} one entry per token of input_ids")


def _reward_value(rec: Mapping[str, Any]) -> Mapping[str, Any]:
    """Replace a per-token reward list by its sum (so the chat reward parser reads it)."""
    for k in REWARD_KEYS:
        v = rec.get(k)
        if hasattr(v, "tolist") and not isinstance(v, (list, str)):
            v = v.tolist()
        arr = number_array(v, null=False, finite=False) if isinstance(v, list) else None
        if arr is not None:
            return {**rec, k: float(arr.sum())}  # NaN / inf sums are refused by the reward parser
    return rec


#: Per-token reward fields (verl) whose sum is the row's outcome when it has no scalar reward.
TOKEN_REWARD_KEYS = ("token_level_rewards", "token_level_scores")


def token_reward_sum(v: Any) -> float | None:
    """The outcome of a per-token reward list (verl ``token_level_rewards``): the sum of its entries,
    nulls counted as 0 (no reward there); NaN or +-inf when an entry is (the reward parser then
    refuses the row, naming the field); None when ``v`` is not a list of numbers."""
    if hasattr(v, "tolist") and not isinstance(v, (list, str)):
        v = v.tolist()
    arr = number_array(v, finite=False) if isinstance(v, list) else None
    if arr is None:
        return None
    nulls = v.count(None)
    if nulls and int(np.isnan(arr).sum()) == nulls and np.isfinite(arr[~np.isnan(arr)]).all():
        return float(np.nansum(arr))
    return float(arr.sum())


#: per-token fields that must be finite where given (null: no entry): the per-token rewards, and the
#: trainer's returns and advantages (a NaN one would read as 0 in the credit checks); log-probs may be
#: non-finite (:data:`NONFINITE_OK`: what the engine emitted, counted by ``check``)
FINITE_KEYS = (*TOKEN_REWARD_KEYS, *SIDE_ARRAYS["returns"], *SIDE_ARRAYS["advantages"])


def _finite_token_rewards(rec: Mapping[str, Any], ctx: RecordContext) -> None:
    """Refuse a row whose per-token rewards (:data:`TOKEN_REWARD_KEYS`), returns or advantages
    (:data:`FINITE_KEYS`) hold a NaN / +-inf entry, naming the field and its first such index, as for
    ``values`` (a reward cannot be "no entry": a non-finite one turned into 0 would pass
    reward_on_masked_token and fail turn_rewards_sum for the wrong cause; a NaN advantage or return
    would read as 0 in the credit checks). Nulls are "no entry"; a list that is not numbers is left
    to the side arrays.

    Raises:
        InputError: ``bad_values`` (``--lenient`` skips and counts the row).
    """
    for key in FINITE_KEYS:
        v = rec.get(key)
        if hasattr(v, "tolist") and not isinstance(v, (list, str)):
            v = v.tolist()
        arr = number_array(v, finite=False) if isinstance(v, list) else None
        if arr is None or np.isfinite(arr).all():
            continue
        codes = nonfinite_codes(arr, np.asarray([x is not None for x in v], dtype=bool))
        if codes is not None:
            i = int(np.flatnonzero(codes)[0])
            what = "reward" if key in TOKEN_REWARD_KEYS else "return" if key in SIDE_ARRAYS["returns"] else "advantage"
            raise error(ctx, "bad_values", f"{key}[{i}] = {short(v[i], 30)} is not a finite number "
                        f"({int(np.count_nonzero(codes))} such entr{'y' if np.count_nonzero(codes) == 1 else 'ies'})",
                        f"write {key} as a list of finite numbers (null where there is no {what})")


def _outcome_from_tokens(rec: Mapping[str, Any], opts: ReadOptions,
                         summed: tuple[str, float | None] | None) -> tuple[Mapping[str, Any], str | None]:
    """``rec`` with the sum of its per-token rewards under their field's name, and that name, when the
    row has no scalar reward (no :data:`REWARD_KEYS` field, or a null one) and no ``--reward-key``;
    ``(rec, None)`` otherwise. ``summed``: ``(field, sum)`` computed column-wise by the reader (None:
    computed here from the row's own list)."""
    if opts.reward_key is not None or any(rec.get(k) is not None for k in REWARD_KEYS):
        return rec, None
    if summed is None:
        key = next((k for k in TOKEN_REWARD_KEYS if isinstance(rec.get(k), list)
                    or hasattr(rec.get(k), "tolist")), None)
        if key is None:
            return rec, None
        summed = (key, token_reward_sum(rec[key]))
    key, total = summed
    if total is None:
        return rec, None
    return {**rec, key: total}, key


def _side_arrays(rec: Mapping[str, Any], n: int, keep: np.ndarray, meta: dict[str, Any],
                 nonfinite: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
    """The :data:`SIDE_ARRAYS` of a sequence row, padding dropped (lenient: problems go to ``meta``);
    NaN / +-inf entries (not nulls) of each field are marked in ``nonfinite`` (name -> (T,) bool)."""
    out: dict[str, np.ndarray] = {}
    for name, keys in SIDE_ARRAYS.items():
        lists = {k: v.tolist() if hasattr(v, "tolist") else v for k in keys if (v := rec.get(k)) is not None}
        key = next((k for k, v in lists.items() if isinstance(v, list)), None)
        if key is None:
            continue
        arr = number_array(lists[key], finite=False)  # NaN: no entry; -inf: a log-prob of 0
        if arr is None or len(arr) != n:
            meta.setdefault("side_array_problems", {})[key] = "not a list of numbers, one per input_ids token"
            continue
        if name == "token_rewards" and np.any(np.nan_to_num(arr[~keep]) != 0):
            meta["rewards_on_padding"] = int(np.count_nonzero(np.nan_to_num(arr[~keep])))
        if name == "token_rewards":
            meta["token_rewards_field"] = key
        out[name] = arr[keep]
        if nonfinite is not None and not np.isfinite(out[name]).all():
            real = np.asarray([x is not None for x in lists[key]], dtype=bool)[keep]  # a null is "no entry"
            codes = nonfinite_codes(out[name], real)
            if codes is not None:
                nonfinite[name] = codes
                out[name] = np.where(codes > 0, np.nan, out[name])
    return out


def _fields(rec: Mapping[str, Any], ctx: RecordContext, opts: ReadOptions,
            summed: tuple[str, float | None] | None = None):
    """Id, reward, success, group, checkpoint of a row; ids from :data:`TOK_ID_KEYS` and groups from
    :data:`TOK_GROUP_KEYS` (``uid`` is verl's group uid, shared by the rollouts of one prompt). A row
    without a scalar reward takes the sum of its per-token rewards (:data:`TOKEN_REWARD_KEYS`;
    ``summed``: that sum as the column-wise reader computed it)."""
    rec = _reward_value(rec)
    rec, reward_key = _outcome_from_tokens(rec, opts, summed)
    id_key = opts.id_key or next((k for k in TOK_ID_KEYS if k in rec), None)
    group_key = opts.group_key or next((k for k in TOK_GROUP_KEYS if k in rec), None)
    return rec, record_fields(rec, ctx, _row_options(opts, id_key, group_key, reward_key or opts.reward_key))


@functools.lru_cache(maxsize=64)
def _row_options(opts: ReadOptions, id_key: str | None, group_key: str | None,
                 reward_key: str | None) -> ReadOptions:
    """``opts`` with the fields one row's id, group and reward are read from (built once per set of
    keys, not per row: a file's rows name the same ones)."""
    none = "\x00none"  # a field name no record has: "no such field"
    return dataclasses.replace(opts, id_key=id_key or none, group_key=group_key or none, reward_key=reward_key)


def _metadata(rec: Mapping[str, Any], used: set[str]) -> dict[str, Any]:
    """The row's other fields (not its token fields nor those ``used`` for id, reward, ...); a reward
    summed from per-token rewards names their field under ``reward_summed_from``."""
    out = {}
    summed = next((k for k in TOKEN_REWARD_KEYS if k in used), None)
    if summed is not None:
        out["reward_summed_from"] = summed
    for k, v in rec.items():
        if k in used or k in _TOKEN_FIELDS:
            continue
        if hasattr(v, "tolist") and not isinstance(v, (list, str)):
            v = v.tolist()
        out[str(k)] = v
    return out


def _size(v: Any) -> int | None:
    return len(v) if isinstance(v, (list, tuple, np.ndarray)) else None


def _verl_layout(rec: Mapping[str, Any]) -> Mapping[str, Any]:
    """``rec`` with its response-only fields (:data:`RESPONSE_FIELDS`, R entries) placed at the last R
    of ``input_ids``' P + R positions: ``response_mask`` 0 and the others null over the prompt. That is
    verl's ``DataProto`` layout (``input_ids`` = ``prompts`` + ``responses``, ``response_mask`` over
    the responses, ``attention_mask`` over both); it is taken only when the row says so: ``responses``
    equal to ``input_ids``' last R ids, or ``prompts`` equal to its first P. Any other row: as it is."""
    ids, mask = rec.get("input_ids"), rec.get("response_mask")
    n, r = _size(ids), _size(mask)
    if n is None or r is None or r >= n:
        return rec
    p = n - r
    resp, prom = rec.get("responses"), rec.get("prompts")
    if not ((_size(resp) == r and list(ids[p:]) == list(resp)) or (_size(prom) == p and list(ids[:p]) == list(prom))):
        return rec
    out = dict(rec)
    for k in RESPONSE_FIELDS:
        v = out.get(k)
        if _size(v) == r:
            out[k] = [0 if k == "response_mask" else None] * p + list(v.tolist() if isinstance(v, np.ndarray) else v)
    return out


def _verl_layout_table(table: Any) -> Any:
    """:func:`_verl_layout` over a row group at once (list columns rebuilt with numpy offsets): the
    table as it is unless it has ``responses`` or ``prompts`` and every row's ``response_mask`` is
    shorter than its ``input_ids`` by the ``prompts`` length or by as much as ``responses`` is long
    (ids not compared: a row whose ids differ is read row by row, which compares them)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    names = table.column_names
    if not ({"responses", "prompts"} & set(names)):
        return table
    got = [_flat(table.column(c)) for c in ("input_ids", "response_mask")]
    if got[0] is None or got[1] is None or np.array_equal(got[0][1], got[1][1]):
        return table
    n, r = got[0][1], got[1][1]
    p = n - r
    other = _flat(table.column("responses")) if "responses" in names else None
    said = other is not None and np.array_equal(other[1], r)
    if not said and "prompts" in names:
        other = _flat(table.column("prompts"))
        said = other is not None and np.array_equal(other[1], p)
    if not said or (p < 0).any():
        return table
    off = np.concatenate([[0], np.cumsum(n)])
    dst = np.repeat(off[:-1] + p, r) + np.arange(int(r.sum())) - np.repeat(np.cumsum(r) - r, r)
    src = np.full(int(n.sum()), -1, dtype=np.int64)
    src[dst] = np.arange(int(r.sum()))
    where = pa.array(src, mask=src < 0)
    offsets = pa.array(off, type=pa.int64())
    for k in RESPONSE_FIELDS:
        f = _flat(table.column(k)) if k in names else None
        if f is None or not np.array_equal(f[1], r):
            continue
        child = pc.take(f[0], where)
        if k == "response_mask":
            child = pc.fill_null(child, pa.scalar(0, child.type))
        table = table.set_column(names.index(k), k, pa.LargeListArray.from_arrays(offsets, child))
    return table


def _sequence_row(rec: Mapping[str, Any], ctx: RecordContext, opts: ReadOptions, source: str) -> TokenSequence:
    rec = _verl_layout(rec)
    raw = rec  # before _fields sums a per-token reward list
    rec, f = _fields(rec, ctx, opts)
    _finite_token_rewards(raw, ctx)
    ids = _int_list(rec.get("input_ids"), "input_ids", ctx)
    n = len(ids)
    mask = _int_list(rec.get("response_mask"), "response_mask", ctx, mask=True)
    _same_len(mask, n, "response_mask", ctx)
    keep = np.ones(n, dtype=bool)
    if rec.get("attention_mask") is not None:
        att = _int_list(rec["attention_mask"], "attention_mask", ctx, mask=True)
        _same_len(att, n, "attention_mask", ctx)
        keep = att.astype(bool)
    values = None
    if rec.get("values") is not None:
        values = _float_list(rec["values"], "values", ctx)
        _same_len(values, n, "values", ctx)
        missing = np.flatnonzero(mask.astype(bool) & keep & np.isnan(values))
        if missing.size:
            raise error(ctx, "missing_value", f"values[{int(missing[0])}] is null at a policy token "
                        f"({missing.size} such token(s))",
                        "give every response_mask = 1 token a value, or drop the values field to score with --critic")
        values = values[keep]
    if rec.get("old_log_probs") is not None:
        # NaN / inf log-probs are data for `critic-audit check` (named there), not a broken row
        _same_len(_float_list(rec["old_log_probs"], "old_log_probs", ctx, nonfinite_ok=True), n, "old_log_probs", ctx)
    meta = _metadata(rec, f.used)
    nonfinite: dict[str, np.ndarray] = {}
    side = _side_arrays(raw, n, keep, meta, nonfinite)
    return TokenSequence(f.trajectory_id, ids[keep], mask[keep].astype(bool), values, f.reward, f.success,
                         f.group_id, f.checkpoint, source, meta, side, nonfinite,
                         record=ctx.label(with_id=False))


def steps_to_sequence(steps: list[Any], ctx: RecordContext) -> tuple[np.ndarray, np.ndarray]:
    """``(ids, mask)``: the (T,) int64 token ids of a rollout's steps (each step's ``prompt_ids`` must
    extend the previous prompt + completion) and the (T,) bool mask (True on completion tokens whose
    ``completion_mask`` is 1). Whole-array work per step (a step's lists may be numpy arrays).

    Raises:
        InputError: a step that is not an object, a bad id or mask entry, a mask of another length, or
            a prompt that does not extend the sequence (reasons ``bad_step``, ``bad_tokens``,
            ``length_mismatch``, ``not_prefix``).
    """
    seq = np.zeros(0, dtype=np.int64)
    mask: list[np.ndarray] = []
    for k, st in enumerate(steps):
        if not isinstance(st, Mapping):
            raise error(ctx, "bad_step", f"step {k} is {type_name(st)}, not an object",
                        "write each step as {prompt_ids, completion_ids, completion_mask}")
        tok = st.get("tokens") if isinstance(st.get("tokens"), Mapping) else st
        p = _int_list(tok.get("prompt_ids"), f"step {k} prompt_ids", ctx)
        c = _int_list(tok.get("completion_ids"), f"step {k} completion_ids", ctx)
        cm = tok.get("completion_mask")
        cmask = np.ones(len(c), dtype=bool) if cm is None else \
            _int_list(cm, f"step {k} completion_mask", ctx, mask=True).astype(bool)
        if len(cmask) != len(c):
            raise error(ctx, "length_mismatch", f"step {k}: completion_mask has {len(cmask)} entries, "
                        f"completion_ids {len(c)}", "give completion_mask one entry per completion token")
        if len(p) < len(seq) or not np.array_equal(p[: len(seq)], seq):
            raise error(ctx, "not_prefix", f"step {k}'s prompt_ids do not extend the sequence of the steps before it",
                        "write steps whose prompt is the previous prompt + completion + new environment tokens "
                        "(a template that re-renders earlier turns breaks this), or one sequence row per rollout")
        mask += [np.zeros(len(p) - len(seq), dtype=bool), cmask]
        seq = np.concatenate([p, c])
    return seq, np.concatenate(mask) if mask else np.zeros(0, dtype=bool)


def steps_turn_starts(steps: list[Any], mask: np.ndarray) -> np.ndarray:
    """(T,) bool: True at the first policy token (``mask`` True) of each step's completion, so that turn
    k is step k (a step whose completion directly follows the previous one, with no prompt token
    between them, is still a turn of its own; a step without policy tokens is no turn). ``mask``: the
    (T,) bool response_mask :func:`steps_to_sequence` returned for the same ``steps``."""
    starts = np.zeros(len(mask), dtype=bool)
    for st in steps:
        tok = st.get("tokens") if isinstance(st.get("tokens"), Mapping) else st
        p, c = len(tok["prompt_ids"]), len(tok["completion_ids"])
        on = np.flatnonzero(mask[p:p + c])
        if on.size:
            starts[p + on[0]] = True
    return starts


def steps_log_probs(steps: list[Any], n: int, key: str) -> np.ndarray | None:
    """(T,) float64 sampler log-probs (nats) of step rows at each step's completion tokens, NaN at the
    tokens the steps add before them (environment, prompt); ``key`` names each step's log-prob list
    (verifiers ``completion_logprobs``, NeMo Gym ``generation_log_probs``, ATIF ``logprobs``). None when a
    step has none, or not one finite number per completion token. The steps must chain
    (:func:`steps_to_sequence` holds)."""
    out = np.full(n, np.nan)
    for st in steps:
        tok = st.get("tokens") if isinstance(st, Mapping) and isinstance(st.get("tokens"), Mapping) else st
        if not isinstance(tok, Mapping):
            return None
        lp, c, p = tok.get(key), tok.get("completion_ids"), tok.get("prompt_ids")
        if not isinstance(c, (list, np.ndarray)) or not isinstance(p, (list, np.ndarray)):
            return None
        arr = _float_entries(lp)
        if arr is None or len(arr) != len(c):
            return None
        if not np.isfinite(arr).all() or arr.ndim != 1 or len(p) + len(c) > n:
            return None
        out[len(p):len(p) + len(c)] = arr
    return out


def _float_entries(v: Any) -> np.ndarray | None:
    """(n,) float64 of a list of numbers (not booleans) or a numeric 1-D numpy array; None otherwise."""
    if isinstance(v, np.ndarray) and v.ndim == 1 and v.dtype.kind in "fiu":
        return v.astype(np.float64)
    if hasattr(v, "tolist") and not isinstance(v, list):
        v = v.tolist()
    if not isinstance(v, list) or not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in v):
        return None
    try:
        return np.asarray(v, dtype=np.float64)
    except (OverflowError, ValueError, TypeError):
        return None


def _steps_row(rec: Mapping[str, Any], steps: list[Any], ctx: RecordContext, opts: ReadOptions,
               source: str) -> TokenSequence:
    rec, f = _fields(rec, ctx, opts)
    ids, mask = steps_to_sequence(steps, ctx)
    starts = steps_turn_starts(steps, mask)
    meta = _metadata(rec, f.used)
    meta["n_steps"] = len(steps)
    side = {}
    lp = steps_log_probs(steps, len(ids), "completion_logprobs")
    if lp is not None:  # verifiers' TrajectoryStepTokens: the sampler's log-probs for `check`
        side["rollout_log_probs"] = lp
    return TokenSequence(f.trajectory_id, ids, mask, None, f.reward, f.success, f.group_id, f.checkpoint,
                         source, meta, side, turn_starts=starts)


def _iter_rows(file: Path, opts: ReadOptions, report: ReadReport | None,
               label: str, token_arrays: bool = True) -> Iterator[tuple[Any, RecordContext]]:
    if file.suffix.lower() == ".parquet":
        import pyarrow.parquet as pq

        batch = None if token_arrays else _TABLE_CHUNK  # the tables' reader: bounded batches of a big group
        try:  # batches: the column chunks read 1 MiB at a time (else each is read whole)
            pf = pq.ParquetFile(file, **({} if batch is None else {"buffer_size": 1 << 20, "pre_buffer": False}))
        except Exception as e:  # pyarrow raises many types for a corrupt file
            raise InputError(f"cannot read Parquet ({str(e).splitlines()[0] if str(e) else type(e).__name__})",
                             path=file, fix="pass a Parquet file of tokenized rows") from None
        whole = _whole_file_rows(pf, file, label) if token_arrays else None
        if whole is not None:  # one flat group for the file: the rows' arrays are views of one buffer
            for index, row in enumerate(whole):
                yield row, RecordContext(file, index, file_label=label)
            return
        index = 0
        for rg in range(pf.num_row_groups):
            for rows in _row_group_batches(pf, rg, file, index, opts, report, label, token_arrays, batch):
                for row in rows:
                    if row is not None:
                        yield row, RecordContext(file, index, file_label=label)
                    index += 1
        return
    if file.suffix.lower() in JSONL_SUFFIXES:
        yield from _jsonl_rows(file, opts, report, label, token_arrays)
        return
    yield from iter_json_records(file, is_tokenized_record, "tokenized", opts.lenient, report, label)


def _jsonl_rows(file: Path, opts: ReadOptions, report: ReadReport | None, label: str,
                token_arrays: bool) -> Iterator[tuple[Any, RecordContext]]:
    """The rows of a JSONL file: pieces of whole lines (:func:`_jsonl_pieces`; the whole file up to
    :data:`WHOLE_JSONL_BYTES` when ``token_arrays``, check's reader, else :data:`JSONL_PIECE_BYTES` at
    a time) parsed column-wise (:func:`_jsonl_columnar_rows`, row i is line i + 1) while each piece
    allows it; from the first piece that does not, the line-by-line reader reads the rest of the file
    (which names any bad line)."""
    index = 0
    try:
        pieces = _jsonl_pieces(file, WHOLE_JSONL_BYTES if token_arrays else JSONL_PIECE_BYTES)
        for piece in pieces:
            rows = _jsonl_columnar_rows(piece, file, index, label, token_arrays)
            del piece
            if rows is None:
                break
            for row in rows:
                yield row, RecordContext(file, index, line=index + 1, file_label=label)
                index += 1
        else:
            return
    except OSError:
        pass
    yield from iter_jsonl(file, opts.lenient, report, label, skip_lines=index)


#: a JSONL file is parsed column-wise in pieces of whole lines of about this many bytes when read into
#: tables (``analyze``: memory bounded by a piece, not the file), up to :data:`WHOLE_JSONL_BYTES`
#: at once for ``check`` (the rows' arrays then views of one buffer)
JSONL_PIECE_BYTES = 32 << 20


#: a JSONL file up to this many bytes is parsed column-wise in one go by ``check``'s reader
WHOLE_JSONL_BYTES = 1 << 30
#: a blank line (the row reader skips it, so row i would not be line i + 1), a lone CR (a line break
#: for the row reader), or a UTF-16 surrogate escape (the row reader names a lone one)
_JSONL_IRREGULAR = (re.compile(rb"[ \t\r]*(?:\n|\Z)"), re.compile(rb"\n[ \t\r]*(?:\n|\Z)"),
                    re.compile(rb"\r(?!\n)"), re.compile(rb"\\[uU][dD][89a-fA-F]"))


def _irregular_jsonl(data: bytes) -> bool:
    """``data`` has a line :data:`_JSONL_IRREGULAR` names (one pattern at a time, each led by a
    literal byte that the regex engine scans for quickly; the last two only when that byte occurs)."""
    first, blank, cr, surrogate = _JSONL_IRREGULAR
    return bool(first.match(data) or blank.search(data) or (b"\r" in data and cr.search(data))
                or (b"\\" in data and surrogate.search(data)))


def _plain_row(line: bytes) -> bool:
    """The JSON object on ``line`` has no null and no object among its fields outside the token lists
    (the column-wise JSONL reader could not give the row's fields exactly)."""
    import json

    try:
        rec = json.loads(line)
    except (ValueError, RecursionError):
        return False
    return isinstance(rec, dict) and all(v is not None and not isinstance(v, (dict, list))
                                         for k, v in rec.items() if k not in _TOKEN_FIELDS)


def _jsonl_pieces(file: Path, size: int) -> Iterator[bytes]:
    """The text of a JSONL file in pieces of whole lines of at least ``size`` bytes (a longer line
    whole), each without the line break (LF or CR LF) that ends it; the UTF-8 byte order mark and the
    blank lines at the end of the file dropped.

    Raises:
        OSError: the file cannot be read.
    """
    with file.open("rb") as fh:
        left = _content_end(fh)  # (the blank space at the end is never read: no copy of the last piece to cut it)

        def read(k: int) -> bytes:
            nonlocal left
            got = fh.read(min(k, left))
            left -= len(got)
            return got

        buf = read(max(size, 3))
        buf = buf[3:] if buf.startswith(b"\xef\xbb\xbf") else buf
        while True:
            more = read(size)
            if not more:
                buf = buf.rstrip(b" \t\r\n")  # blank lines at the end shift no row (after a BOM: the same object)
                if buf:
                    yield buf
                return
            cut = buf.rfind(b"\n")
            if cut < 0:  # one line longer than the piece so far
                buf += more
                continue
            piece, buf = buf[:cut - 1 if cut and buf[cut - 1] == 13 else cut], buf[cut + 1:] + more  # (CR LF)
            yield piece
            del piece


def _content_end(fh: Any, block: int = 1 << 16) -> int:
    """The bytes of the open binary file ``fh`` before the blank space (spaces, tabs, CR, LF) it ends
    with, read from its end; ``fh`` is left at its start.

    Raises:
        OSError: the file cannot be read or is not seekable."""
    end = fh.seek(0, 2)
    while end > 0:
        lo = max(0, end - block)
        fh.seek(lo)
        kept = len(fh.read(end - lo).rstrip(b" \t\r\n"))
        end = lo + kept
        if kept:
            break
    fh.seek(0)
    return end


def _jsonl_columnar_rows(data: bytes, file: Path, first: int, label: str, token_arrays: bool) -> list[Any] | None:
    """The rows of a piece of a JSONL file of sequence rows (:func:`_jsonl_pieces`; its first line is
    line ``first + 1``) parsed column-wise (polars' JSON reader, the schema inferred from every row of
    the piece, then :func:`_columnar_rows`); None, leaving the file from this piece on to the
    line-by-line reader (which names any bad line), when the piece has a blank line, a lone CR or a
    surrogate escape, does not parse, holds a per-row field that is not a plain string, number or
    boolean (nested objects), or a field that some line lacks or holds as null (polars reads both as
    null), so that each row's fields are exactly what ``json.loads`` gives."""
    import pyarrow as pa

    if not data or _irregular_jsonl(data):
        return None
    lines = data.count(b"\n") + 1
    if not _plain_row(data[:data.find(b"\n")] if lines > 1 else data):
        return None  # known from the first line: not worth parsing the piece twice
    try:
        table = _ndjson_table(data, lines)
    except (KeyboardInterrupt, SystemExit, MemoryError):
        raise
    except BaseException:  # noqa: BLE001 - polars' errors (and its PanicException): the row reader names them
        return None
    if table.num_rows != lines:
        return None
    for f in table.schema:
        t = f.type
        plain = pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t) \
            or pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t)
        if (f.name not in _TOKEN_FIELDS and not plain) or table.column(f.name).null_count:
            return None  # (a null: the key may be missing on that line, or null: not told apart here)
    if _coerced_to_text(table, data):
        return None  # a string column holds a true / 3 of some line, turned into text
    if any(c in table.column_names for c in _STEP_COLUMNS[:2]):
        return _batch_rows(table, lambda t, k: _array_rows(t))
    return _batch_rows(table, lambda t, k: _columnar_rows(t, file, first + k, label, token_arrays=token_arrays))


#: lines of a JSONL piece polars infers the schema from when :func:`_key_count` shows that no later line
#: holds another key (every line's schema is otherwise inferred: a second parse of the whole piece)
_INFER_LINES = 100


def _ndjson_table(data: bytes, lines: int) -> Any:
    """polars' Arrow table of the JSONL piece ``data`` (``lines`` lines, one object each). The schema
    comes from the first :data:`_INFER_LINES` lines when the keys of ``data`` (:func:`_key_count`)
    total the non-null entries of the table read that way. Every non-null entry is a top-level key of
    its line, so the key count is never lower, and equal only when no key was left out: a key that only
    later lines hold (dropped without a word by a 100-line schema, even where a line missing another
    key keeps lines x columns equal), a key inside a nested object or an explicit null makes it higher
    and takes the path below. Otherwise (or
    when a later line does not fit the first lines' types, as an integer column turning float) from
    every line, as before: a second parse of the piece, about as long as the read itself.

    Raises:
        polars' errors on text that is not JSON lines of objects."""
    import io

    if lines > _INFER_LINES:
        try:
            table = pl.read_ndjson(io.BytesIO(data), infer_schema_length=_INFER_LINES)
        except (KeyboardInterrupt, SystemExit, MemoryError):
            raise
        except BaseException:  # noqa: BLE001 - a later line's type differs: every line's schema decides
            table = None
        if table is not None and _key_count(data) == lines * table.width - int(table.null_count().sum_horizontal()[0]):
            return table.to_arrow()
    return pl.read_ndjson(io.BytesIO(data), infer_schema_length=None).to_arrow()


def _key_count(data: bytes, block: int = 1 << 24) -> int | None:
    """The object keys in the JSON text ``data``: its quotes directly followed by a colon (inside a
    JSON string a quote is escaped, so such a quote closes a key), found with numpy block by block;
    None when that count could miss a key or count one too many: a quote followed by blank space and
    then a colon (``"key" : 1``), or an escaped quote before a colon (``\\":`` inside a string, or a key
    ending in a backslash)."""
    arr = np.frombuffer(data, dtype=np.uint8)
    n, total = len(arr), 0
    for lo in range(0, n, block):
        q = np.flatnonzero(arr[lo:lo + block] == 34) + lo  # '"'
        nxt = arr[np.minimum(q + 1, n - 1)]
        nxt[q + 1 >= n] = 0
        colon = nxt == 58  # ':'
        if (colon & (arr[np.maximum(q - 1, 0)] == 92)).any():  # '\\' before the quote
            return None
        spaced = q[(nxt == 32) | (nxt == 9) | (nxt == 13)]
        for k in range(2, 10):  # the first byte after the blank space
            if not spaced.size:
                break
            at = arr[np.minimum(spaced + k, n - 1)]
            if ((at == 58) & (spaced + k < n)).any():
                return None
            spaced = spaced[((at == 32) | (at == 9) | (at == 13)) & (spaced + k < n)]
        if spaced.size:  # a longer run of blank space after a quote: not told apart here
            return None
        total += int(colon.sum())
    return total


#: a value polars' JSON reader may have turned into text: a boolean or number of a column that holds
#: strings on other lines (``"truncated": true`` beside ``"truncated": "maybe"`` reads as ``"true"``)
_LITERAL_TEXT = r"^(?:true|false|-?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?|-?inf|NaN)$"


def _coerced_to_text(table: Any, data: bytes) -> bool:
    """Some line of ``data`` (the JSONL bytes ``table`` was read from, one row per line) holds, in a
    column read as strings, a JSON boolean or number: polars' reader turned it into text. Such a file
    goes to the row reader, which gives each line's value as ``json.loads`` does (the field checks then
    name the line whose type is wrong). Only the lines whose text is spelled like a literal are looked
    at: the field's key is followed by a quote there, or the value was not a string."""
    import pyarrow as pa
    import pyarrow.compute as pc

    starts = None
    for f in table.schema:
        if f.name in _TOKEN_FIELDS or not (pa.types.is_string(f.type) or pa.types.is_large_string(f.type)
                                           or pa.types.is_string_view(f.type)):
            continue
        hits = pc.match_substring_regex(table.column(f.name), _LITERAL_TEXT)
        if not pc.any(hits).as_py():
            continue
        if starts is None:
            starts = np.concatenate([[0], np.flatnonzero(np.frombuffer(data, dtype=np.uint8) == 10) + 1,
                                     [len(data) + 1]])
        key = re.compile(re.escape(json.dumps(f.name, ensure_ascii=False).encode()) + rb"\s*:\s*(.)")
        # _np, not to_numpy (which imports pandas); no null here: a column with a null left above
        for i in np.flatnonzero(_np(_one_chunk(hits))):
            m = key.search(data, int(starts[i]), int(starts[i + 1]) - 1)
            if m is None or m.group(1) != b'"':
                return True
    return False


# --------------------------------------------------------------------------------------------- columnar rows

#: List columns the columnar path reads as integers / 0-1 masks / floats (every other column is a
#: per-row field, read as Python values).
_INT_COLUMNS = ("input_ids",)
_MASK_COLUMNS = ("response_mask", "attention_mask")
_STEP_COLUMNS = ("prompt_ids", "completion_ids", "trajectory")


class _PreparedRow(dict):
    """A sequence row whose per-row fields are the dict and whose token arrays were read column-wise
    (:class:`_FlatGroup` ``group``, row ``index`` in it)."""

    __slots__ = ("group", "index")


@dataclass
class _FlatGroup:
    """One row group's token columns, flattened once and checked over the whole group: row i is
    ``[starts[i], stops[i])`` of every array (its padding outside: the kept tokens of a left- or
    right-padded row are one run, read in place; otherwise the arrays hold the kept tokens only)."""

    starts: np.ndarray
    stops: np.ndarray
    ids: np.ndarray
    mask: np.ndarray
    values: np.ndarray | None
    side: dict[str, tuple[str, np.ndarray]]  # SIDE_ARRAYS name -> (field read, (N,) float64)
    nonfinite: dict[str, np.ndarray]  # name -> (N,) int8 nonfinite_codes
    rewards_on_padding: np.ndarray  # (B,) int64
    #: (field, (B,) float64 sum of the row's per-token rewards), the outcome of a row without a scalar
    #: reward (:data:`TOKEN_REWARD_KEYS`); None when no row needs it
    reward_sums: tuple[str, np.ndarray] | None = None


def _is_list(t: Any) -> bool:
    import pyarrow as pa

    return pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)


def _one_chunk(col: Any) -> Any:
    """The column as one array: its only chunk as it is (``combine_chunks`` would copy it), else the
    chunks concatenated."""
    import pyarrow as pa

    if isinstance(col, pa.ChunkedArray):
        return col.chunk(0) if col.num_chunks == 1 else col.combine_chunks()
    return col


def _np(arr: Any) -> np.ndarray:
    """The entries of a pyarrow boolean, integer or floating ``Array`` as numpy, read from its data
    buffer (integers and floats in place, read-only; booleans unpacked), without pyarrow's
    ``to_numpy``, which imports pandas (about 0.5 s and 40 MB in a process that needs none). A null
    entry holds whatever its slot holds: the caller masks it. Another type: ``to_numpy``."""
    import pyarrow as pa

    t, n, off = arr.type, len(arr), arr.offset
    if pa.types.is_boolean(t):
        data = arr.buffers()[1]
        if n == 0 or data is None:
            return np.zeros(n, dtype=bool)
        return np.unpackbits(np.frombuffer(data, dtype=np.uint8), count=off + n, bitorder="little")[off:].astype(bool)
    if not (pa.types.is_integer(t) or pa.types.is_floating(t)):
        return arr.to_numpy(zero_copy_only=False)
    kind = "f" if pa.types.is_floating(t) else "i" if pa.types.is_signed_integer(t) else "u"
    dt = np.dtype(f"{kind}{t.bit_width // 8}")
    data = arr.buffers()[1]
    if n == 0 or data is None:
        return np.zeros(n, dtype=dt)
    return np.frombuffer(data, dtype=dt, count=n, offset=off * dt.itemsize)


def _filled(arr: Any, fill: float) -> tuple[np.ndarray, np.ndarray | None]:
    """``(entries with nulls set to fill, (N,) bool nulls or None without any)`` of a pyarrow array
    (:func:`_np`)."""
    x = _np(arr)
    if not arr.null_count:
        return x, None
    nulls = _np(arr.is_null())
    return np.where(nulls, np.asarray(fill).astype(x.dtype), x), nulls


def _flat(col: Any) -> tuple[Any, np.ndarray] | None:
    """``(flattened child, (B,) lengths)`` of a list column without null lists; None otherwise."""
    import pyarrow as pa
    import pyarrow.compute as pc

    arr = _one_chunk(col)
    if not _is_list(arr.type) or arr.null_count:
        return None
    if pa.types.is_fixed_size_list(arr.type):
        arr = arr.cast(pa.list_(arr.type.value_type))
    lengths = _np(pc.list_value_length(arr)).astype(np.int64)
    return pc.list_flatten(arr), lengths


def _bad_rows(offsets: np.ndarray, bad: np.ndarray) -> np.ndarray:
    """(B,) bool: the rows (``offsets`` (B + 1,)) holding a True of the (N,) bool ``bad``."""
    out = np.zeros(len(offsets) - 1, dtype=bool)
    if bad.any():
        out[np.searchsorted(offsets, np.flatnonzero(bad), side="right") - 1] = True
    return out


def _flat_ints(col: Any, n: np.ndarray, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray] | None:
    """(N,) int64 entries of an integer / boolean list column whose rows have lengths ``n`` (a 0/1
    column, ``hi`` 1, in the file's own dtype: its caller reads it as bool), and the (N,) bool entries
    that are null or outside ``[lo, hi]`` (their rows go to the row-by-row path, which names them);
    None for a column of another type or other lengths."""
    import pyarrow as pa

    got = _flat(col)
    if got is None or not np.array_equal(got[1], n):
        return None
    child, _ = got
    if not (pa.types.is_integer(child.type) or pa.types.is_boolean(child.type)):
        return None
    if pa.types.is_boolean(child.type) and hi != 1:
        return None
    x, nulls = _filled(child, 0)
    if x.dtype == np.uint64:  # (beyond int64: out of range, not wrapped to a negative id)
        bad = x > hi
        x = np.where(bad, 0, x)
    elif x.size == 0 or (x.min() >= lo and x.max() <= hi):  # two reductions, no (N,) temporaries
        bad = np.zeros(len(x), dtype=bool)
    else:
        bad = (x < lo) | (x > hi)
    if hi > 1:
        x = x.astype(np.int64, copy=False)
    return x, bad if nulls is None else bad | nulls


def _flat_floats(col: Any, n: np.ndarray) -> tuple[np.ndarray, np.ndarray | None] | None:
    """(N,) floats (null and non-finite -> NaN; float32 / float64 as the file stores them, integers as
    float64: converting later gives the same numbers) and the (N,) :func:`nonfinite_codes` (None when
    every entry is finite or null), or None for a column that is not numbers of the row's length."""
    import pyarrow as pa

    got = _flat(col)
    if got is None or not np.array_equal(got[1], n):
        return None
    child, _ = got
    t = child.type
    if not (pa.types.is_floating(t) or pa.types.is_integer(t) or pa.types.is_null(t)):
        return None
    if pa.types.is_null(t):
        return np.full(len(child), np.nan), None
    x, nulls = _filled(child, 0)
    if x.dtype.kind != "f":
        x = x.astype(np.float64)
    elif x.dtype == np.float16:
        x = x.astype(np.float32)
    codes = None if np.isfinite(x).all() else nonfinite_codes(x, None if nulls is None else ~nulls)
    if nulls is not None:
        x = np.where(nulls, np.nan, x)
    if codes is not None:
        x = np.where(codes > 0, np.nan, x)
    return x, codes


def _numeric_list(col: Any, n: np.ndarray) -> bool:
    """``col`` is a list column of numbers (or nulls), no null list, row lengths ``n``."""
    import pyarrow as pa
    import pyarrow.compute as pc

    arr = _one_chunk(col)
    if not _is_list(arr.type) or arr.null_count:
        return False
    t = arr.type.value_type
    if not (pa.types.is_floating(t) or pa.types.is_integer(t) or pa.types.is_null(t)):
        return False
    return np.array_equal(_np(pc.list_value_length(arr)), n)


@dataclass
class _TokenColumns:
    """The token columns of one row group before padding is dropped: (N,) arrays, row i at
    ``[offsets[i], offsets[i + 1])``, and the (B,) rows whose entries the row-by-row path must name."""

    offsets: np.ndarray
    ids: np.ndarray
    mask: np.ndarray
    keep: np.ndarray | None
    values: np.ndarray | None
    bad: np.ndarray


def _token_columns(table: Any, n: np.ndarray) -> _TokenColumns | None:
    """Ids, masks and values of a group, checked with numpy over whole columns: an id outside
    ``[0, 2^31)``, a mask entry other than 0 / 1, a null, a non-finite value or a null value at a kept
    policy token marks its row in ``bad``; None for a column of another type or other lengths."""
    names = table.column_names
    offsets = np.concatenate([[0], np.cumsum(n)]).astype(np.int64)
    got_ids = _flat_ints(table.column("input_ids"), n, 0, 2**31 - 1)
    got_mask = _flat_ints(table.column("response_mask"), n, 0, 1)
    if got_ids is None or got_mask is None:
        return None
    bad = got_ids[1] | got_mask[1]
    keep = None
    if "attention_mask" in names:
        att = _flat_ints(table.column("attention_mask"), n, 0, 1)
        if att is None:
            return None
        keep, bad = att[0].astype(bool), bad | att[1]
    mask = got_mask[0].astype(bool)
    values = None
    if "values" in names:
        got = _flat_floats(table.column("values"), n)
        if got is None:
            return None
        values = got[0]
        # a NaN / inf value, or a null at a kept policy token: the row path names it (a sum that is
        # not NaN: no NaN entry, nothing to look for)
        if np.isnan(values.sum()):
            bad |= np.isnan(values) & (mask if keep is None else mask & keep)
        if got[1] is not None:
            bad |= got[1] > 0
        if float(np.finfo(values.dtype).max) > MAX_MAGNITUDE:  # (no float32 / float16 lies beyond it)
            with np.errstate(invalid="ignore"):
                big = np.abs(values) > MAX_MAGNITUDE  # out of range: the row path names it
            if big.any():
                bad |= big
    return _TokenColumns(offsets, got_ids[0], mask, keep, values, _bad_rows(offsets, bad))


def _row_sums(x: np.ndarray, codes: np.ndarray | None, offsets: np.ndarray) -> np.ndarray:
    """(B,) float64 sums of the (N,) ``x`` per row, nulls (NaN without a code) as 0 and entries with a
    :func:`nonfinite_codes` code as what they were (NaN, +-inf), so that such a sum is not finite.
    Only the entries that are not 0 are gathered and summed (per-token rewards are mostly 0; adding
    an exact 0 never changes a float sum, so the sums are those of every entry, in order)."""
    with np.errstate(invalid="ignore"):
        at = np.flatnonzero(x != 0)  # (NaN != 0: nulls and non-finite entries are gathered too)
    raw = x[at].astype(np.float64)
    raw[np.isnan(raw)] = 0.0
    if codes is not None:
        c = codes[at]
        raw[c == 1], raw[c == 2], raw[c == 3] = np.nan, np.inf, -np.inf
    rows = np.searchsorted(offsets, at, side="right") - 1
    return np.bincount(rows, weights=raw, minlength=len(offsets) - 1).astype(np.float64, copy=False)


def _needs_outcome(table: Any) -> bool:
    """Some row of the group has no scalar reward (:data:`REWARD_KEYS`): its per-token rewards are summed."""
    cols = [table.column(k) for k in REWARD_KEYS if k in table.column_names]
    return not cols or all(c.null_count for c in cols)


def _side_columns(table: Any, tc: _TokenColumns, n: np.ndarray, token_arrays: bool):
    """``(side, nonfinite, reward_sums, per-row rewards under a scalar's name)`` of a group
    (:class:`_FlatGroup`'s fields), or None for a column the row path must read."""
    names = table.column_names
    side: dict[str, tuple[str, np.ndarray | None]] = {}
    nonfinite: dict[str, np.ndarray] = {}
    sums, scalar_sums = None, None
    for name, keys in SIDE_ARRAYS.items():
        key = next((k for k in keys if k in names and _is_list(table.schema.field(k).type)), None)
        if key is None:
            continue
        outcome = name == "token_rewards" and (key in REWARD_KEYS or (key in TOKEN_REWARD_KEYS
                                                                       and _needs_outcome(table)))
        # per-token rewards, returns and advantages are always converted: a NaN / +-inf one sends its row
        # to the row path (refused there)
        finite = name in ("returns", "advantages") or (name == "token_rewards" and key in TOKEN_REWARD_KEYS)
        need = token_arrays or finite or name == "token_rewards"
        if not need:  # the tables hold none of it: its shape is checked, its numbers are not converted
            if not _numeric_list(table.column(key), n):
                return None
            side[name] = (key, None)
            continue
        got = _flat_floats(table.column(key), n)  # NaN / +-inf are kept and marked, as the row path does
        if got is None:
            return None
        side[name] = (key, got[0])
        if got[1] is not None:
            nonfinite[name] = got[1]
            if finite:
                tc.bad |= _bad_rows(tc.offsets, got[1] > 0)
        if outcome and key in REWARD_KEYS:  # a per-token list under a scalar's name: summed, as the row path does
            if _one_chunk(table.column(key)).flatten().null_count:
                return None  # a null in it: the row path refuses the row
            scalar_sums = (key, _row_sums(got[0], got[1], tc.offsets))
        elif outcome:
            sums = (key, _row_sums(got[0], got[1], tc.offsets))
    return side, nonfinite, sums, scalar_sums


def _kept_span(keep: np.ndarray, offsets: np.ndarray, n_kept: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """``(starts, stops)`` (B,) of each row's kept tokens (the (N,) bool ``keep``, ``attention_mask``;
    rows ``[offsets[i], offsets[i + 1])``, ``n_kept`` (B,) kept tokens each) when they form at most one
    run per row (left or right padding: the row is read in place, no copy of any column); None when
    some row's kept tokens are split."""
    run = keep.copy()  # the first kept token of each run: kept, and the row's first token or after a drop
    run[1:] &= ~keep[:-1]
    first = offsets[:-1][n_kept > 0]
    run[first] = keep[first]
    at = np.flatnonzero(run)
    row = np.searchsorted(offsets, at, side="right") - 1
    if len(at) != int((n_kept > 0).sum()) or (len(row) > 1 and (np.diff(row) == 0).any()):
        return None
    starts = offsets[:-1].copy()
    starts[row] = at
    return starts, starts + n_kept


def _kept(keep: np.ndarray, rows: int) -> Any:
    """``x -> x[keep]`` for the (N,) bool ``keep`` (``attention_mask``): when the kept tokens form at
    most two runs per row (left or right padding), the runs copied as slices (a memcpy each, several
    times faster than a boolean gather of every column), else the boolean gather."""
    edge = np.diff(keep.view(np.int8), prepend=np.int8(0), append=np.int8(0))
    starts = np.flatnonzero(edge == 1)
    if len(starts) > 2 * max(rows, 1):
        return lambda x: x[keep]
    stops = np.flatnonzero(edge == -1)
    return lambda x: np.concatenate([x[a:b] for a, b in zip(starts.tolist(), stops.tolist())]) if len(starts) \
        else x[:0].copy()


def _columnar_rows(table: Any, file: Path, first: int, label: str, *,
                   token_arrays: bool = True) -> list[Any] | None:
    """The sequence rows of one row group read column-wise: every list column flattened once, ids,
    masks, lengths, values and side arrays checked over the whole group with numpy. A row holding a
    bad entry (an id out of range, a mask entry not 0 / 1, a null, a non-finite value) is found by
    those masks and handed on as a plain dict, so the row-by-row path names it by row and field (or,
    lenient, skips it). None when the whole group needs that path (step rows, a null list, a length
    that differs, a non-numeric list). ``token_arrays=False`` (the canonical tables need none) checks
    the side arrays but keeps none."""
    names = table.column_names
    if "input_ids" not in names or "response_mask" not in names or any(c in names for c in _STEP_COLUMNS):
        return None
    table = _verl_layout_table(table)
    ids_col = _flat(table.column("input_ids"))
    if ids_col is None:
        return None
    n = ids_col[1]
    tc = _token_columns(table, n)
    got = None if tc is None else _side_columns(table, tc, n, token_arrays)
    if got is None:
        return None
    side, nonfinite, sums, scalar_sums = got
    for key in _TOKEN_FIELDS:  # any other token field must at least be a list column
        if key in names and key not in (*_INT_COLUMNS, *_MASK_COLUMNS, "values", *(k for k, _ in side.values())) \
                and not _is_list(table.schema.field(key).type):
            return None
    ids, mask, keep, values = tc.ids, tc.mask, tc.keep, tc.values
    pad = np.zeros(len(n), dtype=np.int64)
    bounds = tc.offsets[:-1], tc.offsets[1:]
    if keep is not None and not keep.all():
        drop = np.flatnonzero(~keep)  # padding: the row of each dropped token (no (N,) row index)
        drop_row = np.searchsorted(tc.offsets, drop, side="right") - 1
        if "token_rewards" in side:
            tr = side["token_rewards"][1]
            pad = np.bincount(drop_row, weights=(np.nan_to_num(tr[drop]) != 0), minlength=len(n)).astype(np.int64)
        n = n - np.bincount(drop_row, minlength=len(n)).astype(np.int64)
        span = _kept_span(keep, tc.offsets, n)
        if span is not None:  # one run per row: read in place, the padding left out by the bounds
            bounds = span
            nonfinite = {k: c for k, c in nonfinite.items() if ((c != 0) & keep).any()}
        else:
            take = _kept(keep, len(n))
            ids, mask = take(ids), take(mask)
            values = None if values is None else take(values)
            side = {k: (f, None if x is None else take(x)) for k, (f, x) in side.items()}
            nonfinite = {k: c for k, x in nonfinite.items() if (c := take(x)).any()}
            ends = np.cumsum(n)
            bounds = ends - n, ends
    lists = [k for k, _ in side.values() if k in REWARD_KEYS]
    try:
        rows = table.select([c for c in names if c not in _TOKEN_FIELDS and c not in lists]).to_pylist()
    except UnicodeDecodeError:
        return None
    if not token_arrays:  # only the field name of the per-token rewards goes on (into the metadata)
        side = {k: (f, None) for k, (f, _) in side.items() if k == "token_rewards"}
        nonfinite = {}
        with np.errstate(over="ignore"):  # an out-of-range row is bad: read again row by row, which names it
            values = None if values is None else values.astype(np.float32, copy=False)  # the tables' dtype
    group = _FlatGroup(*bounds, ids, mask, values, side, nonfinite, pad, sums)
    return _group_rows(table, rows, group, tc.bad, scalar_sums)


def _group_rows(table: Any, rows: list[dict], group: _FlatGroup, bad: np.ndarray,
                scalar_sums: tuple[str, np.ndarray] | None) -> list[Any]:
    """The :class:`_PreparedRow` of each row of ``group``; a ``bad`` row as its plain dict (read
    row by row, which names its bad entry)."""
    out: list[Any] = []
    for i, rec in enumerate(rows):
        if bad[i]:
            out.append(table.slice(i, 1).to_pylist()[0])
            continue
        row = _PreparedRow(rec)
        if scalar_sums is not None:
            row[scalar_sums[0]] = float(scalar_sums[1][i])
        row.group, row.index = group, i
        out.append(row)
    return out


class _ArrayRow(dict):
    """A step row whose token lists are numpy views of the column (:func:`_array_rows`)."""


def _array_rows(table: Any) -> list[dict] | None:
    """The rows of a table of step rows as dicts whose numeric token lists (``prompt_ids``,
    ``completion_ids``, ``completion_mask``, ``completion_logprobs``, ...) are 1-D numpy views of the
    column, flattened once (nulls in a float list as NaN; an integer list holding a null stays a Python
    list, for the row reader to name), the other fields Python values; None when a string column is
    not valid UTF-8 (the row reader finds the rows)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    names = table.column_names
    arrays = [c for c in names if c in _TOKEN_FIELDS and _is_list(table.schema.field(c).type)
              and (pa.types.is_integer(t := table.schema.field(c).type.value_type) or pa.types.is_floating(t)
                   or pa.types.is_boolean(t))]
    try:
        rows = [_ArrayRow(r) for r in table.select([c for c in names if c not in arrays]).to_pylist()]
    except UnicodeDecodeError:
        return None
    for c in arrays:
        arr = _one_chunk(table.column(c))
        if pa.types.is_fixed_size_list(arr.type):
            arr = arr.cast(pa.list_(arr.type.value_type))
        child = pc.list_flatten(arr)
        if child.null_count and not pa.types.is_floating(child.type):
            for r, v in zip(rows, arr.to_pylist()):
                r[c] = v
            continue
        x = _filled(child, np.nan)[0]
        valid = _np(arr.is_valid())
        lengths = np.where(valid, _np(pc.list_value_length(arr)), 0).astype(np.int64)
        offsets = np.concatenate([[0], np.cumsum(lengths)])
        for i, r in enumerate(rows):
            r[c] = x[offsets[i]:offsets[i + 1]] if valid[i] else None
    return rows


def _prepared_row(rec: _PreparedRow, ctx: RecordContext, opts: ReadOptions, source: str) -> TokenSequence:
    """A :class:`TokenSequence` from a row :func:`_columnar_rows` read (views into its arrays)."""
    g, i = rec.group, rec.index
    summed = None if g.reward_sums is None else (g.reward_sums[0], float(g.reward_sums[1][i]))
    _, f = _fields(rec, ctx, opts, summed)
    a, b = int(g.starts[i]), int(g.stops[i])
    meta = _metadata(rec, f.used)
    if g.rewards_on_padding[i]:
        meta["rewards_on_padding"] = int(g.rewards_on_padding[i])
    if "token_rewards" in g.side:
        meta["token_rewards_field"] = g.side["token_rewards"][0]
    side = {name: x[a:b] for name, (_, x) in g.side.items() if x is not None}
    bad = {name: m[a:b] for name, m in g.nonfinite.items() if m[a:b].any()}
    return TokenSequence(f.trajectory_id, g.ids[a:b], g.mask[a:b], None if g.values is None else g.values[a:b],
                         f.reward, f.success, f.group_id, f.checkpoint, source, meta, side, bad)


#: a file whose row groups hold at most this many bytes (uncompressed) is read column-wise in one go
WHOLE_FILE_BYTES = 1 << 30


def _whole_file_rows(pf: Any, file: Path, label: str) -> list[Any] | None:
    """Every row of a Parquet file read column-wise in one go, then row group by row group as
    :func:`_row_group_rows` reads them (each group's token columns flattened once); None for a file
    above :data:`WHOLE_FILE_BYTES`, or one with anything the column-wise path leaves to the row-by-row
    reader (which then reads it row group by row group). A file of plain columns
    (:func:`_plain_schema`) is read by polars, as one group when it has one: multi-threaded, and its
    buffers come from polars' allocator, with about a third of the page faults (system time) of
    pyarrow's memory pool on a 4M-token file (``check`` on 1,000 x 4,096 tokens: 0.98 s of CPU
    against 1.5 s, benchmarks/bench_layouts.py). Step rows come as :func:`_array_rows`."""
    md = pf.metadata
    plain = _plain_schema(pf.schema_arrow)
    if (pf.num_row_groups < 2 and not plain) or sum(md.row_group(i).total_byte_size
                                                     for i in range(pf.num_row_groups)) > WHOLE_FILE_BYTES:
        return None
    try:
        table = pl.read_parquet(file).to_arrow() if plain else pf.read()
    except (KeyboardInterrupt, SystemExit, MemoryError):
        raise
    except BaseException:  # noqa: BLE001 - a corrupt page (or polars' PanicException): the row-group reader names it
        return None
    if any(c in table.column_names for c in _STEP_COLUMNS[:2]):
        return _batch_rows(table, lambda t, k: _array_rows(t))  # a rollout's steps may span row groups
    return _batch_rows(table, lambda t, k: _columnar_rows(t, file, k, label))


def _batch_rows(table: Any, convert: Any) -> list[Any] | None:
    """``convert(chunk, k)`` (:func:`_columnar_rows`, :func:`_array_rows`) of a table chunk by chunk,
    ``k`` the rows before the chunk: each chunk of every column one group, as a row group is read (no
    copy of a table that polars hands over in several chunks, which ``combine_chunks`` would make in
    pyarrow's memory pool); None when a chunk needs the row path."""
    import pyarrow as pa

    rows: list[Any] = []
    for batch in table.to_batches():
        part = convert(pa.Table.from_batches([batch]), len(rows))
        if part is None:
            return None
        rows += part
    return rows


def _plain_schema(schema: Any) -> bool:
    """Every column is a string, number or boolean, or a list of numbers / booleans: polars reads it
    into the same Arrow values as pyarrow (a map, struct, date or decimal column may come back as
    another Python value, so such a file stays with pyarrow)."""
    import pyarrow as pa

    def scalar(t: Any) -> bool:
        return pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_integer(t) \
            or pa.types.is_floating(t) or pa.types.is_boolean(t)

    return all(scalar(f.type) or (_is_list(f.type) and not pa.types.is_string(f.type.value_type)
                                  and not pa.types.is_large_string(f.type.value_type) and scalar(f.type.value_type))
               for f in schema)


def _row_group_batches(pf: Any, rg: int, file: Path, first: int, opts: ReadOptions, report: ReadReport | None,
                       label: str, token_arrays: bool = True, batch: int | None = None) -> Iterator[list[Any]]:
    """The rows of row group ``rg`` (:func:`_row_group_rows`), the whole group at once, or ``batch``
    rows at a time when it holds more (``ParquetFile.iter_batches`` inside the group: the group's
    arrays are never all in memory). A corrupt data page loses the rest of the group (its rows named
    in the error; lenient: skipped and counted)."""
    n = pf.metadata.row_group(rg).num_rows
    if batch is None or n <= batch:
        yield _row_group_rows(pf, rg, file, first, opts, report, label, token_arrays)
        return
    import pyarrow as pa

    done, batches = 0, pf.iter_batches(batch_size=batch, row_groups=[rg], use_threads=False)
    while done < n:
        try:
            rb = next(batches)
        except StopIteration:
            return
        except Exception as e:  # noqa: BLE001 - pyarrow raises OSError, ArrowInvalid, ... for a corrupt page
            yield _unreadable_group(e, rg, file, first + done, n - done, opts, report, label)
            return
        yield _table_rows(pa.Table.from_batches([rb]), file, first + done, opts, report, label, token_arrays)
        done += rb.num_rows


def _unreadable_group(e: BaseException, rg: int, file: Path, first: int, n: int, opts: ReadOptions,
                      report: ReadReport | None, label: str) -> list[None]:
    """The ``n`` rows from ``first`` of row group ``rg`` that ``e`` made unreadable: an InputError
    naming them, or (lenient) ``n`` skipped rows."""
    err = error(RecordContext(file, first, file_label=label), "bad_parquet",
                f"cannot read Parquet row group {rg} (rows {first}-{first + n - 1}: "
                f"{(str(e).strip().splitlines() or [type(e).__name__])[0]})",
                "re-write the file, or pass --lenient to skip the unreadable row group")
    if not opts.lenient:
        raise err from None
    rep = report if report is not None else ReadReport()
    for _ in range(n):
        rep.skip(err)
    return [None] * n


def _row_group_rows(pf: Any, rg: int, file: Path, first: int, opts: ReadOptions,
                    report: ReadReport | None, label: str, token_arrays: bool = True) -> list[Any]:
    """The rows of row group ``rg`` (None for a row that cannot be decoded or read, skipped in lenient
    mode). A corrupt data page loses the whole row group; invalid UTF-8 only its rows."""
    try:
        table = pf.read_row_group(rg)
    except Exception as e:  # noqa: BLE001 - pyarrow raises OSError, ArrowInvalid, ... for a corrupt page
        return _unreadable_group(e, rg, file, first, pf.metadata.row_group(rg).num_rows, opts, report, label)
    return _table_rows(table, file, first, opts, report, label, token_arrays)


def _table_rows(table: Any, file: Path, first: int, opts: ReadOptions, report: ReadReport | None, label: str,
                token_arrays: bool = True) -> list[Any]:
    """The rows of ``table`` (rows ``first``... of the file): column-wise when the layout allows,
    else as dicts (a row whose strings are not UTF-8: None, skipped in lenient mode)."""
    rep = report if report is not None else ReadReport()
    fast = _columnar_rows(table, file, first, label, token_arrays=token_arrays)
    if fast is None and any(c in table.column_names for c in _STEP_COLUMNS[:2]):
        fast = _array_rows(table)
    if fast is not None:
        return fast
    try:
        return table.to_pylist()
    except UnicodeDecodeError:  # invalid UTF-8 in a string column: find the rows
        pass
    out: list[Any] = []
    for i in range(table.num_rows):
        try:
            out.append(table.slice(i, 1).to_pylist()[0])
        except UnicodeDecodeError as e:
            err = error(RecordContext(file, first + i, file_label=label), "bad_parquet",
                        f"invalid UTF-8 in a string column ({e.reason} at byte {e.start})",
                        "re-write the strings as UTF-8, or pass --lenient to skip the row")
            if not opts.lenient:
                raise err from None
            rep.skip(err)
            out.append(None)
    return out


def _group_steps(rows: Iterator[tuple[Any, RecordContext]], opts: ReadOptions) -> Iterator[tuple[Any, RecordContext, list | None]]:
    """Merge consecutive step rows of one rollout: yields ``(record, ctx, steps or None)``."""
    pend: tuple[Any, RecordContext, list, Any] | None = None
    for rec, ctx in rows:
        is_step = isinstance(rec, Mapping) and "prompt_ids" in rec and "completion_ids" in rec \
            and "input_ids" not in rec
        if is_step:
            key = opts.id_key or next((k for k in (*TOK_ID_KEYS, "example_id") if k in rec), None)
            rid = rec.get(key) if key else None
            if pend is not None and rid is not None and pend[3] == rid:
                pend[2].append(rec)
                pend = (rec, pend[1], pend[2], rid)  # the last step carries the reward
                continue
            if pend is not None:
                yield pend[0], pend[1], pend[2]
            pend = (rec, ctx, [rec], rid if rid is not None else object())
            continue
        if pend is not None:
            yield pend[0], pend[1], pend[2]
            pend = None
        if isinstance(rec, Mapping) and isinstance(rec.get("trajectory"), list) and "input_ids" not in rec:
            yield rec, ctx, rec["trajectory"]
        else:
            yield rec, ctx, None
    if pend is not None:
        yield pend[0], pend[1], pend[2]


def iter_sequences(spec: Any, options: ReadOptions, report: ReadReport, *,
                   token_arrays: bool = True) -> Iterator[TokenSequence]:
    """The tokenized rollouts of one file (``*.parquet`` row group by row group, JSON, JSONL).
    ``token_arrays=False``: Parquet rows read column-wise keep no :attr:`TokenSequence.token_arrays`
    (the canonical tables hold none of them)."""
    def convert(item: tuple[Any, list | None], ctx: RecordContext) -> TokenSequence:
        rec, steps = item
        if not isinstance(rec, Mapping):
            raise error(ctx, "not_an_object", f"row is {type_name(rec)} {short(rec)}, not an object",
                        'write rows as {"input_ids": [...], "response_mask": [...], "reward": ...}')
        # (a column-wise row's fields are Arrow scalars: valid UTF-8, one level deep; TokenSequence checks
        # them again as its metadata)
        bad = None if isinstance(rec, _PreparedRow) else json_problem(rec)
        if bad is not None:
            raise value_error(bad, path=ctx.path, record=ctx.label())
        report.rows_read["columnar" if isinstance(rec, (_PreparedRow, _ArrayRow)) else "row_by_row"] += 1
        if isinstance(rec, _PreparedRow):
            return _prepared_row(rec, ctx, options, spec.source)
        if steps is not None:
            return _steps_row(rec, steps, ctx, options, spec.source)
        if "input_ids" in rec or "response_mask" in rec:
            return _sequence_row(rec, ctx, options, spec.source)
        raise error(ctx, "no_tokens", f"row has neither input_ids + response_mask nor prompt_ids + "
                    f"completion_ids; keys {sorted(map(str, rec))[:10]}",
                    "write tokenized rows (see docs/input_formats.md), or pick another --format")

    grouped = _group_steps(_iter_rows(spec.path, options, report, spec.label, token_arrays), options)
    rows = (((rec, steps), ctx) for rec, ctx, steps in grouped)
    return convert_records(rows, convert, options.lenient, report)


def read_file(spec: Any, options: ReadOptions,
              report: ReadReport) -> tuple[pl.DataFrame, pl.DataFrame, dict[str, str]]:
    """The canonical ``(trajectories, tokens, {})`` tables of one tokenized file, built
    :data:`_TABLE_CHUNK` rows at a time (a chunk's arrays are freed before the next is read)."""
    parts = list(iter_table_chunks(spec, options, report))
    if not parts:
        return (*sequences_to_tables([]), {})
    if len(parts) == 1:
        return (*parts[0], {})
    return (pl.concat([t for t, _ in parts], how="vertical"), pl.concat([k for _, k in parts], how="vertical",
                                                                          rechunk=False), {})


#: rows per :func:`sequences_to_tables` call when a file is read into tables
_TABLE_CHUNK = 256


def iter_table_chunks(spec: Any, options: ReadOptions,
                      report: ReadReport) -> Iterator[tuple[pl.DataFrame, pl.DataFrame]]:
    """The canonical ``(trajectories, tokens)`` tables of one tokenized file, :data:`_TABLE_CHUNK` rows
    at a time, in file order (:func:`read_file` concatenates them; a streamed ``analyze`` reduces each
    before the next is read)."""
    import itertools

    seqs = iter_sequences(spec, options, report, token_arrays=False)
    while chunk := list(itertools.islice(seqs, _TABLE_CHUNK)):
        yield sequences_to_tables(chunk)
        del chunk


def iter_tokenized(path: str | Path, options: ReadOptions | None = None,
                   report: ReadReport | None = None) -> Iterator[TokenSequence]:
    """Yield the tokenized rollouts of a file or folder (``*.parquet``, ``*.json``, ``*.jsonl``)."""
    import dataclasses

    from critic_audit.io.detect import resolve_inputs

    opts = dataclasses.replace(options or ReadOptions(), format="tokenized")
    rep = report if report is not None else ReadReport()
    for res in resolve_inputs([path], opts, rep):
        for spec in res.files:
            if spec.format == "tokenized":
                yield from iter_sequences(spec, opts, rep)


def sequences_to_tables(seqs: list[TokenSequence]) -> tuple[pl.DataFrame, pl.DataFrame]:
    """The canonical ``(trajectories, tokens)`` tables of tokenized rollouts (turn k = k-th run of 1s).

    Columnar: the rows' arrays are concatenated once and the turn index, role and trajectory id of
    every token are computed over the whole batch (no per-token Python objects). The table is built
    in its canonical dtypes and satisfies the key and row rules of :func:`critic_audit.schema.validate`
    by construction (positions 0..T-1 per row, turns from the mask's runs), so only the trajectory ids
    are checked (a hash of B ids, not of N keys).

    Raises:
        SchemaError: two sequences share a trajectory id.
    """
    import json

    from critic_audit.errors import SchemaError

    b = len(seqs)
    if len({s.trajectory_id for s in seqs}) != b:
        seen: set[str] = set()
        dup = next(s.trajectory_id for s in seqs if s.trajectory_id in seen or seen.add(s.trajectory_id))
        raise SchemaError(f"tokens table: trajectory id {dup!r} appears in more than one sequence",
                          fix="give every rollout a unique id")
    n = np.asarray([len(s.token_ids) for s in seqs], dtype=np.int64)
    total = int(n.sum())
    if total >= 2**31:
        raise SchemaError(f"{total} tokens in one table chunk exceed the Int32 positions of the tokens table",
                          fix="split the input into smaller files")
    cat = (lambda xs, dt: np.concatenate(xs).astype(dt, copy=False) if xs else np.empty(0, dtype=dt))
    m = cat([s.response_mask for s in seqs], bool)
    starts_at = np.concatenate([[0], np.cumsum(n)[:-1]]).astype(np.int32) if b else np.zeros(0, np.int32)
    # turn k = the k-th run of 1s of its row: a run starts after a 0 or at the row's first token; rows
    # built from steps mark their turns' first tokens themselves (turn k = step k)
    starts = m.copy()
    starts[1:] &= ~m[:-1]
    starts[starts_at[n > 0]] = m[starts_at[n > 0]]
    for s, a in zip(seqs, starts_at):
        if s.turn_starts is not None:
            starts[a:a + len(s.token_ids)] = np.asarray(s.turn_starts, dtype=bool) & m[a:a + len(s.token_ids)]
    c = np.cumsum(starts, dtype=np.int32)
    before = np.concatenate([[0], c])[starts_at] if b else np.zeros(0, np.int32)  # runs before each row
    c -= np.repeat(before, n)
    c -= 1
    turn = pl.Series("turn", c, dtype=pl.Int32)
    del c
    offsets = np.concatenate([[0], np.cumsum(n)])
    n_turns = np.bincount(np.searchsorted(offsets, np.flatnonzero(starts), side="right") - 1, minlength=b)
    del starts
    pos = np.arange(total, dtype=np.int32)
    pos -= np.repeat(starts_at, n)
    vals = cat([s.values.astype(np.float32, copy=False) if s.values is not None
                else np.full(len(s.token_ids), np.nan, dtype=np.float32) for s in seqs], np.float32)
    ids = pl.Series("trajectory_id", [s.trajectory_id for s in seqs], dtype=pl.String)
    row = pl.Series(np.repeat(np.arange(b, dtype=np.uint32), n), dtype=pl.UInt32)
    tokens = pl.DataFrame({
        "trajectory_id": ids.gather(row) if b else ids.clear(),
        "position": pl.Series(pos, dtype=pl.Int32),
        "token_id": pl.Series(cat([s.token_ids.astype(np.int32, copy=False) for s in seqs], np.int32), dtype=pl.Int32),
        "response_mask": pl.Series(m, dtype=pl.Boolean),
        "turn": turn,
        "value": pl.Series(vals, dtype=pl.Float32).fill_nan(None),
    })
    del row, pos, vals
    tokens = tokens.with_columns(
        role=pl.when(pl.col("response_mask")).then(pl.lit("assistant")).otherwise(pl.lit(None, pl.String)),
        turn=pl.when(pl.col("response_mask")).then(pl.col("turn")).otherwise(None))
    trajs = pl.DataFrame({
        "trajectory_id": [s.trajectory_id for s in seqs],
        "group_id": [s.group_id for s in seqs],
        "checkpoint": [s.checkpoint for s in seqs],
        "source": [s.source for s in seqs],
        "reward": [s.reward for s in seqs],
        "success": [s.success for s in seqs],
        "num_turns": n_turns.tolist(),
        "metadata": [json.dumps(s.metadata, default=str, ensure_ascii=False) for s in seqs],
    }, schema=TRAJECTORY_SCHEMA)
    return trajs, tokens.select(list(TOKEN_SCHEMA))


def read_tokenized(path: str | Path, options: ReadOptions | None = None,
                   report: ReadReport | None = None) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Read tokenized rollouts into the canonical ``(trajectories, tokens)`` tables.

    Raises:
        InputError: a bad row (strict mode), or a file that cannot be read.
    """
    return sequences_to_tables(list(iter_tokenized(path, options, report)))
