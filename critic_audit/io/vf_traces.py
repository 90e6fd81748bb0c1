"""Read verifiers v1 ``traces.jsonl`` files (prime-rl's ``rollouts/step_<N>/{train,eval}/{all,effective}/``
rollout output, and ``vf-eval``'s v1 run folders) straight into the canonical tables, token-exact.

Written by prime-rl's ``FileMonitor.log_episodes`` (``src/prime_rl/monitors/file.py``) and verifiers'
``write_episode`` (``verifiers/v1/cli/output.py``) from the pydantic models of ``verifiers/v1/episode.py``,
``trace.py`` and ``graph.py`` (github.com/PrimeIntellect-ai/verifiers). Three record versions, one a line:

* **episode** (prime-rl since 2026-08-21, ``Episode.to_record()``, ``exclude_none``): ``id``, ``env``
  (``id``, ``name``), ``task``, ``group`` (``id``; optional), ``run`` (optional: ``type`` train / eval,
  ``id``, ``name``, train: ``work`` {``type``, ``step``, ``policy`` {``start``, ``end``}}), ``ok``,
  ``errors``, ``traces``: the traces below (an errored episode may hold none);
* **trace** (prime-rl 2026-08-15 .. 08-21, ``Trace.to_record()``): one trace a line, ``run`` {``type``,
  ``id``, ``step``} on it, no group;
* **rollout** (prime-rl 2026-07-09 .. 08-15, ``Rollout.to_record()``): a trace plus ``kind``, ``env_name``,
  ``group_id``, ``policy_version``, ``eval_step``; ``rewards`` a ``{name: float}`` map until verifiers
  2026-07-23, ``{name: {score, weight} | null}`` since.

A trace (``version`` 1): ``id``, ``task`` {``type``, ``data``, ``key``, ``hash``}, ``agent`` {``name``,
``trainable``, ``config``, ``runtime``}, ``nodes`` (the message graph: ``parent`` index or null,
``message``, ``sampled``, ``token_ids`` (the tokens the node adds), ``mask`` (True at sampled tokens),
``logprobs`` (one per True ``mask`` entry), optional ``advantages`` / ``reference_logprobs`` (same layout),
``loss_weights``), ``calls``, ``rewards``, ``metrics``, ``is_completed``, ``ok``, ``stop_condition``,
``errors``, ``timing``. The tensors ``multi_modal_data``, ``routed_experts``, ``kept_tokens`` are never
written.

Read as: one rollout per **branch** of each trace (a root-to-leaf path of ``nodes``: verifiers' training
sample), id ``{episode id}/{trace id}`` (``/b{k}`` when a trace has several branches); tokens = the
nodes' ``token_ids`` along the path, ``response_mask`` = their ``mask``, a turn = one node with sampled
tokens (``turn_starts``); side arrays ``rollout_log_probs`` = ``logprobs`` and ``advantages`` (when
assigned) spread onto the masked positions (NaN elsewhere); reward = verifiers' ``Trace.reward``, the sum
of ``score * weight`` over the scored rewards (None when none was scored); group = ``group.id`` /
``group_id``, else the task's ``key`` / ``hash`` (the rollouts of one task), per step; checkpoint = the
step (``run.work.step``, ``run.step``, ``eval_step``, else the ``step_<N>`` folder). A file whose traces
carry no token ids (a client that returns text only), or ``--token-ids text``: one
:class:`critic_audit.schema.Conversation` per branch, the nodes' messages (:func:`file_kind`).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from critic_audit.errors import InputError
from critic_audit.io.records import (
    IdRegistry, ReadOptions, ReadReport, RecordContext, convert_records, error, iter_json_records, record_fields, short,
    type_name,
)

__all__ = ["sniff_record", "read_file", "iter_sequences", "is_episode", "is_trace", "collection_of", "rollouts_in",
           "file_kind", "skip_reason", "skip_in_folder", "same_episodes_as"]

#: Groups are named after the producer's group / task id, scoped per file (``all`` and ``effective`` hold
#: the same episodes: one file's group is never merged with another's).
GROUPS_SPAN_FILES = False


def is_trace(rec: Any) -> bool:
    """A verifiers v1 trace record: ``nodes`` (list), ``task`` and ``agent`` (objects), ``rewards``."""
    return (isinstance(rec, Mapping) and isinstance(rec.get("nodes"), list) and isinstance(rec.get("task"), Mapping)
            and isinstance(rec.get("agent"), Mapping) and "rewards" in rec)


def is_episode(rec: Any) -> bool:
    """A verifiers v1 episode record: ``traces`` (a list of trace records), ``task`` (object), ``ok``."""
    if not (isinstance(rec, Mapping) and isinstance(rec.get("traces"), list) and isinstance(rec.get("task"), Mapping)
            and "ok" in rec):
        return False
    return all(is_trace(t) for t in rec["traces"][:1])


def _is_record(rec: Any) -> bool:
    return is_episode(rec) or is_trace(rec)


def sniff_record(rec: Any, options: ReadOptions) -> bool:
    return _is_record(rec)


def collection_of(path: Path, root: Path) -> str:
    """``<kind>/<subset>`` (``train/effective``) for prime-rl's ``rollouts/step_<N>/<kind>/<subset>/traces.jsonl``
    (``all`` and ``effective`` hold the same episodes: two collections), else the run folder (vf-eval)."""
    sub = path.parent
    if sub.parent.parent.name.startswith("step_") and sub.parent.parent.parent.name == "rollouts":
        return f"{sub.parent.name}/{sub.name}"
    return sub.name or path.stem


def _plain_name(path: Path) -> str:
    """The file name without a compression suffix (``00000.jsonl.zst`` -> ``00000.jsonl``)."""
    from critic_audit.io.content import strip_compression_suffix

    return strip_compression_suffix(path.name)


def skip_reason(path: Path) -> str | None:
    """prime-rl's file-monitor files beside the episode stream (``<run>/monitors/file/traces/``, since
    2026-08-31) that hold no episode, by their place (no file is opened):

    * ``prime_rl_trace_index``: ``stream.index.jsonl`` / ``annotations/<producer>.index.jsonl``, one
      summary row per episode or update (offsets into the stream);
    * ``prime_rl_trace_annotations``: ``annotations/<producer>/<n>.jsonl[.zst]`` (or
      ``annotations/<producer>.jsonl``), updates folded onto traces after they arrived (the shipped
      cohort, trainer per-token streams): not read;
    * ``prime_rl_live_trace``: ``live/<trace id>.jsonl``, deltas of a rollout still in flight;
    * ``prime_rl_metrics``: ``monitors/file/metrics.jsonl``, the run's metric rows;
    * ``prime_rl_chunk_being_sealed``: ``<n>.jsonl.zst.tmp``, a chunk's compressed twin being written
      (its plain chunk is still there).
    """
    parts = list(Path(path).parts[-5:-1][::-1])  # the nearest 4 folder names, nearest first
    if path.name == "metrics.jsonl" and parts[:2] == ["file", "monitors"]:
        return "prime_rl_metrics"
    if "traces" not in parts:
        return None
    name = path.name.lower()
    if name.endswith(".tmp") and ".zst" in name:
        return "prime_rl_chunk_being_sealed"
    if _plain_name(path).lower().endswith(".index.jsonl") and parts[0] in ("traces", "annotations"):
        return "prime_rl_trace_index"
    at = parts.index("traces")
    if at >= 1 and parts[at - 1] == "annotations":
        return "prime_rl_trace_annotations"
    if at >= 1 and parts[at - 1] == "live":
        return "prime_rl_live_trace"
    return None


def skip_in_folder(path: Path, root: Path) -> str | None:
    """Files the search of folder ``root`` leaves out (each is read when named on its own):

    * ``prime_rl_all_beside_effective``: ``rollouts/step_N/<kind>/all/traces.jsonl`` when ``effective/``
      beside it holds the same file, and the search covers both (``root`` above ``all/``; the folder
      ``all/`` itself is read). ``all/`` is every episode that arrived (errored, filtered and
      never-batched ones included), ``effective/`` the clean cohort shipped to the trainer, a subset of
      the same episodes: the audit reads the cohort the trainer (and the critic) learned from, as
      prime-rl's own platform upload and W&B distributions do. Point at ``all/`` to audit every arrival.
    * ``prime_rl_chunk_sealed_twin``: a stream chunk ``<n>.jsonl.zst`` whose plain ``<n>.jsonl`` is
      still there (sealing finished but had not removed the plain file): the same lines twice.
    """
    twin = same_episodes_as(path)
    if twin is not None and Path(root) in twin[0].parents:
        return "prime_rl_all_beside_effective"
    if re.fullmatch(r"\d+\.jsonl\.zst", path.name) and path.with_name(path.name[:-4]).is_file():
        return "prime_rl_chunk_sealed_twin"
    return None


def same_episodes_as(path: Path) -> tuple[Path, str] | None:
    """For prime-rl's ``<kind>/all/<file>``: its ``<kind>/effective/<file>`` (plain or compressed) when
    there, with the one-line fix for reading both (the same episodes twice); else None."""
    if path.parent.name != "all":
        return None
    effective = path.parent.parent / "effective"
    plain = _plain_name(path)
    for name in (plain, plain + ".zst", plain + ".gz"):
        if (effective / name).is_file():
            return effective / name, ("pass one of them: effective/ (the cohort the trainer learned from; what a "
                                      "folder search reads) or all/ (every arrival, errored episodes included)")
    return None


def _path_step(path: Path) -> int | None:
    for d in path.parents:
        m = re.fullmatch(r"step_(\d+)", d.name)
        if m:
            return int(m.group(1))
    return None


def _step(rec: Mapping[str, Any], trace: Mapping[str, Any], path_step: int | None) -> Any:
    """The dispatch step: the episode's ``run.work.step``, a trace's ``run.step``, ``eval_step``, the folder."""
    for run in (rec.get("run"), trace.get("run")):
        if isinstance(run, Mapping):
            work = run.get("work")
            if isinstance(work, Mapping) and work.get("step") is not None:
                return work["step"]
            if run.get("step") is not None:
                return run["step"]
    return trace["eval_step"] if trace.get("eval_step") is not None else path_step


def _reward(rewards: Any, ctx: RecordContext) -> float | None:
    """``Trace.reward``: the sum of ``score * weight`` (a plain float before 2026-07-23) over the scored rewards."""
    if not isinstance(rewards, Mapping):
        raise error(ctx, "bad_record", f"rewards is {type_name(rewards)}, not an object of named rewards",
                    "write rewards as verifiers does: {name: {score, weight} | null}")
    total, scored = 0.0, False
    for name, r in rewards.items():
        if r is None:
            continue
        if isinstance(r, Mapping):
            score, weight = r.get("score"), r.get("weight", 1.0)
        else:
            score, weight = r, 1.0
        if not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in (score, weight)):
            raise error(ctx, "bad_record", f"reward {name!r} is {short(r, 40)}, not a number or {{score, weight}}",
                        "write each reward as verifiers does: {\"score\": float, \"weight\": float} or null")
        total, scored = total + float(score) * float(weight), True
    return total if scored else None


def _path_to(nodes: list[Any], leaf: int, ctx: RecordContext) -> list[int]:
    path, nid, seen = [], leaf, set()
    while nid is not None:
        if not isinstance(nid, int) or isinstance(nid, bool) or not 0 <= nid < len(nodes) or nid in seen:
            raise error(ctx, "bad_record", f"node parent {short(nid, 20)} is not an earlier node's index "
                        f"(0..{len(nodes) - 1}, no cycle)",
                        "write nodes as verifiers does: parent = a node index or null")
        seen.add(nid)
        path.append(nid)
        nid = nodes[nid].get("parent") if isinstance(nodes[nid], Mapping) else None
    return path[::-1]


def _leaves(nodes: list[Any]) -> list[int]:
    """verifiers' ``graph.leaves``: the indices no node names as its (integer) ``parent``."""
    has_child = {p for n in nodes if isinstance(n, Mapping) and isinstance(p := n.get("parent"), int)}
    return [i for i in range(len(nodes)) if i not in has_child]


