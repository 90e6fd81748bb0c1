"""Rollouts as ``critic-audit check`` sees them: one :class:`CheckRollout` per trajectory, from every
format ``analyze`` reads (conversations, tokenized rows, canonical tables, verl dumps) and from a verl
batch.

Glossary: T tokens of one trajectory, K turns (turn k = the k-th maximal run of ``response_mask == 1``,
verl's convention, split further where the reader marks step boundaries: rows built from agent steps,
turn k = step k), G rollouts per group. Log-probabilities in nats.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from critic_audit.errors import InputError
from critic_audit.io.records import ReadOptions, ReadReport, number_array, short
from critic_audit.io.tokenized import nonfinite_codes
from critic_audit.schema import Conversation, loads

__all__ = ["CheckRollout", "load_rollouts", "rollouts_from_verl_batch", "turn_ids", "TURN_REWARD_KEYS",
           "TRUNCATION_KEYS", "TERMINATION_KEYS"]

#: Record fields holding a per-turn reward series (one number per assistant turn), first present wins.
TURN_REWARD_KEYS = ("turn_rewards", "step_rewards", "per_turn_rewards")
#: Record fields that mark a trajectory as truncated: booleans, or a finish / stop reason.
TRUNCATION_KEYS = ("truncated", "is_truncated", "finish_reason", "stop_reason", "termination_reason")
#: Finish / stop reasons that mean "cut at a length limit".
_LENGTH_REASONS = ("length", "max_tokens", "max_length", "truncated", "context_length", "exit_context")


def turn_ids(response_mask: np.ndarray, turn_starts: np.ndarray | None = None) -> np.ndarray:
    """(T,) int64 turn index k at policy tokens, -1 elsewhere. Without ``turn_starts``: the k-th run of
    1s of the (T,) bool ``response_mask`` (numpy twin of :func:`critic_audit.rl.turn_ids_from_mask`);
    with the (T,) bool ``turn_starts`` of a row built from steps
    (:attr:`critic_audit.io.tokenized.TokenSequence.turn_starts`), a policy token marked there also
    starts a turn, so that two completions with no prompt token between them are two turns."""
    m = np.asarray(response_mask, dtype=bool)
    starts = m & ~np.concatenate([[False], m[:-1]]) if m.size else m
    if turn_starts is not None and len(turn_starts) == len(m):
        starts = starts | (np.asarray(turn_starts, dtype=bool) & m)
    return np.where(m, np.cumsum(starts) - 1, -1).astype(np.int64)


@dataclasses.dataclass
class CheckRollout:
    """One trajectory with whatever its format carries (None: the format does not carry it).

    Attributes:
        trajectory_id: the id (as ``analyze`` reads it).
        group_id: the prompt / task id shared by the G rollouts of one prompt.
        reward: the outcome reward (from a scalar field of the record).
        token_ids: (T,) int64 ids, prompt and tool tokens included.
        response_mask: (T,) bool, True on tokens the policy generated.
        mask_from_template: the mask was derived here by rendering the messages with the chat template
            (so it cannot disagree with the template), not read from the data.
        token_rewards: (T,) float64, each reward at its own token position (0 / NaN: none).
        turn_rewards: (K',) float64 per-turn reward series from a field other than the outcome's.
        sampler_log_probs: (T,) float64 log-probs of the inference engine (verl ``rollout_log_probs``).
        trainer_log_probs: (T,) float64 log-probs of the training engine (verl ``old_log_probs``).
        returns: (T,) float64 per-token returns as the trainer computed them.
        values: (T,) float64 critic values (verl ``values``: V of the state before token t).
        advantages: (T,) float64 per-token advantages as the trainer computed them (verl ``advantages``).
        logged_turn_ids: (T,) float64 the turn id the data gives each token (verl / AReaL ``turn_ids``,
            ``turn_index``), as opposed to :attr:`turn_ids`, which is derived from the mask.
        nonfinite: field name (``sampler_log_probs``, ...) -> (T,) int8 code of entries that were NaN
            (1), +inf (2) or -inf (3) in the data (:data:`critic_audit.io.tokenized.NONFINITE_CODES`;
            they are NaN in the field itself, like a missing entry), 0 elsewhere; None: none seen.
        messages: the chat messages (when the record carries them beside the token ids, or is a
            conversation).
        truncated: the record says it was cut at a length limit (None: it says nothing).
        terminated: the record says the episode ended (``done`` / ``terminated`` / ``is_done`` true,
            SWE ``exit_status`` ``submitted``); False: it says the episode did not end; None: it says
            nothing.
        empty_turns: assistant turns with no content and no tool call (conversations only).
        rewards_on_padding: non-zero rewards the reader found at padding positions (dropped).
        turn_rewards_from_tokens: the turn series to hold against the outcome is the per-turn sums of
            ``token_rewards`` (``turn_rewards`` is then None).
        turn_starts: (T,) bool, True at the first policy token of each step for rows the reader built
            from agent steps (ATIF, NeMo Gym, verifiers steps: turn k = step k even when no prompt
            token separates two completions); None: turns are the runs of the mask alone. Not a
            logged turn id: the ``turn_ids`` check compares only ``logged_turn_ids`` with the turns.
        source: where it was read, for examples.
        collection: the data set / environment it belongs to (``analyze``'s ``source``: the file's
            collection, e.g. the NeMo Gym environment); groups are keyed by ``(collection, group_id)``,
            so two collections that both number their tasks 0, 1, ... are not pooled.
    """

    trajectory_id: str
    group_id: str | None = None
    reward: float | None = None
    token_ids: np.ndarray | None = None
    response_mask: np.ndarray | None = None
    mask_from_template: bool = False
    token_rewards: np.ndarray | None = None
    turn_rewards: np.ndarray | None = None
    sampler_log_probs: np.ndarray | None = None
    trainer_log_probs: np.ndarray | None = None
    returns: np.ndarray | None = None
    values: np.ndarray | None = None
    advantages: np.ndarray | None = None
    logged_turn_ids: np.ndarray | None = None
    nonfinite: dict[str, np.ndarray] | None = None
    messages: list[dict[str, Any]] | None = None
    truncated: bool | None = None
    terminated: bool | None = None
    empty_turns: list[int] | None = None
    rewards_on_padding: int = 0
    #: the per-turn series is the per-turn sums of ``token_rewards`` at policy tokens (the outcome came
    #: from another field); ``turn_rewards`` stays None and the check sums the turns itself
    turn_rewards_from_tokens: bool = False
    turn_starts: np.ndarray | None = None
    source: str = ""
    collection: str | None = None

    @property
    def turn_ids(self) -> np.ndarray | None:
        """(T,) int64 k at policy tokens, -1 elsewhere (mask runs, split at ``turn_starts``); None
        without a mask."""
        return None if self.response_mask is None else turn_ids(self.response_mask, self.turn_starts)

    @property
    def turn_lengths(self) -> np.ndarray | None:
        """(K,) int64 policy tokens per turn; None without a mask."""
        if self.response_mask is None:
            return None
        t = self.turn_ids
        return np.bincount(t[t >= 0], minlength=int(t.max()) + 1 if (t >= 0).any() else 0)

    @property
    def num_turns(self) -> int | None:
        """K from the mask, else the assistant messages; None when neither is known."""
        if self.response_mask is not None:
            return int(len(self.turn_lengths))
        if self.messages is not None:
            return sum(1 for m in self.messages if m.get("role") == "assistant")
        return None


# --------------------------------------------------------------------------------------------- fields


def _number_list(v: Any) -> np.ndarray | None:
    """(K',) float64 of a non-empty list of numbers (NaN / inf kept); None for anything else, an
    integer beyond the float64 range included (:func:`critic_audit.io.records.number_array`)."""
    arr = number_array(v, null=False, finite=False)
    return arr if arr is not None and arr.size else None


def _truncated(meta: Mapping[str, Any]) -> bool | None:
    found: bool | None = None
    for where in (meta, meta.get("info") if isinstance(meta.get("info"), Mapping) else {}):
        for key in (*TRUNCATION_KEYS, "exit_status"):
            v = where.get(key)
            if isinstance(v, bool):
                found = found or v
            elif isinstance(v, str) and key != "truncated":
                found = bool(found) or v.strip().lower() in _LENGTH_REASONS
    return found


#: Record fields that say whether the episode ended (booleans), first present wins.
TERMINATION_KEYS = ("terminated", "done", "is_done", "episode_done")


def _terminated(meta: Mapping[str, Any]) -> bool | None:
    """True / False from the first boolean of :data:`TERMINATION_KEYS` (in the record or its ``info``),
    True for an SWE ``exit_status`` that starts with ``submitted``; None when the record says nothing."""
    for where in (meta, meta.get("info") if isinstance(meta.get("info"), Mapping) else {}):
        for key in TERMINATION_KEYS:
            if isinstance(where.get(key), bool):
                return where[key]
    status = meta.get("exit_status", meta.get("info_exit_status"))
    if isinstance(status, str) and status.strip().lower().startswith("submitted"):
        return True
    return None


def _empty_turns(messages: Sequence[Mapping[str, Any]]) -> list[int]:
    out, k = [], 0
    for m in messages:
        if m.get("role") != "assistant":
            continue
        content = m.get("content")
        text = content if isinstance(content, str) else "".join(
            p.get("text", "") if isinstance(p, Mapping) else str(p) for p in content or [])
        if not text.strip() and not m.get("tool_calls"):
            out.append(k)
        k += 1
    return out


def _metadata_messages(msgs: list[Any]) -> list[dict[str, Any]] | None:
    """The chat messages a tokenized row or table carries in its metadata, normalized as a chat reader
    normalizes them (:func:`critic_audit.io.messages.message`); None when one of them is not a chat
    message (the checks that need messages then skip the rollout)."""
    from critic_audit.io.messages import message
    from critic_audit.io.records import RecordContext

    ctx = RecordContext(Path("metadata"), 0)
    try:
        return [message(m, i, ctx) for i, m in enumerate(msgs)]
    except InputError:
        return None


#: Record fields that must be booleans when present (null: not known).
_FLAG_KEYS = ("truncated", "is_truncated", "terminated")


def _typed_fields(r: CheckRollout, meta: Mapping[str, Any], record: str | None = None) -> None:
    """``record``: the record's index and line, when known (else its trajectory id names it).

    Raises:
        InputError: ``bad_field``: a per-turn reward series (:data:`TURN_REWARD_KEYS`, the first present)
            that is not a list of finite numbers, or a ``truncated`` / ``is_truncated`` / ``terminated``
            flag that is not a boolean (the check would otherwise skip or read it silently).
    """
    key = next((k for k in TURN_REWARD_KEYS if meta.get(k) is not None), None)
    problem = None
    v = None if key is None else meta[key]
    if key is not None and (not isinstance(v, list) or (v and number_array(v, null=False, finite=False) is None)):
        problem = (key, f"{key} is {short(meta[key], 40)}, not a list of numbers (one per assistant turn)",
                   f"write {key} as a list of numbers, or drop the field")
    for where in (meta, meta.get("info") if isinstance(meta.get("info"), Mapping) else {}):
        for k in _FLAG_KEYS:
            if problem is None and where.get(k) is not None and not isinstance(where[k], bool):
                problem = (k, f"{k} is {short(where[k], 40)}, not true / false",
                           f"write {k} as true or false, or drop it")
    if problem is not None:
        err = InputError(f"trajectory {r.trajectory_id!r}: {problem[1]}", record=record or r.trajectory_id,
                         fix=problem[2])
        err.reason = "bad_field"  # type: ignore[attr-defined]
        raise err


def _from_meta(r: CheckRollout, meta: Mapping[str, Any], record: str | None = None) -> CheckRollout:
    _typed_fields(r, meta, record)
    for key in TURN_REWARD_KEYS:
        series = _number_list(meta.get(key))
        if series is not None:
            r.turn_rewards = series
            break
    r.truncated = _truncated(meta)
    r.terminated = _terminated(meta)
    msgs = meta.get("messages")
    if r.messages is None and isinstance(msgs, list) and msgs:
        r.messages = _metadata_messages(msgs)
    if r.messages is not None:
        r.empty_turns = _empty_turns(r.messages)
    return r


def _nan_to_none(x: float | None) -> float | None:
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else float(x)


# --------------------------------------------------------------------------------------------- readers


def _from_conversations(convs: list[Conversation], tokenizer: Any, tokenize_config: Any,
                        ropts: ReadOptions | None = None, rep: ReadReport | None = None) -> list[CheckRollout]:
    """Raises:
        InputError: a record field of the wrong type (:func:`_typed_fields`), naming the record;
            ``ropts.lenient``: the conversation skipped and counted in ``rep`` instead.
    """
    out, kept = [], []
    for c in convs:
        r = CheckRollout(c.trajectory_id, group_id=c.group_id, reward=c.reward, messages=list(c.messages),
                         source=c.record or c.trajectory_id, collection=c.source)
        try:
            out.append(_from_meta(r, c.metadata))
        except InputError as e:
            if ropts is None or not ropts.lenient or rep is None:
                raise InputError(f"{c.record or c.source}: {e.problem}", fix=e.fix) from None
            rep.skip(e)
            continue
        kept.append(c)
    convs = kept
    if tokenizer is not None and convs:
        from critic_audit.turns import tokenize_conversations

        res = tokenize_conversations(convs, tokenizer, tokenize_config)
        by_id = {tc.trajectory_id: tc for tc in res.conversations}
        for r in out:
            tc = by_id.get(r.trajectory_id)
            if tc is not None:
                r.token_ids, r.response_mask = tc.input_ids.astype(np.int64), tc.response_mask.astype(bool)
                r.mask_from_template = True
                if tc.truncated:
                    r.truncated = True
    return out


#: :attr:`critic_audit.io.tokenized.TokenSequence.token_arrays` names -> :class:`CheckRollout` fields
_SEQ_NAMES = {"token_rewards": "token_rewards", "old_log_probs": "trainer_log_probs",
              "rollout_log_probs": "sampler_log_probs", "returns": "returns", "advantages": "advantages",
              "turn_ids": "logged_turn_ids"}
#: verl dump side-file columns -> :class:`CheckRollout` fields
_SIDE_NAMES = {"token_reward": "token_rewards", "rollout_log_prob": "sampler_log_probs",
               "old_log_prob": "trainer_log_probs", "return": "returns", "advantage": "advantages",
               "turn_id": "logged_turn_ids"}


def _from_sequence(seq: Any) -> CheckRollout:
    """Raises:
        InputError: a per-token field the row holds does not fit its ``input_ids`` (the reader left it
            out and named it in ``side_array_problems``): the check would otherwise skip it silently.
    """
    arrays = seq.token_arrays
    meta = seq.metadata
    problems = meta.get("side_array_problems")
    bad = [(f, w) for f, w in problems.items() if "input_ids" in str(w)] if isinstance(problems, Mapping) else []
    if bad:  # contradictory lengths: one line naming the row and the field
        from critic_audit.errors import InputError

        field, what = bad[0]
        where = getattr(seq, "record", None) or seq.trajectory_id  # the row's index and line, when known
        raise InputError(f"trajectory {seq.trajectory_id!r}: {field} is {what}", record=where,
                         fix=f"give {field} one number per input_ids token, or drop the field")
    r = CheckRollout(seq.trajectory_id, group_id=seq.group_id, reward=seq.reward,
                     token_ids=np.asarray(seq.token_ids, dtype=np.int64),
                     response_mask=np.asarray(seq.response_mask, dtype=bool),
                     token_rewards=arrays.get("token_rewards"), sampler_log_probs=arrays.get("rollout_log_probs"),
                     trainer_log_probs=arrays.get("old_log_probs"), returns=arrays.get("returns"),
                     values=seq.values, advantages=arrays.get("advantages"),
                     logged_turn_ids=arrays.get("turn_ids"),
                     nonfinite={_SEQ_NAMES.get(k, k): v for k, v in seq.nonfinite.items()} or None,
                     rewards_on_padding=int(meta.get("rewards_on_padding", 0) or 0), source=seq.trajectory_id,
                     collection=seq.source,
                     turn_starts=None if getattr(seq, "turn_starts", None) is None
                     else np.asarray(seq.turn_starts, dtype=bool))
    _from_meta(r, meta, getattr(seq, "record", None))
    if r.turn_rewards is None and r.token_rewards is not None and r.reward is not None \
            and meta.get("token_rewards_field") in ("token_level_rewards", "token_level_scores") \
            and "reward_summed_from" not in meta:
        # the outcome comes from another field than the per-token rewards (not their sum): their per-turn sums are a
        # series to hold against it (a reward on a masked token belongs to no turn and is left out);
        # summed over the whole batch by the check (Columns.turn_sum)
        r.turn_rewards_from_tokens = True
    return r


#: side columns that must be finite where given (null: no entry), as tokenized rows' per-token rewards,
#: returns and advantages (:data:`critic_audit.io.tokenized.FINITE_KEYS`): a NaN one would read as 0
_FINITE_SIDE = ("token_reward", "return", "advantage")


def _nonfinite_side(tid: str, bad: Mapping[str, np.ndarray], part: Any) -> InputError | None:
    """``bad_values``: the first :data:`_FINITE_SIDE` column of the trajectory ``part`` holding a NaN /
    +-inf entry (``bad``: field -> its :func:`nonfinite_codes`), naming the column and the position."""
    from critic_audit.io.tokenized import NONFINITE_CODES

    c = next((c for c in _FINITE_SIDE if _SIDE_NAMES[c] in bad), None)
    if c is None:
        return None
    codes = bad[_SIDE_NAMES[c]]
    j = int(np.flatnonzero(codes)[0])
    k = int(np.count_nonzero(codes))
    err = InputError(f"trajectory {tid!r}: {c} at position {int(part['position'][j])} = {NONFINITE_CODES[int(codes[j])]} "
                     f"is not a finite number ({k} such entr{'y' if k == 1 else 'ies'})", record=tid,
                     fix=f"write {c} as finite numbers (null where there is none), or drop the trajectory")
    err.reason = "bad_values"  # type: ignore[attr-defined]
    return err


def _from_tables(trajs: Any, tokens: Any, side: Any, path: Path | None = None, ropts: ReadOptions | None = None,
                 rep: ReadReport | None = None) -> list[CheckRollout]:
    """Raises:
        InputError: a trajectory whose return / advantage / per-token reward is NaN or +-inf
            (:func:`_nonfinite_side`), or a record field of the wrong type (:func:`_typed_fields`),
            naming ``path`` and the trajectory; ``ropts.lenient``: skipped and counted in ``rep`` instead.
    """
    import polars as pl

    from critic_audit.io.verl_dump import SIDE_KEY, side_schema
    from critic_audit.schema import cast_columns

    if side is not None:
        tokens = tokens.join(side.select([c for c in side.columns if c not in tokens.columns or c in SIDE_KEY]),
                             on=list(SIDE_KEY), how="left")
    tokens = cast_columns(tokens, side_schema(), "tokens")
    tokens = tokens.sort(["trajectory_id", "position"])
    info = {row["trajectory_id"]: row for row in trajs.iter_rows(named=True)}
    out = []
    for part in tokens.partition_by("trajectory_id", maintain_order=True):
        tid = part["trajectory_id"][0]
        row = info.get(tid, {})
        try:
            meta = loads(row.get("metadata") or "{}")
        except (TypeError, ValueError):  # not JSON, or nested past the bound
            meta = {}
        bad = {f: m for c, f in _SIDE_NAMES.items() if c in part.columns
               and (m := nonfinite_codes(part[c].cast(pl.Float64).fill_null(0.0).to_numpy(),
                                         part[c].is_not_null().to_numpy())) is not None}
        err = _nonfinite_side(tid, bad, part)
        if err is None:
            r = _table_rollout(tid, row, part, bad)
            try:
                out.append(_from_meta(r, meta if isinstance(meta, Mapping) else {}))
            except InputError as e:
                err = e
        if err is not None:
            named = InputError(err.problem, path=path, record=err.record, fix=err.fix)
            named.reason = getattr(err, "reason", "bad_record")  # type: ignore[attr-defined]
            if ropts is None or not ropts.lenient or rep is None:
                raise named from None
            rep.skip(named)
    return out


def _table_rollout(tid: str, row: Mapping[str, Any], part: Any, bad: dict[str, np.ndarray]) -> CheckRollout:
    """The :class:`CheckRollout` of one trajectory's token rows ``part`` (its trajectories row ``row``)."""
    col = (lambda c: part[c].fill_null(np.nan).to_numpy() if c in part.columns else None)
    return CheckRollout(tid, group_id=row.get("group_id"), reward=_nan_to_none(row.get("reward")),
                        token_ids=part["token_id"].fill_null(-1).to_numpy().astype(np.int64)
                        if part["token_id"].null_count() < part.height else None,
                        response_mask=part["response_mask"].fill_null(False).to_numpy().astype(bool),
                        token_rewards=col("token_reward"), sampler_log_probs=col("rollout_log_prob"),
                        trainer_log_probs=col("old_log_prob"), returns=col("return"),
                        values=col("value") if "value" in part.columns and part["value"].null_count() < part.height
                        else None, advantages=col("advantage"), logged_turn_ids=col("turn_id"),
                        nonfinite=bad or None, source=tid, collection=row.get("source"),
                        turn_starts=_table_turn_starts(part))


def _table_turn_starts(part: Any) -> np.ndarray | None:
    """(T,) bool: policy tokens whose canonical ``turn`` differs from the policy token just before
    them (a turn boundary the table gives inside a run of the mask, e.g. from agent steps); None when
    the table gives none."""
    if "turn" not in part.columns or part.height < 2:
        return None
    t = part["turn"].fill_null(-1).to_numpy().astype(np.int64)
    m = part["response_mask"].fill_null(False).to_numpy().astype(bool)
    starts = np.zeros(len(t), dtype=bool)
    starts[1:] = m[1:] & m[:-1] & (t[1:] != t[:-1])
    return starts if starts.any() else None


def load_rollouts(
    paths: Sequence[str | Path],
    *,
    read_options: ReadOptions | None = None,
    tokenizer: Any = None,
    tokenize_config: Any = None,
    report: ReadReport | None = None,
) -> list[CheckRollout]:
    """Read rollouts of every format ``analyze`` reads into :class:`CheckRollout` records.

    The inputs are resolved and their conversations read once, exactly as ``analyze`` reads them
    (:func:`critic_audit.io.inputs.read_all`: format per file, folders searched recursively, stray files
    skipped and counted, a trajectory id found in several files qualified as ``{file label}/{id}``).
    Conversations (chat, responses, react, swe, ATIF without token ids) keep their messages; with
    ``tokenizer`` they are also rendered
    with its chat template (:mod:`critic_audit.turns`) to get token ids, mask and turn lengths.
    Tokenized rows keep their per-token rewards and log-probs
    (:attr:`critic_audit.io.tokenized.TokenSequence.token_arrays`); canonical tables and verl dump
    folders are joined with the dump's side files when present.

    Raises:
        InputError: a file cannot be read, a bad record (strict mode), or ids repeat across inputs.
        TemplateError: the tokenizer's chat template cannot render the conversations.
    """
    from critic_audit.io.detect import kept_after_id_policy
    from critic_audit.io.inputs import read_all, token_files
    from critic_audit.turns import TokenizeConfig

    ropts = read_options or ReadOptions(require_reward=False)
    rep = report if report is not None else ReadReport()
    # conversations read as analyze reads them (ids qualified across every input); table files below,
    # with their per-token arrays (rewards, log-probs) that the canonical tables do not keep
    read = read_all([Path(p) for p in paths], ropts, report=rep, tables=False, qualify=False)
    table_rollouts: list[CheckRollout] = []
    table_specs: list[Any] = []
    for tf in token_files(read.resolved, ropts, rep):
        if tf.sequences is not None:
            got = _checked_sequences(tf.sequences, tf.path, ropts, rep)
        else:
            got = _from_tables(tf.trajectories, tf.tokens, tf.side, tf.path, ropts, rep)
        table_rollouts += got
        table_specs += [tf.spec] * len(got)
    convs = read.conversations or []
    # one id policy with analyze (io.detect.apply_id_policy): ids / groups found in several files qualified
    # --lenient: a rollout repeated in another file (same id and content) is checked once
    kept = {id(x) for x in kept_after_id_policy([*convs, *table_rollouts], [*read.conversation_files, *table_specs],
                                                rep, lenient=ropts.lenient)}
    convs = [c for c in convs if id(c) in kept]
    table_rollouts = [r for r in table_rollouts if id(r) in kept]
    out: list[CheckRollout] = []
    if convs:
        out += _from_conversations(convs, tokenizer, tokenize_config or TokenizeConfig(), ropts, rep)
    out += table_rollouts
    seen: set[str] = set()
    for r in out:
        if r.trajectory_id in seen:
            raise InputError(f"trajectory id {r.trajectory_id!r} appears in more than one input",
                             fix="give every rollout a unique id (or check the inputs one at a time)")
        seen.add(r.trajectory_id)
    rep.records_read = len(out)
    return out


def _checked_sequences(seqs: Any, path: Path, ropts: ReadOptions, rep: ReadReport) -> list[CheckRollout]:
    """:func:`_from_sequence` of each sequence of the file ``path``; a row whose per-token field does not
    fit is an error naming the file (strict), or skipped and counted as ``bad_side_array`` (lenient)."""
    out = []
    for seq in seqs:
        try:
            out.append(_from_sequence(seq))
        except InputError as e:
            err = InputError(e.problem, path=path, record=e.record, fix=e.fix)
            err.reason = getattr(e, "reason", "bad_side_array")  # type: ignore[attr-defined]
            if not ropts.lenient:
                raise err from None
            rep.skip(err)
    return out


def rollouts_from_verl_batch(batch: Any) -> list[CheckRollout]:
    """:class:`CheckRollout` records of one verl batch (``DataProto`` or a dict of tensors, the fields
    :func:`critic_audit.io.verl_dump.dump_verl_batch` reads, plus ``old_log_probs``,
    ``rollout_log_probs``, ``returns``, ``values``, ``advantages`` and ``turn_ids`` when present). Rows are ``row{i}``; ``uid`` is the group.

    Raises:
        ValueError: a missing field or inconsistent shapes (a programming error in the caller).
    """
    from critic_audit.io.verl_dump import SIDE_COLUMNS, as_numpy, batch_fields

    f = batch_fields(batch)
    if "responses" not in f or "response_mask" not in f and "attention_mask" not in f:
        raise ValueError("a verl batch needs 'responses' and 'response_mask' (or 'attention_mask')")
    resp = as_numpy(f["responses"]).astype(np.int64)
    b, r_len = resp.shape
    att = as_numpy(f["attention_mask"]).astype(bool)[:, -r_len:] if "attention_mask" in f else np.ones((b, r_len), bool)
    mask = as_numpy(f["response_mask"]).astype(bool) if "response_mask" in f else att
    arrays = {}
    for col, keys in SIDE_COLUMNS.items():
        key = next((k for k in keys if f.get(k) is not None), None)
        if key is not None:
            arrays[col] = as_numpy(f[key]).astype(np.float64).reshape(b, r_len)
    if f.get("values") is not None:
        arrays["value"] = as_numpy(f["values"]).astype(np.float64).reshape(b, r_len)
    bad = {c: codes for c in ("old_log_prob", "rollout_log_prob") if c in arrays
           and (codes := nonfinite_codes(arrays[c].reshape(-1))) is not None}
    bad = {c: codes.reshape(b, r_len) for c, codes in bad.items()}
    uid = f.get("uid")
    uids = None if uid is None else [str(u) for u in list(as_numpy(uid).reshape(-1))]
    out = []
    for i in range(b):
        keep = att[i]
        get = (lambda c: arrays[c][i][keep] if c in arrays else None)
        tr = get("token_reward")
        nonfinite = {_SIDE_NAMES[c]: m[i][keep] for c, m in bad.items() if m[i][keep].any()}
        for c, m in bad.items():  # NaN in the field itself, as a missing entry
            arrays[c][i][m[i] > 0] = np.nan
        out.append(CheckRollout(
            f"row{i}", group_id=uids[i] if uids else None,
            reward=None if tr is None else float(np.nansum(tr)), token_ids=resp[i][keep],
            response_mask=mask[i][keep], token_rewards=tr, sampler_log_probs=get("rollout_log_prob"),
            trainer_log_probs=get("old_log_prob"), returns=get("return"), values=get("value"),
            advantages=get("advantage"), logged_turn_ids=get("turn_id"), nonfinite=nonfinite or None,
            rewards_on_padding=0 if "token_reward" not in arrays else
            int(np.count_nonzero(np.nan_to_num(arrays["token_reward"][i][~keep]))), source=f"row {i}"))
    return out
