"""Write the verifiers v1 traces.jsonl samples of this folder (see SOURCE.md).

The records follow the pydantic models of verifiers/v1/{episode,trace,graph}.py as dumped by the writers:
prime-rl's FileMonitor.log_episodes (``orjson.dumps(episode.to_record())``; ``Episode.to_record`` =
``model_dump(mode="json", exclude={"traces": {"__all__": EXCLUDE_FIELDS}}, exclude_none=True)``), the
2026-08-15 FileMonitor (``trace.to_record()`` = ``model_dump(mode="json", exclude=EXCLUDE_FIELDS)``, nulls
kept) and the 2026-07-09 orchestrator (``Rollout.to_record()`` = the trace record | kind, env_name,
group_id, policy_version, eval_step; rewards a {name: float} map). Token ids are made up (no tokenizer).
Run: python make_samples.py (from this folder).
"""

import json
from pathlib import Path

HERE = Path(__file__).parent


def drop_none(x):
    """pydantic's exclude_none: None-valued fields are left out at every level (list items stay)."""
    if isinstance(x, dict):
        return {k: drop_none(v) for k, v in x.items() if v is not None}
    if isinstance(x, list):
        return [drop_none(v) for v in x]
    return x


def node(parent, role, content, ids, n_sampled=0, logprobs=None, advantages=None, sampled=None):
    """A MessageNode dump: the generation-prompt scaffold, then n_sampled sampled tokens at the end."""
    mask = [False] * (len(ids) - n_sampled) + [True] * n_sampled
    return {"parent": parent, "message": {"role": role, "content": content}, "sampled": bool(n_sampled) if sampled is None else sampled,
            "timestamp": 1755800000.0, "token_ids": ids, "mask": mask, "is_content": [],
            "logprobs": logprobs if logprobs is not None else [], "advantages": advantages,
            "reference_logprobs": None, "loss_weights": None}


def trace(tid, task_key, nodes, rewards, *, ok=True, run=None, errors=None, stop="answered", agent="agent"):
    t = {"version": 1, "id": tid, "verifiers": {"version": "0.3.1.dev59", "commit": "a60a606e"},
         "task": {"type": "GSM8KTask", "data": {"question": "q-" + task_key}, "key": task_key, "hash": "h" + task_key},
         "agent": {"config": {"id": "null"}, "runtime": None, "name": agent, "trainable": True},
         "tools": [], "nodes": nodes, "calls": [], "request_rewrites": [], "response_rewrites": [],
         "rewards": rewards, "metrics": {}, "info": {}, "extra_usage": [], "is_completed": True, "ok": ok,
         "stop_condition": stop, "errors": errors or [],
         "timing": {"start": 1755800000.0, "boot": {"start": 0.0, "end": 0.0}, "setup": {"start": 0.0, "end": 0.0},
                    "agent": {"start": 0.0, "end": 0.0, "model": {"duration": 0.0}, "harness": {"duration": 0.0}},
                    "finalize": {"start": 0.0, "end": 0.0}, "scoring": {"start": 0.0, "end": 0.0}}}
    if run is not None:
        t = {**{k: t[k] for k in ("version", "id", "verifiers")}, "run": run, **{k: v for k, v in t.items() if k not in ("version", "id", "verifiers")}}
    return t


def single_turn(tid, key, answer_ids, logprobs, reward, adv=None, **kw):
    nodes = [node(None, "system", "Solve.", [1, 10, 11]), node(0, "user", "q-" + key, [12, 13, 14]),
             node(1, "assistant", "a", [15, *answer_ids], len(answer_ids), logprobs,
                  None if adv is None else [adv] * len(answer_ids))]
    return trace(tid, key, nodes, reward, **kw)


def tool_turns(tid, key, reward, adv):
    """Two sampled turns with a tool result between them (turn 2's scaffold carries a None log-prob)."""
    nodes = [node(None, "user", "q-" + key, [20, 21]),
             node(0, "assistant", "call", [15, 30, 31], 2, [-0.5, -0.25], [adv, adv]),
             node(1, "tool", "42", [40, 41, 42]),
             node(2, "assistant", "done", [15, 32, 33, 34], 3, [-0.125, None, -1.0], [adv, adv, adv])]
    return trace(tid, key, nodes, reward)