def _node_arrays(node: Any, ctx: RecordContext) -> tuple[list[int], list[bool], list[Any], Any]:
    if not isinstance(node, Mapping):
        raise error(ctx, "bad_record", f"a node is {type_name(node)}, not an object",
                    "write nodes as verifiers does: {parent, message, token_ids, mask, logprobs}")
    ids, mask = node.get("token_ids", []), node.get("mask", [])
    logprobs, adv = node.get("logprobs", []), node.get("advantages")
    ok_ids = isinstance(ids, list) and all(isinstance(x, int) and not isinstance(x, bool) and 0 <= x < 2**31
                                           for x in ids)
    ok_mask = isinstance(mask, list) and len(mask) == len(ids) and all(isinstance(x, bool) for x in mask)
    if not (ok_ids and ok_mask):
        raise error(ctx, "bad_tokens", f"a node's token_ids {short(ids, 40)} / mask {short(mask, 40)} are not "
                    "token ids (0 <= id < 2^31) with one true/false each", "write token_ids and mask as verifiers does")
    n = sum(mask)
    for key, v in (("logprobs", logprobs), ("advantages", adv)):
        if v is None or (key == "logprobs" and v == []):
            continue
        if not (isinstance(v, list) and len(v) == n
                and all(x is None or isinstance(x, (int, float)) and not isinstance(x, bool) for x in v)):
            raise error(ctx, "bad_values", f"a node's {key} is {short(v, 40)}, not {n} numbers (one per sampled "
                        "token)", f"write {key} as verifiers does: one number per true mask entry")
    return ids, mask, logprobs, adv


