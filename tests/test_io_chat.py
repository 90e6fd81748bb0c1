"""Tests for critic_audit.io.chat: reading OpenAI chat-completions conversations."""

from __future__ import annotations

import dataclasses
import json
import statistics
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from critic_audit.errors import ConfigError, InputError
from critic_audit.io import ChatReadOptions, ReadReport, iter_chat, read_chat, write_chat_jsonl
from critic_audit.schema import Conversation

from conftest import SAMPLE

#: 20 of the 200 tau-bench airline trajectories and 40 of 465 FireAct runs (sample_data/SOURCE.md).
TAU = SAMPLE / "tau_bench_airline" / "gpt-4o-airline.sample20.json"
FIREACT = SAMPLE / "fireact_hotpotqa"

NO_REWARD = ChatReadOptions(require_reward=False)


def _write(path: Path, obj: Any) -> Path:
    path.write_text(json.dumps(obj), encoding="utf-8")
    return path


def _jsonl(path: Path, records: list[Any]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def _rec(reward: Any = 1.0, **extra: Any) -> dict[str, Any]:
    return {
        "messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "hello"},
        ],
        "reward": reward,
        **extra,
    }


def _error(path: Path, *parts: str, options: ChatReadOptions | None = None) -> str:
    """Read ``path``, expect an InputError, check it is one line naming the file and a fix."""
    with pytest.raises(InputError) as ei:
        read_chat(path, options)
    msg = str(ei.value)
    assert "\n" not in msg
    assert str(path) in msg
    assert "(fix: " in msg
    for part in parts:
        assert part in msg, (part, msg)
    return msg


# --------------------------------------------------------------------------------------------- real data


def _turn_stats(convs: list[Conversation]) -> tuple[int, float, int]:
    turns = [c.num_turns for c in convs]
    return min(turns), statistics.median(turns), max(turns)


def test_tau_bench_airline_loads_with_no_options():
    """Golden counts taken on the raw JSON (plain json.load, no reader): 20 records, 10 with reward 1,
    225 assistant messages of which 107 carry tool calls, 2 / 11 / 30 assistant messages min / median /
    max, 18 distinct task ids."""
    convs = read_chat(TAU)
    assert len(convs) == 20
    assert sum(c.success for c in convs) == 10
    assert all(c.reward in (0.0, 1.0) for c in convs)
    assistant = [m for c in convs for m in c.messages if m["role"] == "assistant"]
    calls = [m for m in assistant if m.get("tool_calls")]
    assert len(assistant) == 225
    assert len(calls) == 107
    assert _turn_stats(convs) == (2, 11, 30)
    # task_id -> group, the rest -> metadata
    assert len({c.group_id for c in convs}) == 18
    assert all(isinstance(c.group_id, str) for c in convs)
    c = convs[17]
    assert c.record == "gpt-4o-airline.sample20.json: record 17"
    assert c.trajectory_id == "gpt-4o-airline.sample20:17"
    assert c.source == "gpt-4o-airline.sample20"
    assert set(c.metadata) == {"info", "trial"}
    assert len({c.trajectory_id for c in convs}) == 20
    # every tool call has parsed arguments
    for m in calls:
        assert len(m["tool_calls"]) == 1
        assert isinstance(m["tool_calls"][0]["function"]["arguments"], dict)


def test_fireact_hotpotqa_loads_with_no_options():
    files = sorted(FIREACT.glob("*.json"))
    raw = json.loads(files[0].read_text())
    n_assistant = sorted(sum(m["role"] == "assistant" for m in r["traj"]) for r in raw.values())
    convs = [c for f in files for c in read_chat(f)]
    assert len(convs) == 40
    assert sum(c.success for c in convs) == 20
    assert _turn_stats(convs) == (n_assistant[0], statistics.median(n_assistant), n_assistant[-1])
    assert all(c.reward in (0.0, 1.0) for c in convs)
    assert all(c.success == (c.reward == 1.0) for c in convs)
    # keyed by question id: the key is the id; no group field
    assert all(c.trajectory_id.isdigit() for c in convs)
    assert all(c.group_id is None for c in convs)
    assert "traj" not in convs[0].metadata and "reward" not in convs[0].metadata
    assert {"em", "f1", "gt", "pred"} <= set(convs[0].metadata)
    # the directory reads the same
    assert [c.trajectory_id for c in read_chat(FIREACT)] == [c.trajectory_id for c in convs]