def branching(tid, key, reward):
    """A compaction branch: node 1 has two children, each a leaf (two training samples)."""
    nodes = [node(None, "user", "q-" + key, [50, 51]),
             node(0, "assistant", "x", [15, 52], 1, [-0.5]),
             node(1, "user", "go on", [53]),
             node(2, "assistant", "y", [15, 54, 55], 2, [-0.25, -0.75]),
             node(1, "user", "summarise", [56, 57]),
             node(4, "assistant", "z", [15, 58], 1, [-2.0])]
    return trace(tid, key, nodes, reward)


def r(score, weight=1.0):
    return {"score": score, "weight": weight}


def episode(eid, group, step, traces, ok=True, errors=None, policy=(2, 3)):
    return drop_none({"id": eid, "env": {"id": "gsm8k", "name": "gsm8k"}, "task": traces[0]["task"] if traces else
                      {"type": "GSM8KTask", "data": {"question": "q-e"}, "key": "e", "hash": "he"},
                      "group": {"id": group}, "ok": ok, "errors": errors or [],
                      "run": {"type": "train", "id": "run-1", "name": None,
                              "work": {"type": "train", "step": step, "policy": {"start": policy[0], "end": policy[1]}}},
                      "traces": traces})


def write(rel, rows):
    p = HERE / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text("".join(json.dumps(x, separators=(",", ":")) + "\n" for x in rows))


def main():
    step = 2
    eff = [episode("e0", "g0", step, [single_turn("t0", "k0", [60, 61, 62], [-0.1, -0.2, -0.3], {"correct": r(1.0)}, 0.5)]),
           episode("e1", "g0", step, [single_turn("t1", "k0", [63, 64], [-0.4, -0.5], {"correct": r(0.0)}, -0.5)]),
           episode("e2", "g1", step, [tool_turns("t2", "k1", {"correct": r(1.0), "format": r(0.5, 0.2)}, 0.25)]),
           episode("e3", "g1", step, [branching("t3", "k1", {"correct": r(0.0), "format": None})])]
    write("episode_v2026_08_21/rollouts/step_2/train/effective/traces.jsonl", eff)
    err = {"type": "SandboxError", "message": "sandbox died", "status_code": None, "traceback": "Traceback ..."}
    write("episode_v2026_08_21/rollouts/step_2/train/all/traces.jsonl",
          [*eff, episode("e4", "g2", step, [], ok=False, errors=[err]),
           episode("e5", "g2", step, [single_turn("t5", "k2", [65], [-0.7], {"correct": None}, ok=False, errors=[err],
                                                  stop="error")], ok=False, errors=[err])])
    run = {"type": "train", "id": "run-1", "name": None, "step": 1}
    write("trace_v2026_08_15/rollouts/step_1/train/effective/traces.jsonl",
          [single_turn("u0", "k0", [60, 61], [-0.1, -0.2], {"correct": r(1.0)}, run=run),
           single_turn("u1", "k0", [62], [-0.3], {"correct": r(0.0)}, run=run),
           single_turn("u2", "k1", [63, 64, 65], [-0.4, -0.5, -0.6], {"correct": r(1.0)}, run=run)])
    meta = [("train", "9b2c", 0, None), ("train", "9b2c", 0, None), ("eval", "77aa", 0, 0)]
    rows = []
    for i, ((kind, gid, pv, es), rew) in enumerate(zip(meta, (1.0, 0.0, 0.5))):
        t = single_turn(f"v{i}", f"k{i // 2}", [70 + i, 71], [-0.25, -0.5], {"correct": rew})
        for n in t["nodes"]:
            n.pop("advantages"), n.pop("reference_logprobs"), n.pop("loss_weights")  # added after 2026-07-09
        t["rewards"] = {"correct": rew}
        rows.append(t | {"kind": kind, "env_name": "gsm8k", "group_id": gid, "policy_version": pv, "eval_step": es})
    write("rollout_v2026_07_09/rollouts/step_0/train/effective/traces.jsonl", rows)
    stream()


