"""Read OpenAI Responses API rollouts (as NeMo Gym writes them) into :class:`Conversation` records.

A record holds the request's input (``responses_create_params.input``, or a top-level ``input``: a
string or a list of input items), the ordered output items (``response.output`` or a top-level
``output``) and a top-level reward. Items are mapped to chat messages:

* each contiguous run of **model items** (``reasoning``, assistant ``message``, ``function_call``)
  between environment items becomes ONE assistant message: reasoning text (``reasoning="text"``; left
  out with ``"drop"``), then the message text, with the function calls as ``tool_calls``;
* ``function_call_output`` -> a ``tool`` message (``tool_call_id`` = ``call_id``);
* input messages of role user / system / developer -> those messages (``instructions`` -> a first
  system message).

Item types with no text for the critic (``web_search_call``, ``image_generation_call``, ...) are
dropped and listed in the metadata field ``dropped_item_types``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from critic_audit.io.chat import ChatReadOptions, _Ctx, _message, _short, _type_name
from critic_audit.io.common import (
    IdRegistry, InputOptions, ReadReport, error, files_of, guarded, iter_json_records, record_fields,
)
from critic_audit.schema import Conversation

__all__ = ["iter_responses", "read_responses", "is_responses_record", "items_to_messages"]

#: Fields of a record holding the request / the response (not repeated in the metadata).
_REQUEST_KEYS = ("responses_create_params", "input", "instructions")
_RESPONSE_KEYS = ("response", "output")
_SUFFIXES = (".json", ".jsonl", ".ndjson")
_MODEL_TYPES = ("reasoning", "function_call")


def is_responses_record(rec: Any) -> bool:
    """A record in the Responses layout (used by format detection)."""
    if not isinstance(rec, Mapping):
        return False
    if isinstance(rec.get("responses_create_params"), Mapping):
        return True
    resp = rec.get("response")
    if isinstance(resp, Mapping) and isinstance(resp.get("output"), list):
        return True
    out = rec.get("output")
    return isinstance(out, list) and bool(out) and all(isinstance(x, Mapping) and "type" in x for x in out)


def _text_parts(value: Any, where: str, ctx: _Ctx, keys: tuple[str, ...] = ("text",)) -> str:
    """Join the text of a list of parts (``{"type": ..., "text": ...}``) or a string."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        out = []
        for i, part in enumerate(value):
            if isinstance(part, str):
                out.append(part)
            elif isinstance(part, Mapping):
                text = next((part[k] for k in keys if k in part), None)
                if text is None:
                    continue  # an image, a refusal without text, ...
                if not isinstance(text, str):
                    raise error(ctx, "bad_item", f"{where}: part {i} has text of type {_type_name(text)}",
                                'write text parts as {"type": "output_text", "text": "..."}')
                out.append(text)
            else:
                raise error(ctx, "bad_item", f"{where}: part {i} is {_type_name(part)} {_short(part)}",
                            "write content as a string or a list of text parts")
        return "".join(out)
    raise error(ctx, "bad_item", f"{where}: content is {_type_name(value)} {_short(value)}",
                "write content as a string or a list of text parts")


class _Turn:
    """An assistant turn being assembled from contiguous model items."""

    def __init__(self) -> None:
        self.reasoning: list[str] = []
        self.texts: list[str] = []
        self.calls: list[dict[str, Any]] = []

    def empty(self) -> bool:
        return not (self.reasoning or self.texts or self.calls)

    def message(self, reasoning: str) -> dict[str, Any]:
        parts = []
        if reasoning == "text" and any(r.strip() for r in self.reasoning):
            parts.append("\n".join(r for r in self.reasoning if r.strip()))
        if self.texts:
            parts.append("\n".join(self.texts))
        msg: dict[str, Any] = {"role": "assistant", "content": "\n\n".join(parts) if parts else None}
        if self.calls:
            msg["tool_calls"] = self.calls
        return msg