# --------------------------------------------------------------------------------------------- containers


def test_array_of_records(tmp_path):
    p = _write(tmp_path / "run.json", [_rec(1.0), _rec(0.0), _rec(0.25)])
    convs = read_chat(p)
    assert [c.trajectory_id for c in convs] == ["run:0", "run:1", "run:2"]
    assert [c.reward for c in convs] == [1.0, 0.0, 0.25]
    assert [c.success for c in convs] == [True, False, False]
    assert [c.record for c in convs] == [f"run.json: record {i}" for i in range(3)]
    assert all(c.source == "run" for c in convs)
    assert convs[0].messages == [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]


def test_object_keyed_by_id(tmp_path):
    p = _write(tmp_path / "k.json", {"q1": _rec(1), "q2": _rec(0, id="own-id"), "q3": [
        {"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]})
    convs = read_chat(p, NO_REWARD)
    assert [c.trajectory_id for c in convs] == ["q1", "own-id", "q3"]  # id field wins over the key
    assert convs[0].record == "k.json: record 0 (key 'q1')"
    assert convs[2].reward is None and convs[2].success is None


@pytest.mark.parametrize("name", ["r.jsonl", "r.ndjson", "r.json", "r.txt"])
def test_jsonl_by_extension_and_by_content(tmp_path, name):
    p = tmp_path / name
    p.write_text(json.dumps(_rec(1, id="a")) + "\n\n" + json.dumps(_rec(0, id="b")) + "\n", encoding="utf-8")
    convs = read_chat(p)
    assert [c.trajectory_id for c in convs] == ["a", "b"]
    assert convs[1].record == f"{name}: record 1 (line 3)"


def test_jsonl_with_line_separator_inside_a_string(tmp_path):
    p = tmp_path / "u.jsonl"
    recs = [_rec(1, id="a", note="x\u2028y"), _rec(0, id="b")]
    p.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in recs), encoding="utf-8")
    assert [c.metadata.get("note") for c in read_chat(p)] == ["x\u2028y", None]


def test_record_as_bare_list_of_messages(tmp_path):
    msgs = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
    p = _jsonl(tmp_path / "bare.jsonl", [msgs, msgs])
    convs = read_chat(p, NO_REWARD)
    assert [c.trajectory_id for c in convs] == ["bare:0", "bare:1"]
    assert convs[0].messages == msgs and convs[0].metadata == {}
    # a whole file that is one bare conversation
    one = _write(tmp_path / "one.json", msgs)
    [c] = read_chat(one, NO_REWARD)
    assert c.messages == msgs and c.trajectory_id == "one:0"


def test_single_record_object(tmp_path):
    p = _write(tmp_path / "single.json", _rec(1.0, id="only"))
    [c] = read_chat(p)
    assert c.trajectory_id == "only"


def test_directory_reads_json_files_sorted(tmp_path):
    d = tmp_path / "runs"
    d.mkdir()
    _jsonl(d / "b.jsonl", [_rec(0, id="b0")])
    _write(d / "a.json", [_rec(1, id="a0"), _rec(1, id="a1")])
    (d / "notes.txt").write_text("not read")
    (d / "sub").mkdir()
    _write(d / "sub" / "c.json", [_rec(1, id="c0")])  # folders are searched recursively
    _write(d / "config.json", {"lr": 0.1, "seed": 3})  # not a rollout file: skipped and counted
    rep = ReadReport()
    convs = read_chat(d, report=rep)
    assert [c.trajectory_id for c in convs] == ["a0", "a1", "b0", "c0"]
    assert [c.source for c in convs] == ["a", "a", "b", "c"]
    assert rep.skipped_files == {"not_rollout_file": 2}
    assert sorted(rep.skipped_file_examples["not_rollout_file"]) == [str(d / "config.json"), str(d / "notes.txt")]
    assert [c.source for c in read_chat(d, ChatReadOptions(source="mine"))] == ["mine"] * 4


def test_iter_chat_is_lazy_generator(tmp_path):
    p = _write(tmp_path / "g.json", [_rec(1), _rec(0)])
    it = iter_chat(p)
    assert next(it).trajectory_id == "g:0"
    assert [c.trajectory_id for c in it] == ["g:1"]


def test_empty_array_reads_as_nothing(tmp_path):
    assert read_chat(_write(tmp_path / "e.json", [])) == []


# --------------------------------------------------------------------------------------------- messages


def test_tool_call_arguments_are_parsed(tmp_path):
    msgs = [
        {"role": "developer", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "look "}, {"type": "image_url", "image_url": {}},
                                     {"type": "text", "text": "up"}]},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "search", "arguments": '{"q": "x", "n": 2}'}},
            {"id": "c2", "type": "function", "function": {"name": "noop", "arguments": "not json {"}},
            {"id": "c3", "function": {"name": "obj", "arguments": {"already": True}}},
            {"id": "c4", "type": "function", "function": {"name": "scalar", "arguments": "5"}},
        ]},
        {"role": "tool", "tool_call_id": "c1", "name": "search", "content": "result"},
        {"role": "function", "name": "noop", "content": "ok"},
        {"role": "assistant", "content": "", "function_call": {"name": "legacy", "arguments": '{"a": 1}'}},
        {"role": "assistant", "content": "done", "tool_calls": [], "refusal": None},
    ]
    [c] = read_chat(_write(tmp_path / "t.json", [{"messages": msgs, "reward": 1}]))
    m = c.messages
    assert m[0] == {"role": "system", "content": "be brief"}
    assert m[1] == {"role": "user", "content": "look up"}
    calls = m[2]["tool_calls"]
    assert m[2]["content"] is None
    assert calls[0] == {"id": "c1", "type": "function", "function": {"name": "search", "arguments": {"q": "x", "n": 2}}}
    assert calls[1]["function"]["arguments"] == "not json {"  # kept raw
    assert calls[2] == {"id": "c3", "type": "function", "function": {"name": "obj", "arguments": {"already": True}}}
    assert calls[3]["function"]["arguments"] == "5"  # parses, but not to an object: kept raw
    assert m[3] == {"role": "tool", "content": "result", "tool_call_id": "c1", "name": "search"}
    assert m[4] == {"role": "tool", "content": "ok", "name": "noop"}
    assert m[5]["tool_calls"] == [{"id": None, "type": "function", "function": {"name": "legacy", "arguments": {"a": 1}}}]
    assert m[6] == {"role": "assistant", "content": "done"}
    assert c.num_turns == 3