def _spread(values: list[list[Any] | None], masks: list[list[bool]]) -> np.ndarray | None:
    """Per-sampled-token node values onto their masked positions (NaN elsewhere); None when no node has any."""
    if all(not v for v in values):
        return None
    out = np.full(sum(len(m) for m in masks), np.nan)
    at = 0
    for v, m in zip(values, masks):
        pos = at + np.flatnonzero(np.asarray(m, dtype=bool))
        if v:
            out[pos] = np.asarray([np.nan if x is None else x for x in v], dtype=np.float64)
        at += len(m)
    return out


@dataclasses.dataclass
class _Record:
    """The branches of one line (an episode or a trace), checked as one record."""

    trajectory_id: str
    sequences: list[Any]


def _branch(trace: Mapping[str, Any], path: list[int], ctx: RecordContext) -> dict[str, Any]:
    parts = [_node_arrays(trace["nodes"][i], ctx) for i in path]
    masks = [p[1] for p in parts]
    ids = np.asarray([x for p in parts for x in p[0]], dtype=np.int64)
    mask = np.asarray([x for m in masks for x in m], dtype=bool)
    starts = np.zeros(len(ids), dtype=bool)
    at = 0
    for m in masks:
        if any(m):
            starts[at + m.index(True)] = True
        at += len(m)
    side = {k: a for k, a in (("rollout_log_probs", _spread([p[2] for p in parts], masks)),
                              ("advantages", _spread([p[3] for p in parts], masks))) if a is not None}
    return {"ids": ids, "mask": mask, "starts": starts, "side": side}