def items_to_messages(items: list[Any], ctx: _Ctx, *, reasoning: str = "text", where: str = "item",
                      dropped: list[str] | None = None) -> list[dict[str, Any]]:
    """Map Responses input/output items to chat messages (see the module docstring)."""
    messages: list[dict[str, Any]] = []
    turn = _Turn()

    def flush() -> None:
        nonlocal turn
        if not turn.empty():
            messages.append(turn.message(reasoning))
            turn = _Turn()

    for i, item in enumerate(items):
        w = f"{where} {i}"
        if isinstance(item, str):  # a bare string in an input list: a user message
            flush()
            messages.append({"role": "user", "content": item})
            continue
        if not isinstance(item, Mapping):
            raise error(ctx, "bad_item", f"{w} is {_type_name(item)} {_short(item)}, not an object",
                        'write items as {"type": "message" | "function_call" | ..., ...}')
        itype = item.get("type")
        role = item.get("role")
        if itype is None and role is not None:
            itype = "message"
        if not isinstance(itype, str):
            raise error(ctx, "bad_item", f"{w} has no type (keys {sorted(map(str, item))[:8]})",
                        'give every item a "type" (message, reasoning, function_call, function_call_output)')
        if itype == "message":
            if role is None:
                role = "assistant"
            if not isinstance(role, str):
                raise error(ctx, "bad_item", f"{w}: role is {_type_name(role)} {_short(role)}",
                            "use the roles user, system, developer or assistant")
            text = _text_parts(item.get("content"), w, ctx)
            if role.strip().lower() == "assistant":
                if text:
                    turn.texts.append(text)
                elif turn.empty():
                    turn.texts.append("")
                continue
            flush()
            messages.append(_message({"role": role, "content": text}, i, ctx))
        elif itype == "reasoning":
            summary = _text_parts(item.get("summary"), w + " summary", ctx)
            content = _text_parts(item.get("content"), w + " content", ctx)
            turn.reasoning.append(summary or content)
        elif itype == "function_call":
            name = item.get("name")
            if not isinstance(name, str) or not name:
                raise error(ctx, "bad_item", f"{w}: function_call without a name", "give every function_call a name")
            args = item.get("arguments")
            call = _message({"role": "assistant", "content": None, "tool_calls": [{
                "id": item.get("call_id", item.get("id")), "type": "function",
                "function": {"name": name, "arguments": args}}]}, i, ctx)["tool_calls"][0]
            turn.calls.append(call)
        elif itype == "function_call_output":
            flush()
            out = item.get("output")
            if isinstance(out, (list, str)) or out is None:
                text = _text_parts(out, w + " output", ctx)
            elif isinstance(out, (Mapping, int, float, bool)):
                text = json.dumps(out, ensure_ascii=False)
            else:  # pragma: no cover - JSON holds nothing else
                text = str(out)
            msg = {"role": "tool", "content": text}
            cid = item.get("call_id")
            if cid is not None:
                msg["tool_call_id"] = cid
            messages.append(_message(msg, i, ctx))
        else:
            if dropped is not None:
                dropped.append(itype)
    flush()
    return messages


def _input_items(record: Mapping[str, Any], ctx: _Ctx) -> tuple[list[Any], str | None]:
    params = record.get("responses_create_params")
    src: Mapping[str, Any] = params if isinstance(params, Mapping) else record
    if params is not None and not isinstance(params, Mapping):
        raise error(ctx, "bad_request", f"responses_create_params is {_type_name(params)}, not an object",
                    'write "responses_create_params": {"input": [...]}')
    inp = src.get("input", record.get("input"))
    instructions = src.get("instructions", record.get("instructions"))
    if instructions is not None and not isinstance(instructions, str):
        raise error(ctx, "bad_request", f"instructions is {_type_name(instructions)}, not a string",
                    "write instructions as a string")
    if inp is None:
        items: list[Any] = []
    elif isinstance(inp, str):
        items = [{"type": "message", "role": "user", "content": inp}]
    elif isinstance(inp, list):
        items = inp
    else:
        raise error(ctx, "bad_request", f"input is {_type_name(inp)} {_short(inp)}, not a string or a list",
                    "write the request input as a string or a list of input items")
    return items, instructions