def test_no_assistant_turn_is_read(tmp_path):
    [c] = read_chat(_write(tmp_path / "n.json", [{"messages": [{"role": "user", "content": "hi"}], "reward": 0}]))
    assert c.num_turns == 0


# --------------------------------------------------------------------------------------------- fields


def test_reward_and_success_rules(tmp_path):
    p = _write(tmp_path / "r.json", [
        _rec(True),                       # bool reward -> 1.0, success True
        _rec(False, success=True),        # a success field wins over the bool
        _rec(0.7),                        # threshold 0.5
        _rec(0.2, resolved=True),         # auto success key
        _rec("0.9"),                      # numeric string
        {"messages": [], "score": 3},     # auto reward key
        _rec(None, success=False),        # (only readable without require_reward)
    ])
    convs = read_chat(p, NO_REWARD)
    assert [(c.reward, c.success) for c in convs] == [
        (1.0, True), (0.0, True), (0.7, True), (0.2, True), (0.9, True), (3.0, True), (None, False)]
    convs = read_chat(p, ChatReadOptions(success_threshold=0.8, require_reward=False))
    assert [c.success for c in convs][2:5] == [False, True, True]
    assert "resolved" not in convs[3].metadata


def test_explicit_keys_group_checkpoint_metadata(tmp_path):
    rec = {"dialog": [{"role": "user", "content": "q"}], "r": 2, "tid": 7, "prompt": 12, "step": 300,
           "task_id": "t", "extra": {"a": 1}}
    p = _write(tmp_path / "x.json", [rec])
    [c] = read_chat(p, ChatReadOptions(reward_key="r", id_key="tid", group_key="prompt"))
    assert (c.trajectory_id, c.reward, c.group_id, c.checkpoint) == ("7", 2.0, "12", "300")
    assert c.metadata == {"task_id": "t", "extra": {"a": 1}}
    [c] = read_chat(p, ChatReadOptions(reward_key="r", id_key="tid", checkpoint="ckpt-1"))
    assert c.checkpoint == "ckpt-1" and c.group_id == "t"
    assert c.metadata == {"prompt": 12, "extra": {"a": 1}}