def _group(rec: Mapping[str, Any], trace: Mapping[str, Any], step: Any) -> str | None:
    group = rec.get("group")
    gid = group.get("id") if isinstance(group, Mapping) else trace.get("group_id")
    if gid is None:
        task = trace.get("task") or {}
        gid = task.get("key") or task.get("hash")
        gid = f"task:{gid}" if gid is not None else None
    return None if gid is None else f"step{step}:{gid}"


def _meta(rec: Mapping[str, Any], trace: Mapping[str, Any], ctx: RecordContext) -> dict[str, Any]:
    agent = trace.get("agent") if isinstance(trace.get("agent"), Mapping) else {}
    env = rec.get("env") if isinstance(rec.get("env"), Mapping) else {}
    meta: dict[str, Any] = {"tokens": "policy token ids (verifiers v1 trace nodes)",
                            "trace_version": trace.get("version"), "agent": agent.get("name"),
                            "trainable": agent.get("trainable"), "ok": trace.get("ok"),
                            "stop_condition": trace.get("stop_condition"),
                            "env": env.get("name") or env.get("id") or trace.get("env_name"),
                            "kind": (rec.get("run") or {}).get("type") if isinstance(rec.get("run"), Mapping)
                            else trace.get("kind")}
    work = (rec.get("run") or {}).get("work") if isinstance(rec.get("run"), Mapping) else None
    policy = work.get("policy") if isinstance(work, Mapping) else None
    if isinstance(policy, Mapping):
        meta["policy_start"], meta["policy_end"] = policy.get("start"), policy.get("end")
    elif trace.get("policy_version") is not None:
        meta["policy_start"] = meta["policy_end"] = trace["policy_version"]
    return {k: v for k, v in meta.items() if v is not None}


def _message(node: Any, i: int, ctx: RecordContext) -> dict[str, Any]:
    """A node's verifiers v1 message in the canonical chat shape (``tool_calls`` {id, name, arguments} ->
    chat-completions calls); a prompt-supplied assistant message (``sampled`` false) is ``context``."""
    from critic_audit.io.messages import message

    m = node.get("message") if isinstance(node, Mapping) else None
    if isinstance(m, Mapping) and isinstance(m.get("tool_calls"), list):
        m = dict(m, tool_calls=[{"id": c.get("id"), "type": "function", "function": {
            "name": c.get("name"), "arguments": c.get("arguments")}} if isinstance(c, Mapping) and "function" not in c
            else c for c in m["tool_calls"]])
    out = message(m, i, ctx)
    if out["role"] == "assistant" and node.get("sampled") is False:
        out["context"] = True
    return out