def _output_items(record: Mapping[str, Any], ctx: _Ctx) -> list[Any]:
    resp = record.get("response")
    if resp is not None:
        if not isinstance(resp, Mapping):
            raise error(ctx, "bad_response", f"response is {_type_name(resp)} {_short(resp)}, not an object",
                        'write "response": {"output": [...]}')
        out = resp.get("output")
    else:
        out = record.get("output")
    if not isinstance(out, list):
        raise error(ctx, "no_output", f"no output item list (response.output / output is {_type_name(out)})",
                    'write the model output as "response": {"output": [...]} (or --format for another format)')
    return out


def _conversation(raw: Any, ctx: _Ctx, opts: ChatReadOptions, iopts: InputOptions, source: str) -> Conversation:
    if not isinstance(raw, Mapping):
        raise error(ctx, "not_an_object", f"record is {_type_name(raw)} {_short(raw)}, not an object",
                    'write each record as {"responses_create_params": {...}, "response": {...}, "reward": ...}')
    f = record_fields(raw, ctx, opts, iopts, extra_group_keys=("task_index",))
    items, instructions = _input_items(raw, ctx)
    dropped: list[str] = []
    msgs = []
    if instructions:
        msgs.append({"role": "system", "content": instructions})
    msgs += items_to_messages(items, ctx, reasoning=iopts.reasoning, where="input item", dropped=dropped)
    msgs += items_to_messages(_output_items(raw, ctx), ctx, reasoning=iopts.reasoning, where="output item",
                              dropped=dropped)
    meta = {str(k): v for k, v in raw.items() if k not in f.used and k not in (*_REQUEST_KEYS, *_RESPONSE_KEYS)}
    resp = raw.get("response")
    if isinstance(resp, Mapping):
        for k in ("id", "model", "usage"):
            if k in resp and f"response_{k}" not in meta:
                meta[f"response_{k}"] = resp[k]
    if dropped:
        meta["dropped_item_types"] = sorted(set(dropped))
    return Conversation(trajectory_id=f.trajectory_id, messages=msgs, reward=f.reward, success=f.success,
                        group_id=f.group_id, checkpoint=f.checkpoint, source=source, metadata=meta,
                        record=f"{ctx.path.name}: record {ctx.label(with_id=False)}")


def iter_responses(
    path: str | Path,
    options: ChatReadOptions | None = None,
    input_options: InputOptions | None = None,
    report: ReadReport | None = None,
) -> Iterator[Conversation]:
    """Yield the conversations of a Responses rollout file (JSON / JSONL, JSONL streamed) or directory.

    Raises:
        InputError: a bad record (strict mode), or a file that cannot be read at all.
    """
    opts = options or ChatReadOptions()
    iopts = input_options or InputOptions()
    ids = IdRegistry()
    for file in files_of(Path(path), _SUFFIXES, "Responses rollout"):
        source = opts.source if opts.source is not None else file.stem
        for raw, ctx in iter_json_records(file, is_responses_record, "Responses", iopts.lenient, report):
            def convert(raw: Any = raw, ctx: _Ctx = ctx) -> Conversation:
                conv = _conversation(raw, ctx, opts, iopts, source)
                ids.check(conv.trajectory_id, ctx)
                return conv

            conv = guarded(convert, iopts.lenient, report)
            if conv is not None:
                yield conv


def read_responses(path: str | Path, options: ChatReadOptions | None = None,
                   input_options: InputOptions | None = None, report: ReadReport | None = None) -> list[Conversation]:
    """Read every conversation of a Responses rollout file or directory (see :func:`iter_responses`)."""
    return list(iter_responses(path, options, input_options, report))