def test_bad_options_are_config_errors():
    with pytest.raises(ConfigError):
        ChatReadOptions(success_threshold=float("nan"))
    with pytest.raises(ConfigError):
        ChatReadOptions(reward_key="")


# --------------------------------------------------------------------------------------------- bad input


def test_missing_file(tmp_path):
    _error(tmp_path / "nope.json", "no such file")


def test_directory_without_json_files(tmp_path):
    (tmp_path / "a.txt").write_text("x")
    _error(tmp_path, "the folder holds no rollout file (1 other file(s) skipped: a.txt (")


def test_empty_file(tmp_path):
    p = tmp_path / "e.json"
    p.write_text("  \n")
    _error(p, "empty")


@pytest.mark.parametrize("doc", [5, "text", None, True])
def test_top_level_scalar(tmp_path, doc):
    _error(_write(tmp_path / "s.json", doc), "unknown format", "top-level")


def test_records_without_messages_name_keys_and_suggest_messages_key(tmp_path):
    p = _write(tmp_path / "m.json", [{"steps": [], "reward": 1, "id": "a"}])
    msg = _error(p, "record 0 (id 'a')", "'steps'", "'reward'", "--messages-key")
    assert "no messages list" in msg
    p = _write(tmp_path / "obj.json", {"steps": [], "reward": 1})
    _error(p, "unknown format", "'steps'", "--messages-key")
    p = _write(tmp_path / "given.json", [_rec(1)])
    _error(p, "'turns'", "--messages-key", options=ChatReadOptions(messages_key="turns"))


def test_messages_field_not_a_list(tmp_path):
    # e.g. the FireAct llama files: ``traj`` is one flat string
    p = _write(tmp_path / "flat.json", {"6238": {"traj": "Thought: ...", "reward": True}})
    _error(p, "record 0 (key '6238')", "'traj'", "not a list")


def test_malformed_json_names_line_and_column(tmp_path):
    p = tmp_path / "bad.json"
    p.write_text('[\n  {"messages": [], "reward": 1},\n  {"messages": [,]}\n]')
    _error(p, "malformed JSON at line 3, column 17")


def test_malformed_jsonl_names_line(tmp_path):
    p = tmp_path / "bad.jsonl"
    p.write_text(json.dumps(_rec(1)) + "\n\n" + '{"messages": [}\n')
    _error(p, "record 1 (line 3)", "malformed JSON at line 3")