def _branch_rollout(trace: Mapping[str, Any], path: list[int], ctx: RecordContext, text: bool) -> Any:
    """A branch's token arrays (:func:`_branch`), or with ``text`` its messages."""
    if text:
        return [_message(trace["nodes"][i], k, ctx) for k, i in enumerate(path)]
    b = _branch(trace, path, ctx)
    if not len(b["ids"]):
        raise error(ctx, "no_token_ids", f"trace {short(trace.get('id'), 40)} holds a branch without token "
                    "ids (sampled through a client that returns text only)",
                    "read the whole file as text (--token-ids text), or pass --lenient to skip such traces")
    return b


def _trace_sequences(rec: Mapping[str, Any], trace: Any, ctx: RecordContext, opts: ReadOptions, source: str,
                     path_step: int | None, report: ReadReport, text: bool) -> list[Any]:
    """The rollouts of one trace: a :class:`critic_audit.io.tokenized.TokenSequence` per branch, or with
    ``text`` a :class:`critic_audit.schema.Conversation` per branch."""
    from critic_audit.io.records import fields_conversation
    from critic_audit.io.tokenized import TokenSequence

    if not is_trace(trace):
        raise error(ctx, "bad_record", f"a trace is {short(sorted(trace) if isinstance(trace, Mapping) else trace, 60)}"
                    ", not a verifiers trace (nodes, task, agent, rewards)",
                    "write traces as verifiers' Trace.to_record()")
    nodes = trace["nodes"]
    branches = [_branch_rollout(trace, _path_to(nodes, leaf, ctx), ctx, text) for leaf in _leaves(nodes)]
    reward = _reward(trace.get("rewards"), ctx)
    step = _step(rec, trace, path_step)
    base = f"{rec['id']}/{trace.get('id')}" if rec is not trace and "id" in rec else str(trace.get("id", ctx.index))
    ctx.tid = base
    if reward is None and opts.require_reward:
        raise error(ctx, "missing_reward", f"trace {short(trace.get('id'), 40)} was not scored (every reward "
                    "null or none)", "pass --no-reward, or --lenient to skip unscored traces")
    meta, group = _meta(rec, trace, ctx), _group(rec, trace, step)
    out = []
    for k, b in enumerate(branches):
        tid = base if len(branches) == 1 else f"{base}/b{k}"
        f = record_fields({"id": tid, "reward": reward, "step": step, "group": group}, ctx,
                          dataclasses.replace(opts, reward_key=None, id_key=None, group_key="group", success_key=None,
                                              checkpoint_key=None), require_reward=False)
        if text:
            out.append(fields_conversation(f, b, dict(meta, branch=k, tokens="re-rendered text (no token ids)"),
                                           source, ctx))
            continue
        nonfinite = {}
        for name, arr in b["side"].items():
            bad = np.isnan(arr) & b["mask"]
            if bad.any():
                nonfinite[name] = bad.astype(np.int8)  # 1 = NaN: a null at a sampled token
        out.append(TokenSequence(f.trajectory_id, b["ids"], b["mask"], None, f.reward, f.success, group, f.checkpoint,
                                 source, dict(meta, branch=k), b["side"], nonfinite, b["starts"], ctx.label()))
    if reward is None:
        report.notes["vf_trace_without_rewards"] += 1
    return out


def rollouts_in(raw: Any) -> int:
    """The rollouts a line holds, for the record accounting: over its traces (one for a trace line), each
    trace's branches (nodes no node names as parent; at least 1); at least 1 a line (an episode without
    traces is one record, skipped)."""
    traces = raw.get("traces") if isinstance(raw, Mapping) and isinstance(raw.get("traces"), list) else [raw]
    n = 0
    for t in traces:
        nodes = t.get("nodes") if isinstance(t, Mapping) else None
        n += max(1, len(_leaves(nodes if isinstance(nodes, list) else [])))
    return max(1, n)