def seekable_zstd(data, frame_bytes):
    """zstd's seekable format as prime-rl seals a chunk (pyzstd.SeekableZstdFile, written here with the
    zstandard package): independent frames of at most ``frame_bytes`` of content (a line may span two),
    then the seek table in a skippable frame (one entry per frame: compressed size, content size; no
    checksums), its footer: frame count, descriptor 0, magic 0x8F92EAB1."""
    import struct

    import zstandard

    frames = [zstandard.ZstdCompressor(level=3).compress(data[i:i + frame_bytes]) for i in range(0, len(data), frame_bytes)]
    table = b"".join(struct.pack("<II", len(f), min(frame_bytes, len(data) - i * frame_bytes)) for i, f in enumerate(frames))
    table += struct.pack("<IBI", len(frames), 0, 0x8F92EAB1)
    return b"".join(frames) + struct.pack("<II", 0x184D2A5E, len(table)) + table


def stream():
    """prime-rl >= 2026-09-02 (#3444 trace stream, #3465 chunks): every episode once, in arrival order, in
    monitors/file/traces/stream/<n>.jsonl chunks (a full chunk sealed as <n>.jsonl.zst, the live one
    plain), an index row per episode beside it (stream.index.jsonl), per-producer annotation streams
    (annotations/<producer>/<n>.jsonl + <producer>.index.jsonl), live deltas (live/<trace>.jsonl)."""
    base = HERE / "stream_v2026_09_02/monitors/file"
    eps = [episode("e0", "g0", 3, [single_turn("t0", "k0", [60, 61, 62], [-0.1, -0.2, -0.3], {"correct": r(1.0)})]),
           episode("e1", "g0", 3, [single_turn("t1", "k0", [63, 64], [-0.4, -0.5], {"correct": r(0.0)})]),
           episode("e2", "g1", 3, [tool_turns("t2", "k1", {"correct": r(1.0), "format": r(0.5, 0.2)}, None)]),
           episode("e3", "g1", 4, [branching("t3", "k1", {"correct": r(0.0), "format": None})], policy=(3, 4)),
           episode("e4", "g2", 4, [], ok=False, errors=[{"type": "SandboxError", "message": "sandbox died"}],
                   policy=(3, 4))]
    lines = [json.dumps(e, separators=(",", ":")).encode() + b"\n" for e in eps]
    (base / "traces/stream").mkdir(parents=True, exist_ok=True)
    (base / "traces/stream/00000.jsonl.zst").write_bytes(seekable_zstd(b"".join(lines[:3]), 700))
    (base / "traces/stream/00001.jsonl").write_bytes(b"".join(lines[3:]))
    index, offsets = [], {0: 0, 1: 0}
    for n, (e, line) in enumerate(zip(eps, lines), 1):
        chunk = 0 if n <= 3 else 1
        index.append({"line": n, "offset": offsets[chunk], "id": e["id"], "kind": "train",
                      "trace_ids": [t["id"] for t in e["traces"]], "env": "gsm8k", "group": e["group"]["id"],
                      "ok": e["ok"], "num_errors": len(e["errors"]), "reward": None, "advantage": None,
                      "input_tokens": 0, "output_tokens": 0, "turns": 1, "branches": 1, "stop_condition": "answered",
                      "truncated": False, "dispatch": None, "arrival": None, "duration": None, "cost": None,
                      "chunk": chunk})
        offsets[chunk] += len(line)
    write("stream_v2026_09_02/monitors/file/traces/stream.index.jsonl", index)
    ann = [{"version": 1, "trace_id": "t0", "info": {"advantage": 0.5}, "branches": [{"index": 0, "advantages": [None] * 7 + [0.5] * 3}]},
           {"version": 1, "trace_id": "t1", "info": {"advantage": -0.5}, "branches": [{"index": 0, "advantages": [None] * 7 + [-0.5] * 2}]}]
    write("stream_v2026_09_02/monitors/file/traces/annotations/orchestrator/00000.jsonl", ann)
    write("stream_v2026_09_02/monitors/file/traces/annotations/orchestrator.index.jsonl",
          [{"trace_id": a["trace_id"], "chunk": 0, "offset": 0, "info": a["info"]} for a in ann])
    write("stream_v2026_09_02/monitors/file/traces/live/t9.jsonl",
          [{"trace": "t9", "open": {"id": "t9"}, "dispatch": {"kind": "train", "env": "gsm8k", "step": 4}}])
    write("stream_v2026_09_02/monitors/file/metrics.jsonl", [{"step": 3, "time": 1756800000.0, "producer": "orchestrator",
                                                            "reward/mean": 0.5}])


if __name__ == "__main__":
    main()