def test_truncated_jsonl_line_names_the_end_of_that_line(tmp_path):
    """A line cut off mid-record: the break is at the end of line 3, not at "line 3, column 1" (the
    position past the line break that json reports); with CRLF endings and without a final newline
    too. A break inside a line keeps its column within the line."""
    cut = '{"messages": [{"role": "user", "content": "hi"}'  # cut after a complete message
    for name, eol, last in (("lf.jsonl", "\n", "\n"), ("crlf.jsonl", "\r\n", "\r\n"), ("nofinal.jsonl", "\n", "")):
        p = tmp_path / name
        p.write_text(json.dumps(_rec(0)) + eol + json.dumps(_rec(1)) + eol + cut + last, newline="")
        msg = _error(p, "record 2 (line 3)", "malformed JSON at the end of line 3", "Expecting ',' delimiter")
        assert "column" not in msg
    p = tmp_path / "mid.jsonl"
    p.write_text(json.dumps(_rec(0)) + "\n" + '{"messages": [], oops}' + "\n")
    _error(p, "record 1 (line 2)", "malformed JSON at line 2, column 18: Expecting property name")
    p = tmp_path / "string.jsonl"  # an unterminated string: the column where it starts
    p.write_text('  {"id": "a", "messages": "cut\n')
    _error(p, "record 0 (line 1)", "malformed JSON at line 1, column 27: Unterminated string")


def test_truncated_json_file_names_the_end_of_its_last_line(tmp_path):
    p = tmp_path / "cut.json"
    p.write_text("[\n" + json.dumps(_rec(0)) + ",\n" + '{"messages": [{"role": "user"}' + "\n\n  \n")
    msg = _error(p, "malformed JSON at the end of line 3")
    assert "line 4" not in msg and "column" not in msg


def test_message_not_an_object(tmp_path):
    p = _write(tmp_path / "m.json", [_rec(1), {"id": "x", "messages": [{"role": "user", "content": "a"}, "oops"],
                                               "reward": 1}])
    _error(p, "record 1 (id 'x')", "message 1", "not an object")


def test_unknown_role(tmp_path):
    p = _write(tmp_path / "m.json", {"k": {"messages": [{"role": "narrator", "content": "a"}], "reward": 1}})
    _error(p, "record 0 (key 'k')", "message 0", "unknown role 'narrator'")


def test_missing_role(tmp_path):
    p = _write(tmp_path / "m.json", [{"messages": [{"content": "a"}], "reward": 1}])
    _error(p, "record 0", "message 0 has no role")


def test_missing_reward(tmp_path):
    p = _write(tmp_path / "m.json", [_rec(1), {"messages": [], "id": "r1"}])
    _error(p, "record 1 (id 'r1')", "missing reward", "--reward-key", "--no-reward")
    p = _write(tmp_path / "n.json", [_rec(None)])
    _error(p, "record 0", "missing reward", "'reward' is null")
    assert read_chat(p, NO_REWARD)[0].reward is None


def test_non_numeric_reward(tmp_path):
    _error(_write(tmp_path / "m.json", [_rec("yes")]), "record 0", "non-numeric", "'yes'")
    _error(_write(tmp_path / "l.json", [_rec([1])]), "record 0", "not a number")


def test_nan_reward(tmp_path):
    p = tmp_path / "nan.json"
    p.write_text('[{"messages": [], "reward": NaN}]')
    _error(p, "record 0", "NaN")
    p = tmp_path / "nan.jsonl"
    p.write_text('{"messages": [], "reward": "nan"}\n')
    _error(p, "record 0 (line 1)", "NaN")


def test_duplicate_ids(tmp_path):
    p = _write(tmp_path / "d.json", [_rec(1, id="a"), _rec(1, id="b"), _rec(0, id="a")])
    _error(p, "record 2 (id 'a')", "duplicate trajectory id 'a'", "record 0")
    d = tmp_path / "dir"
    d.mkdir()
    _write(d / "x.json", [_rec(1, id="a")])
    _write(d / "y.json", [_rec(0, id="a")])
    # an id found in two files (different rollouts) is qualified with each file's label; the file's own id is kept
    convs = read_chat(d)
    assert [c.trajectory_id for c in convs] == ["x/a", "y/a"]
    assert [c.metadata["id_in_file"] for c in convs] == ["a", "a"]