def _convert(raw: Any, ctx: RecordContext, opts: ReadOptions, source: str, path_step: int | None,
             report: ReadReport, ids: IdRegistry, text: bool = False) -> _Record:
    if not _is_record(raw):
        got = sorted(map(str, raw)) if isinstance(raw, Mapping) else type_name(raw)
        e = error(ctx, "bad_record", f"not a verifiers v1 episode (traces, task, ok) or trace (nodes, task, agent, "
                  f"rewards) record; got {short(got, 80)}",
                  "point at rollouts/step_<N>/<kind>/<subset>/traces.jsonl, or pick another --format")
        e.records = rollouts_in(raw)  # type: ignore[attr-defined]
        raise e
    traces = raw["traces"] if is_episode(raw) else [raw]
    if not traces:  # an episode that errored before any trace: one record, nothing to read (not an error)
        errs = raw.get("errors") if isinstance(raw.get("errors"), list) else []
        kinds = [e.get("type") for e in errs if isinstance(e, Mapping)]
        report.skip(error(ctx, "episode_without_traces", f"episode {short(raw.get('id'), 40)} holds no trace "
                          f"(ok={short(raw.get('ok'), 10)}, errors {short(kinds, 60)})",
                          "nothing to read: prime-rl's all/ files keep episodes that failed before any trace"))
        return _Record(f"line {ctx.index}", [])
    try:
        seqs = [s for t in traces for s in _trace_sequences(raw, t, ctx, opts, source, path_step, report, text)]
        for s in [s for s in seqs if s.trajectory_id in ids.seen][:1]:
            ids.check(s.trajectory_id, ctx)  # raises duplicate_id: the line is skipped whole
        for s in seqs:
            ids.check(s.trajectory_id, ctx)
    except InputError as e:
        if e.path is None and getattr(e, "reason", None) in ("invalid_unicode", "too_deep"):  # a metadata string
            from critic_audit.schema import value_error

            e = value_error((e.reason, e.field), path=ctx.path, record=ctx.label())  # type: ignore[attr-defined]
        e.records = rollouts_in(raw)  # type: ignore[attr-defined]  # a skipped line: all of its rollouts
        raise e from None
    return _Record(f"line {ctx.index}", seqs)  # ids are checked per rollout above


def _has_token_ids(raw: Any) -> bool:
    """Every node path of every trace of the line adds token ids (no trace sampled as text only)."""
    traces = raw.get("traces") if is_episode(raw) else [raw]
    return all(any(isinstance(n, Mapping) and n.get("token_ids") for n in t.get("nodes") or [])
               for t in traces if isinstance(t, Mapping))


def file_kind(path: Path, options: ReadOptions) -> str:
    """``tables`` when every trace of the file carries token ids (prime-rl's renderer client), else
    ``conversations`` (a client that returns text only, ``vf-eval`` against an API; or ``--token-ids
    text``): the branches' messages, rendered with the critic's template."""
    if options.token_ids == "text":
        return "conversations"
    try:
        for raw, _ in iter_json_records(path, _is_record, "verifiers v1 traces", True, ReadReport()):
            if _is_record(raw) and not _has_token_ids(raw):
                return "conversations"
    except InputError:
        return "tables"  # the reader reports it
    return "tables"


def _records(spec: Any, options: ReadOptions, report: ReadReport, text: bool) -> Iterator[Any]:
    place = Path(getattr(spec, "origin", None) or spec.path)  # the user's file, not a decompressed copy
    path_step = _path_step(place)
    sub = place.parent
    if same_episodes_as(place) is not None:  # all/ read by name, effective/ beside it
        report.notes["vf_traces_step_has_all_and_effective (the same episodes in both: read one subset)"] += 1
    records = iter_json_records(spec.path, _is_record, "verifiers v1 traces", options.lenient, report, spec.label)
    ids = IdRegistry()
    for rec in convert_records(records, lambda raw, ctx: _convert(raw, ctx, options, spec.source, path_step, report,
                                                                  ids, text), options.lenient, report):
        yield from rec.sequences


def iter_sequences(spec: Any, options: ReadOptions, report: ReadReport) -> Iterator[Any]:
    """One :class:`critic_audit.io.tokenized.TokenSequence` per branch of every trace (module docstring).

    Raises:
        InputError: a bad record (strict mode: one line naming file, record and fix), a branch without
            token ids, or an unscored trace unless ``--no-reward``.
    """
    return _records(spec, options, report, False)


def read_file(spec: Any, options: ReadOptions, report: ReadReport) -> Any:
    """Table kind (:func:`file_kind`): the canonical ``(trajectories, tokens, {})`` tables of one
    ``traces.jsonl`` file. Conversation kind: yield a :class:`critic_audit.schema.Conversation` per branch
    (the nodes' messages; prompt-supplied assistant messages as ``context``)."""
    if getattr(spec, "kind", "tables") == "conversations":
        return _records(spec, options, report, True)
    from critic_audit.io.tokenized import sequences_to_tables

    return (*sequences_to_tables(list(iter_sequences(spec, options, report))), {})
