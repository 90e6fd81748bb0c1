"""How a rollout ends: the truncation flag against the stop token and the length caps, a rollout that
ends on an observation or on a tool call nobody answered, and merged multi-turn rows cut at the
response cap (see ``docs/check.md``).

Glossary: B rows, turn k = the k-th run of ``response_mask == 1`` (:mod:`critic_audit.check.columns`).
The **response** of a row runs from its first policy token to its end (verl's ``responses``); its
**trailing context** is the mask-0 tokens after its last policy token. The **stop token** ends a
policy turn that finished on its own: the chat template's end-of-turn token and the tokenizer's EOS
(``--tokenizer``), or, without one, inferred from the data as the token that ends most policy turns
(more than :data:`STOP_SHARE` of them: exactly half is not most; the report says it was inferred).
Every per-row figure is taken over the whole batch at once from the flat columns; only the examples are built one by one.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from critic_audit.check.kit import (
    FAIL, PASS, WARN, CheckContext, CheckOutcome, CheckRollout, CheckSpec, Example, fmt, share,
)

__all__ = ["Endings", "endings", "check_truncation_flag", "check_ends_on_observation", "check_unanswered_tool_call",
           "check_response_cap_cut", "STOP_SHARE", "GLUE_TOKENS", "TERMINAL_TOOLS", "OBSERVATION_ROLES"]

#: the inferred stop token must end at least this share of the policy turns
STOP_SHARE = 0.5
#: trailing mask-0 tokens allowed after the last policy token without a tokenizer (a template's
#: separator and an EOS after the end-of-turn token); with ``--tokenizer``: the template's separator
GLUE_TOKENS = 2
#: tool names whose call ends the episode (no reply is due): OpenHands ``finish``, SWE-agent ``submit``,
#: tau-bench ``transfer_to_human_agents``, ...; a name containing one of the first four words also counts
TERMINAL_TOOLS = ("finish", "submit", "terminate", "transfer_to_human", "stop", "done", "end", "exit", "final_answer",
                  "answer", "task_complete", "complete_task", "give_up")
#: message roles that are observations (what the environment, a tool or the user shows the policy)
OBSERVATION_ROLES = ("tool", "user", "environment", "ipython", "function", "observation", "system")
#: substrings of a decoded policy turn that mark a tool call (Qwen / Hermes, Llama 3, Mistral, DeepSeek)
_CALL_MARKS = ("<tool_call>", "<|python_tag|>", "[TOOL_CALLS]", "tool\u2581call\u2581begin", "<function=")
_NAME = re.compile(r'"name"\s*:\s*"([^"]+)"')


@dataclasses.dataclass
class Endings:
    """Per-row facts about how each row ends, over the B rows of the run (computed once).

    Attributes:
        own: (B,) bool, the row carries token ids and its own ``response_mask`` (not one the chat
            template made) with at least one policy token: the rows these checks read.
        last_turn: (B,) int64 flat index of the row's last turn (``Columns.turn_*``), -1 for none.
        last_pos: (B,) int64 position t of the last policy token, -1 for none.
        last_len: (B,) int64 tokens of the last turn.
        trailing: (B,) int64 mask-0 tokens after the last policy token.
        response: (B,) int64 tokens from the first policy token to the row's end.
        last_id: (B,) int64 id of the last policy token (-1 for none).
        ends_stop: (B,) bool, that token is a stop token (False when none is known).
        stop: the stop token ids (empty: none known).
        stop_said: where the stop token comes from, or why none is known.
        glue: trailing tokens allowed after the last policy token.
        padding: (B,) bool, the trailing tokens beyond ``glue`` are one id repeated at least twice, or
            the tokenizer's pad token (padding the reader did not strip: no ``attention_mask``), not an
            observation.
    """

    own: np.ndarray
    last_turn: np.ndarray
    last_pos: np.ndarray
    last_len: np.ndarray
    trailing: np.ndarray
    response: np.ndarray
    last_id: np.ndarray
    ends_stop: np.ndarray
    stop: frozenset[int]
    stop_said: str
    glue: int
    padding: np.ndarray

    def cap(self, config_cap: int | None) -> tuple[int | None, str]:
        """The response cap: ``config_cap`` when given, else the longest response of the own rows when
        at least two rows reach it exactly (one row is always at its own maximum); (None, why) else."""
        if config_cap is not None:
            return config_cap, f"--max-response-tokens {config_cap}"
        lengths = self.response[self.own]
        if lengths.size < 2:
            return None, "fewer than two rows with token ids and a mask"
        top = int(lengths.max())
        at = int((lengths == top).sum())
        if at < 2:
            return None, f"only one row reaches the longest response ({top} tokens): no common cap to infer"
        if at == lengths.size:
            return None, (f"every one of the {at} rows has {top} response tokens: a fixed width, no evidence of a cap "
                          "(pass --max-response-tokens N)")
        return top, f"inferred: {at} of {lengths.size} rows have exactly {top} response tokens, the longest"


def _ids_at(rollouts: Sequence[CheckRollout], offsets: np.ndarray, q: np.ndarray) -> np.ndarray:
    """int64 token ids at the flat positions ``q`` of the columns (``offsets``), read from each row's
    own ids (-1 for a row without ids of its length): a few per row, no (N,) copy of every id."""
    q = np.asarray(q, dtype=np.int64)
    rows = np.searchsorted(offsets, q, side="right") - 1
    out = np.full(len(q), -1, dtype=np.int64)
    lengths = np.diff(offsets)
    for j, (i, p) in enumerate(zip(rows.tolist(), (q - offsets[rows]).tolist())):
        ids = rollouts[i].token_ids
        if ids is not None and len(ids) == lengths[i]:
            out[j] = ids[p]
    return out


def _stop_tokens(ctx: CheckContext, last_ids: np.ndarray) -> tuple[frozenset[int], str]:
    """The stop token ids and where they come from: the template's end-of-turn token and the EOS
    (``--tokenizer``), else the id that ends more than :data:`STOP_SHARE` of the policy turns
    ``last_ids`` (the last id of every turn of the own rows)."""
    tok = ctx.tokenizer
    if tok is not None and ctx.mismatch is None:
        ids = set()
        if ctx.markers is not None and ctx.markers.end:
            ids.add(int(ctx.markers.end[-1]))
        if getattr(tok, "eos_token_id", None) is not None:
            ids.add(int(tok.eos_token_id))
        if ids:
            return frozenset(ids), "the tokenizer's end-of-turn / EOS token " + ", ".join(
                f"{i} ({ctx.decode(i)})" for i in sorted(ids))
    if last_ids.size < 2:
        return frozenset(), "no stop token: pass --tokenizer (fewer than two policy turns to infer it from)"
    vals, counts = np.unique(last_ids, return_counts=True)
    j = int(np.argmax(counts))
    pct = 100.0 * counts[j] / last_ids.size
    if counts[j] < 2 or counts[j] <= STOP_SHARE * last_ids.size:  # most: strictly more than half
        return frozenset(), (f"no stop token: pass --tokenizer (no id ends most policy turns; the most common, "
                             f"{int(vals[j])}, ends {pct:.0f}% of {last_ids.size})")
    return frozenset({int(vals[j])}), (f"inferred from the data: id {int(vals[j])} ({ctx.decode(int(vals[j]))}) ends "
                                       f"{pct:.0f}% of the {last_ids.size} policy turns")


def endings(rollouts: Sequence[CheckRollout], ctx: CheckContext) -> Endings:
    """The :class:`Endings` of the run (cached on the run's columns)."""
    cols = ctx.columns
    cached = cols._cache.get("endings")
    if cached is not None:
        return cached
    b = cols.B
    has_ids = np.fromiter((r.token_ids is not None and not r.mask_from_template for r in rollouts), bool, count=b)
    own = has_ids & cols.has_mask & (cols.n_turns > 0)
    last_turn = np.full(b, -1, dtype=np.int64)
    q = np.flatnonzero(cols.turn_last)
    last_turn[cols.turn_row[q]] = q
    first_turn = np.full(b, -1, dtype=np.int64)
    f = np.flatnonzero(cols.turn_k == 0)
    first_turn[cols.turn_row[f]] = f
    has = last_turn >= 0

    def take(x: np.ndarray, idx: np.ndarray) -> np.ndarray:  # x[idx] where has, 0 elsewhere (x may be empty)
        return np.where(has, x[np.where(has, idx, 0)], 0) if x.size else np.zeros(b, dtype=np.int64)

    starts = cols.offsets[:-1]
    ends = cols.offsets[1:]
    last_flat = np.where(has, take(cols.turn_stop, last_turn) - 1, -1)
    last_pos = np.where(has, last_flat - starts, -1)
    trailing = np.where(has, ends - 1 - last_flat, 0)
    response = np.where(has, ends - take(cols.turn_start, first_turn), 0)
    last_len = take(cols.turn_len, last_turn)
    last_id = np.full(b, -1, dtype=np.int64)
    last_id[own] = _ids_at(rollouts, cols.offsets, last_flat[own])  # (own rows have a last turn)
    turn_own = own[cols.turn_row]
    turn_last_ids = _ids_at(rollouts, cols.offsets, cols.turn_stop[turn_own] - 1)
    stop, said = _stop_tokens(ctx, turn_last_ids)
    ends_stop = own & np.isin(last_id, np.fromiter(stop, np.int64)) if stop else np.zeros(b, dtype=bool)
    glue = len(ctx.markers.glue) if ctx.markers is not None else GLUE_TOKENS
    padding = np.zeros(b, dtype=bool)
    pad = getattr(ctx.tokenizer, "pad_token_id", None) if ctx.tokenizer is not None else None
    for i in np.flatnonzero(own & (trailing > glue)):  # rows with a tail only
        tail = np.asarray(rollouts[i].token_ids)[int(last_pos[i]) + 1 + glue:]
        padding[i] = (len(tail) >= 2 or (pad is not None and tail[0] == pad)) and bool((tail == tail[0]).all())
    out = Endings(own, last_turn, last_pos, last_len, trailing, response, last_id, ends_stop, stop, said, glue,
                  padding)
    cols._cache["endings"] = out
    return out


def _flags(rollouts: Sequence[CheckRollout]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(B,) bool each: truncated known, truncated true, terminated known, terminated true."""
    tr = [r.truncated for r in rollouts]
    te = [r.terminated for r in rollouts]
    return (np.array([v is not None for v in tr], dtype=bool), np.array([v is True for v in tr], dtype=bool),
            np.array([v is not None for v in te], dtype=bool), np.array([v is True for v in te], dtype=bool))


# --------------------------------------------------------------------------------------------- flag


def check_truncation_flag(rollouts: Sequence[CheckRollout], ctx: CheckContext) -> CheckOutcome:
    """A row that says it was not truncated while its last policy turn does not end on the stop token
    and stops at the per-turn cap (``--max-turn-tokens``) or the response cap (vLLM's
    ``finish_reason="length"`` dropped, OpenRLHF PR #1327): fail. A row that says it was truncated
    while its last turn ends on the stop token, below every cap, with no observation after it
    (truncation inferred from the padded batch width, AReaL PR #1637): warn. With no cap known (no
    ``--max-turn-tokens``, none given or inferable for the response), a row that says it was not
    truncated and whose last turn does not end on the stop token: warn (a length cut or a stop
    string; the cap tells them apart)."""
    spec = CheckSpec("truncation_flag", "masks", "the truncation flag agrees with how the last turn ends (stop token "
                     "or a length cap)",
                     "carry the last generation's finish_reason into the rollout (truncated = finish_reason == "
                     "'length'), never infer truncation from the padded batch width; keep the flag per trajectory "
                     "so that overlong filtering / the stop-properly penalty see it", ("OpenRLHF PR #1327",
                                                                                     "AReaL PR #1637"))
    cfg = ctx.config
    e = endings(rollouts, ctx)
    known, flag, _, _ = _flags(rollouts)
    rows = e.own & known
    if not rows.any():
        return spec.skip("needs rows with token ids, their own response_mask and a truncation flag (truncated / "
                         "is_truncated / finish_reason)")
    if not e.stop:
        return spec.skip(e.stop_said)
    cap, cap_said = e.cap(cfg.max_response_tokens)
    at_turn_cap = (e.last_len == cfg.max_turn_tokens) if cfg.max_turn_tokens is not None else np.zeros(len(rows), bool)
    at_resp_cap = (e.response >= cap) if cap is not None else np.zeros(len(rows), bool)
    capped = at_turn_cap | at_resp_cap
    unflagged = rows & ~flag & ~e.ends_stop & capped
    uncapped = rows & ~flag & ~e.ends_stop & ~capped
    spurious = rows & flag & e.ends_stop & ~capped & (e.trailing <= e.glue)
    ex: list[Example] = []
    for i in np.flatnonzero(unflagged):
        why = f"turn {int(e.last_len[i])} tokens = --max-turn-tokens" if at_turn_cap[i] else \
            f"response {int(e.response[i])} tokens = the cap"
        ex.append(Example(rollouts[i].trajectory_id, int(ctx.columns.turn_k[e.last_turn[i]]), int(e.last_pos[i]),
                          f"truncated is false, but the last turn ends on {ctx.decode(int(e.last_id[i]))}, not the "
                          f"stop token, at the cap ({why})", 2.0))
    no_cap = cap is None and cfg.max_turn_tokens is None  # nothing to tell a length cut from a stop string
    if no_cap:
        for i in np.flatnonzero(uncapped):
            ex.append(Example(rollouts[i].trajectory_id, int(ctx.columns.turn_k[e.last_turn[i]]), int(e.last_pos[i]),
                              f"truncated is false, but the last turn ends on {ctx.decode(int(e.last_id[i]))}, not the "
                              "stop token (no length cap known)", 1.5))
    for i in np.flatnonzero(spurious):
        ex.append(Example(rollouts[i].trajectory_id, int(ctx.columns.turn_k[e.last_turn[i]]), int(e.last_pos[i]),
                          f"truncated is true, but the last turn ends on the stop token with {int(e.response[i])} "
                          "response tokens, below the cap", 1.0))
    n, nu, ns = int(rows.sum()), int(unflagged.sum()), int(spurious.sum())
    counts = {"trajectories_checked": n, "flagged_truncated": int((rows & flag).sum()), "unflagged_at_cap": nu,
              "flagged_on_stop_token": ns, "unflagged_without_stop_below_cap": int(uncapped.sum())}
    measured = {"share_unflagged_at_cap": share(nu, n), "response_cap": None if cap is None else float(cap)}
    said = f"stop token: {e.stop_said}; response cap: {cap_said}"
    if nu:
        return spec(FAIL, summary=f"{nu} of {n} rows say truncated = false but stop at a length cap without the stop "
                    f"token ({said})", counts=counts, measured=measured, examples=ex, n=cfg.examples)
    nc = int(uncapped.sum()) if no_cap else 0
    if ns or nc:
        parts = [f"{ns} of {n} rows say truncated = true but their last turn ends on the stop token below every cap"] \
            if ns else []
        if nc:
            parts.append(f"{nc} of {n} rows say truncated = false but their last turn does not end on the stop token "
                         "(no cap known to tell a length cut from a stop string: pass --max-turn-tokens / "
                         "--max-response-tokens)")
        return spec(WARN, summary="; ".join(parts) + f" ({said})", counts=counts, measured=measured, examples=ex,
                    n=cfg.examples)
    return spec(PASS, summary=f"the truncation flag agrees with every row's ending ({n} rows; {said})", counts=counts,
                measured=measured)


# --------------------------------------------------------------------------------------------- observation


def _trailing_messages(messages: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The messages after the last assistant message (all of them when there is none)."""
    last = max((j for j, m in enumerate(messages) if m.get("role") == "assistant"), default=-1)
    return list(messages[last + 1:]) if last >= 0 else []


def _conversation_endings(rollouts: Sequence[CheckRollout], conv: np.ndarray) -> tuple[np.ndarray, np.ndarray,
                                                                                         dict[int, str]]:
    """(B,) bool each: the conversation ends on observations; it ends on one that is a finding (a tool
    reply to a call of no terminal tool, or any observation of a record that says truncated = false and
    terminated = false); and the finding's sentence by row. Flags are applied by the caller."""
    tail = np.zeros(len(rollouts), dtype=bool)
    bad = np.zeros(len(rollouts), dtype=bool)
    why: dict[int, str] = {}
    for i in np.flatnonzero(conv):
        r = rollouts[i]
        rest = _trailing_messages(r.messages)
        tail[i] = bool(rest) and all(m.get("role") in OBSERVATION_ROLES for m in rest)
        if not tail[i]:
            continue
        last_call = next(m for m in reversed(r.messages) if m.get("role") == "assistant").get("tool_calls") or []
        names = [n for n in _call_names(last_call) if n]
        if rest[-1].get("role") == "tool" and not (names and all(_terminal(n) for n in names)):
            bad[i] = True
            why[i] = (f"the conversation ends on the tool reply to {', '.join(names) or 'no call'} (no terminal tool) "
                      "with no truncated / terminated flag")
        elif r.truncated is False and r.terminated is False:
            bad[i] = True
            why[i] = f"the conversation ends on a {rest[-1].get('role')} message and says truncated = false, terminated = false"
    return tail, bad, why


def check_ends_on_observation(rollouts: Sequence[CheckRollout], ctx: CheckContext) -> CheckOutcome:
    """Token rows whose last policy turn is followed by an observation (more trailing mask-0 tokens
    than the template's separator, not one id repeated: padding) while the row is flagged neither
    truncated nor terminated: the context ran out after the environment's reply and nobody marked it (OpenRLHF PR #1352): warn.
    Conversations (and token rows that carry their messages: logs) warn when they end on the tool
    reply to a call of no terminal tool (:data:`TERMINAL_TOOLS`), unflagged, or on any observation
    while the record says both truncated = false and terminated = false; other observation endings
    (a user / environment message after the final action, e.g. "Episode finished", or the reply to
    ``transfer_to_human_agents``) are counted, not warned: a chat log keeps them."""
    spec = CheckSpec("ends_on_observation", "masks", "a rollout that ends on an observation is flagged truncated or "
                     "terminated",
                     "when the agent loop stops because the environment's reply filled the context (no budget for "
                     "another generation), mark the trajectory truncated, so the stop-properly penalty and "
                     "truncation metrics see it", ("OpenRLHF PR #1352",))
    e = endings(rollouts, ctx)
    known_tr, flag_tr, known_te, flag_te = _flags(rollouts)
    conv = np.array([bool(r.messages) for r in rollouts], dtype=bool)
    own = e.own & ~conv  # rows that carry their messages are logs: read as conversations
    if not (own.any() or conv.any()):
        return spec.skip("needs token ids with their own response_mask, or messages")
    tail = own & (e.trailing > e.glue) & ~e.padding
    flagged = flag_tr | flag_te
    bad = tail & ~flagged
    conv_tail, conv_bad, why = _conversation_endings(rollouts, conv)
    conv_bad &= ~flagged
    ex = [Example(rollouts[i].trajectory_id, int(ctx.columns.turn_k[e.last_turn[i]]), int(e.last_pos[i]) + 1,
                  f"{int(e.trailing[i])} context tokens after the last policy turn, and the row is flagged neither "
                  "truncated nor terminated", float(e.trailing[i])) for i in np.flatnonzero(bad)]
    ex += [Example(rollouts[i].trajectory_id, None, None, why[i], 1.0) for i in np.flatnonzero(conv_bad)]
    nb = int(bad.sum()) + int(conv_bad.sum())
    n_rows, n_conv = int(own.sum()), int(conv.sum())
    counts = {"trajectories_checked": n_rows + n_conv, "rows_checked": n_rows, "rows_ending_on_observation":
              int(tail.sum()), "rows_unflagged": int(bad.sum()), "conversations_checked": n_conv,
              "conversations_ending_on_observation": int(conv_tail.sum()), "conversations_unflagged": int(conv_bad.sum()),
              "rows_ending_on_padding": int((own & e.padding).sum())}
    measured = {"share_rows_ending_on_observation": share(int(tail.sum()), n_rows)}
    if nb:
        return spec(WARN, summary=f"{nb} rollouts end on an observation with no truncated / terminated flag "
                    f"({int(bad.sum())} of {n_rows} token rows, {int(conv_bad.sum())} of {n_conv} conversations)",
                    counts=counts, measured=measured, examples=ex, n=ctx.config.examples)
    extra = f"; {int(conv_tail.sum())} conversations end on the reply to a final or terminal action (counted: a chat " \
            "log keeps it)" if conv_tail.any() else ""
    n_tail = int(tail.sum())
    rows_said = "" if not n_rows else f" ({n_tail} of {n_rows} token rows end on one, all flagged)" if n_tail \
        else f" (none of {n_rows} token rows ends on one)"
    return spec(PASS, summary=f"no unflagged rollout ends on an observation{rows_said}{extra}", counts=counts,
                measured=measured)


def _terminal(name: str) -> bool:
    n = name.strip().lower()
    return n in TERMINAL_TOOLS or any(w in n for w in TERMINAL_TOOLS[:4])


def _call_names(calls: Sequence[Any]) -> list[str]:
    out = []
    for c in calls:
        fn = c.get("function") if isinstance(c, Mapping) else None
        name = fn.get("name") if isinstance(fn, Mapping) else (c.get("name") if isinstance(c, Mapping) else None)
        out.append(str(name) if name is not None else "")
    return out


def _decoded_call(text: str) -> list[str] | None:
    """The tool names called in a decoded policy turn (``[""]`` for a call without a readable name);
    None when the turn calls no tool."""
    if not any(m in text for m in _CALL_MARKS):
        return None
    names = _NAME.findall(text)
    if not names:
        try:
            doc = json.loads(text[text.index("{"):text.rindex("}") + 1])
            names = [str(doc.get("name", ""))] if isinstance(doc, dict) else []
        except ValueError:
            names = []
    return names or [""]


def check_unanswered_tool_call(rollouts: Sequence[CheckRollout], ctx: CheckContext) -> CheckOutcome:
    """A rollout that ends on an assistant tool call that never got a reply, flagged neither truncated
    nor terminated (OpenRLHF PR #1352's other exit), in a loop that runs tools (an earlier tool
    message, or for token rows an earlier turn followed by context): warn. A single-turn rollout whose
    answer is a tool call (the environment scores the call) is not counted, nor a call of a tool that
    ends the episode (:data:`TERMINAL_TOOLS`: ``finish``, ``submit``, ...). Reads the last message of
    conversations, and (``--tokenizer``) the decoded last turn of token rows that end on it."""
    spec = CheckSpec("unanswered_tool_call", "masks", "a rollout that ends on a tool call is flagged truncated or "
                     "terminated",
                     "when the loop stops before running the policy's last tool call (turn or context budget), mark "
                     "the trajectory truncated; or run the call and append its reply", ("OpenRLHF PR #1352",))
    e = endings(rollouts, ctx)
    _, flag_tr, _, flag_te = _flags(rollouts)
    decode = ctx.tokenizer is not None and ctx.mismatch is None
    checked = bad_n = terminal_n = 0
    ex: list[Example] = []
    for i, r in enumerate(rollouts):
        names = None
        if r.messages:
            checked += 1
            last = r.messages[-1]
            replied = any(m.get("role") == "tool" for m in r.messages[:-1])  # the loop runs tools
            if last.get("role") == "assistant" and last.get("tool_calls") and replied:
                names = _call_names(last["tool_calls"])
            where: tuple[int | None, int | None] = (None, None)
        elif decode and e.own[i]:
            checked += 1
            if e.trailing[i] <= e.glue and ctx.columns.n_turns[i] >= 2:  # an earlier turn got a reply
                q = int(e.last_turn[i])
                seg = r.token_ids[ctx.columns.turn_start[q] - ctx.columns.offsets[i]:int(e.last_pos[i]) + 1]
                names = _decoded_call(ctx.tokenizer.decode(seg.tolist(), skip_special_tokens=False))
            where = (int(ctx.columns.turn_k[e.last_turn[i]]), int(e.last_pos[i]))
        if not names:
            continue
        if all(_terminal(n) for n in names if n) and any(names):
            terminal_n += 1
            continue
        if flag_tr[i] or flag_te[i]:
            continue
        bad_n += 1
        ex.append(Example(r.trajectory_id, where[0], where[1], f"the rollout ends on a call of "
                          f"{', '.join(n or '?' for n in names)} with no reply and no truncated / terminated flag", 1.0))
    if not checked:
        return spec.skip("needs messages, or token rows and --tokenizer (to read the last turn's tool call)")
    counts = {"trajectories_checked": checked, "trajectories": bad_n, "ending_on_terminal_call": terminal_n}
    if bad_n:
        return spec(WARN, summary=f"{bad_n} of {checked} rollouts end on a tool call that got no reply, unflagged",
                    counts=counts, examples=ex, n=ctx.config.examples)
    return spec(PASS, summary=f"no rollout ends on an unanswered, unflagged tool call ({checked} checked; "
                f"{terminal_n} end on a terminal call)", counts=counts)


# --------------------------------------------------------------------------------------------- cap


def _cap_evidence(at_share: float | None, below_share: float | None) -> bool:
    """An inferred cap cuts rows: more than :data:`STOP_SHARE` of the rows at the longest response end
    inside a turn (no stop token), more often than the shorter rows do (ending without the stop token
    is then tied to the length, not to how this run's turns end)."""
    return at_share is not None and at_share > STOP_SHARE and (below_share is None or at_share > below_share)


def check_response_cap_cut(rollouts: Sequence[CheckRollout], ctx: CheckContext) -> CheckOutcome:
    """Rows whose response length equals the response cap exactly and whose last token is inside a
    policy turn (mask 1, not the stop token), with no truncated flag: a merged multi-turn row cut at
    the cap, its later turns, answer, log-probs and advantages gone with it (rllm PR #575): warn.
    The cap is ``--max-response-tokens``, else inferred as the longest response when two rows or more
    reach it and some rows are shorter (a batch of one width shows no cap); an inferred cap is
    reported only on evidence (:func:`_cap_evidence`: most rows at it end inside a turn, more often
    than the shorter rows), else the check is skipped, naming both shares."""
    spec = CheckSpec("response_cap_cut", "masks", "no merged row is cut at the response cap inside a policy turn",
                     "bound a merged multi-turn row by the whole trajectory's length (prompt + every action and "
                     "observation), not by the per-turn generation cap; drop or flag rows that do not fit instead of "
                     "cutting them", ("rllm PR #575",))
    cfg = ctx.config
    e = endings(rollouts, ctx)
    if not e.own.any():
        return spec.skip("needs token ids with their own response_mask")
    if not e.stop:
        return spec.skip(e.stop_said + " (a row ending inside a turn cannot be told from one ending on its stop token)")
    cap, cap_said = e.cap(cfg.max_response_tokens)
    if cap is None:
        return spec.skip(f"no response cap: pass --max-response-tokens N ({cap_said})")
    _, flag_tr, _, _ = _flags(rollouts)
    at = e.own & (e.response == cap)
    cut = at & (e.trailing == 0) & ~e.ends_stop
    bad = cut & ~flag_tr
    multi = bad & (ctx.columns.n_turns >= 2)
    inside = e.own & (e.trailing == 0) & ~e.ends_stop
    below = e.own & (e.response < cap)
    at_share, below_share = share(int(cut.sum()), int(at.sum())), share(int((inside & below).sum()), int(below.sum()))
    if bad.any() and cfg.max_response_tokens is None and not _cap_evidence(at_share, below_share):
        return spec.skip(f"no evidence of a response cap: {int(cut.sum())} of {int(at.sum())} rows at the longest "
                         f"response ({cap} tokens) end inside a turn, against {int((inside & below).sum())} of "
                         f"{int(below.sum())} shorter rows; pass --max-response-tokens N to check against the real cap")
    ex = [Example(rollouts[i].trajectory_id, int(ctx.columns.turn_k[e.last_turn[i]]), int(e.last_pos[i]),
                  f"{cap} response tokens (the cap), ends inside turn {int(ctx.columns.turn_k[e.last_turn[i]])} on "
                  f"{ctx.decode(int(e.last_id[i]))} after {int(e.last_len[i])} of its tokens", 1.0 + bool(multi[i]))
          for i in np.flatnonzero(bad)]
    n, nb = int(e.own.sum()), int(bad.sum())
    counts = {"trajectories_checked": n, "at_cap": int(at.sum()), "cut_inside_turn": int(cut.sum()),
              "cut_unflagged": nb, "cut_unflagged_multi_turn": int(multi.sum()),
              "over_cap": int((e.own & (e.response > cap)).sum()) if cfg.max_response_tokens is not None else 0}
    measured = {"response_cap": float(cap), "share_cut": share(int(cut.sum()), n), "share_at_cap_cut": at_share,
                "share_below_cap_inside_turn": below_share}
    said = f"response cap: {cap_said}; stop token: {e.stop_said}"
    if nb:
        return spec(WARN, summary=f"{nb} of {n} rows ({int(multi.sum())} multi-turn) end inside a policy turn at exactly "
                    f"{cap} response tokens, unflagged: cut at the cap ({said})", counts=counts, measured=measured,
                    examples=ex, n=cfg.examples)
    return spec(PASS, summary=f"no unflagged row is cut inside a turn at the cap ({int(at.sum())} of {n} rows at "
                f"{cap} tokens; {said})", counts=counts, measured=measured)