def test_bad_content_and_tool_calls(tmp_path):
    bad = [
        ({"role": "user", "content": 3}, "content is number"),
        ({"role": "user", "content": [{"type": "text", "text": 1}]}, "content part 0"),
        ({"role": "assistant", "tool_calls": {"id": 1}}, "tool_calls is object"),
        ({"role": "assistant", "tool_calls": [{"id": "c"}]}, "tool call 0"),
        ({"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": [1]}}]}, "arguments"),
    ]
    for i, (m, part) in enumerate(bad):
        _error(_write(tmp_path / f"b{i}.json", [{"messages": [m], "reward": 1}]), "message 0", part)


# --------------------------------------------------------------------------------------------- properties

_junk = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True), st.text(max_size=5),
                  st.lists(st.integers(), max_size=2), st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))
_role = st.one_of(st.sampled_from(["system", "user", "assistant", "tool", "developer", "function", "narrator"]), _junk)
_part = st.one_of(st.fixed_dictionaries({"type": st.sampled_from(["text", "image_url"]), "text": st.one_of(st.text(max_size=5), _junk)}), _junk)
_content = st.one_of(st.text(max_size=10), st.none(), st.lists(_part, max_size=3), _junk)
_call = st.one_of(
    st.fixed_dictionaries({"id": st.one_of(st.text(max_size=3), _junk), "type": st.one_of(st.just("function"), _junk),
                           "function": st.one_of(st.fixed_dictionaries({"name": st.one_of(st.text(max_size=5), _junk),
                                                                        "arguments": st.one_of(st.text(max_size=8), _junk)}), _junk)}),
    _junk)
_message = st.one_of(
    st.fixed_dictionaries({"role": _role, "content": _content},
                          optional={"tool_calls": st.one_of(st.lists(_call, max_size=2), _junk),
                                    "tool_call_id": _junk, "name": _junk, "function_call": _junk}),
    _junk)
_messages = st.one_of(st.lists(_message, max_size=4), _junk)
_record = st.one_of(
    st.fixed_dictionaries({}, optional={
        "messages": _messages, "traj": _messages, "reward": _junk, "score": _junk, "success": _junk,
        "id": _junk, "group_id": _junk, "step": _junk, "other": _junk}),
    st.lists(_message, max_size=3),
    _junk)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(records=st.lists(_record, max_size=4), shape=st.sampled_from(["array", "keyed", "jsonl", "single"]),
       require_reward=st.booleans())
def test_malformed_records_only_raise_input_error(tmp_path, records, shape, require_reward):
    if shape == "array":
        p, text = tmp_path / "f.json", json.dumps(records)
    elif shape == "keyed":
        p, text = tmp_path / "f.json", json.dumps({f"k{i}": r for i, r in enumerate(records)})
    elif shape == "jsonl":
        p, text = tmp_path / "f.jsonl", "".join(json.dumps(r) + "\n" for r in records)
    else:
        p, text = tmp_path / "f.json", json.dumps(records[0] if records else None)
    p.write_text(text, encoding="utf-8")
    try:
        convs = read_chat(p, ChatReadOptions(require_reward=require_reward))
    except InputError as e:
        assert "\n" not in str(e) and str(p) in str(e) and "(fix: " in str(e)
        return
    for c in convs:
        assert isinstance(c, Conversation)
        assert c.reward is None or isinstance(c.reward, float)
        assert all(m["role"] in ("system", "user", "assistant", "tool") for m in c.messages)
        assert all(m["content"] is None or isinstance(m["content"], str) for m in c.messages)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text(max_size=40), suffix=st.sampled_from([".json", ".jsonl"]))
def test_arbitrary_text_only_raises_input_error(tmp_path, text, suffix):
    p = tmp_path / f"t{suffix}"
    p.write_text(text, encoding="utf-8")
    try:
        read_chat(p, NO_REWARD)
    except InputError:
        pass


_json_leaf = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False, allow_infinity=False),
                       st.text(max_size=6))
_json = st.recursive(_json_leaf, lambda s: st.one_of(st.lists(s, max_size=3), st.dictionaries(st.text(max_size=4), s, max_size=3)),
                     max_leaves=6)
_opt_text = st.one_of(st.none(), st.text(max_size=6))


@st.composite
def _canonical_message(draw) -> dict[str, Any]:
    role = draw(st.sampled_from(["system", "user", "assistant", "tool"]))
    m: dict[str, Any] = {"role": role, "content": draw(_opt_text)}
    if role == "assistant" and draw(st.booleans()):
        m["tool_calls"] = draw(st.lists(st.fixed_dictionaries({
            "id": _opt_text,
            "type": st.just("function"),
            "function": st.fixed_dictionaries({
                "name": st.text(max_size=6),
                "arguments": st.one_of(st.dictionaries(st.text(max_size=4), _json, max_size=3),
                                       st.just("not json {"), st.just("")),
            }),
        }), min_size=1, max_size=2))
    if role == "tool":
        for k in ("tool_call_id", "name"):
            v = draw(_opt_text)
            if v is not None:
                m[k] = v
    elif draw(st.booleans()):
        m["name"] = draw(st.text(max_size=4))
    return m


@st.composite
def _conversation(draw, tid: str) -> Conversation:
    reward = draw(st.one_of(st.none(), st.floats(min_value=-1e100, max_value=1e100, allow_nan=False)))
    success = draw(st.booleans()) if reward is not None else draw(st.one_of(st.none(), st.booleans()))
    return Conversation(
        trajectory_id=tid,
        messages=draw(st.lists(_canonical_message(), max_size=5)),
        reward=reward,
        success=success,
        group_id=draw(_opt_text),
        checkpoint=draw(_opt_text),
        source="src",
        metadata=draw(st.dictionaries(
            st.text(max_size=8).filter(lambda k: k not in ("id", "messages", "reward", "success", "group_id", "checkpoint")),
            _json, max_size=3)),
    )


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), ids=st.lists(st.text(max_size=8), unique=True, max_size=5))
def test_jsonl_round_trip(tmp_path, data, ids):
    convs = [data.draw(_conversation(tid)) for tid in ids]
    p = write_chat_jsonl(convs, tmp_path / "rt.jsonl")
    back = read_chat(p, ChatReadOptions(require_reward=False, source="src"))
    strip = [dataclasses.replace(c, record="") for c in back]
    assert strip == convs
    assert [c.record for c in back] == [f"rt.jsonl: record {i} (line {i + 1})" for i in range(len(convs))]


def test_empty_jsonl_reads_as_nothing(tmp_path):
    p = tmp_path / "e.jsonl"
    p.write_text("\n")
    assert read_chat(p) == []


def test_unreadable_json_is_an_input_error(tmp_path):
    p = tmp_path / "deep.json"
    p.write_text("[" * 100_000 + "]" * 100_000)
    _error(p, "unreadable JSON")
    p = tmp_path / "big.jsonl"
    p.write_text('{"messages": [], "reward": ' + "9" * 5000 + "}\n")
    _error(p, "record 0 (line 1)", "unreadable JSON")
    p = tmp_path / "latin1.json"
    p.write_bytes(b'[{"messages": [], "reward": 1, "x": "\xe9"}]')
    _error(p, "not UTF-8")


def test_sharegpt_messages_are_read_and_an_unknown_speaker_is_named(tmp_path):
    p = _write(tmp_path / "sg.json", [{"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "hello"}],
                                       "reward": 1}])
    [c] = read_chat(p)
    assert c.messages == [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    p = _write(tmp_path / "sg2.json", [{"conversations": [{"from": "narrator", "value": "hi"}], "reward": 1}])
    _error(p, "record 0", "message 0 has the ShareGPT speaker 'narrator'", "ShareGPT speakers")
