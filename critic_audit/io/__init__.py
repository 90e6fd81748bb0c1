"""Input readers: rollout files -> :class:`critic_audit.schema.Conversation` records (chat, responses,
react, swe) or canonical tables (tokenized rows, verl dumps); :mod:`critic_audit.io.detect` picks one.

Only :mod:`critic_audit.schema` and :mod:`critic_audit.errors` are imported from here (layering:
``io -> schema, errors``).
"""

from critic_audit.io.chat import ChatReadOptions, iter_chat, read_chat, write_chat_jsonl
from critic_audit.io.common import FORMATS, InputOptions, ReadReport, success_of
from critic_audit.io.detect import detect_format, iter_conversations
from critic_audit.io.react import iter_react, parse_reflexion_log, read_react, split_transcript
from critic_audit.io.responses import iter_responses, read_responses
from critic_audit.io.swe import Labels, iter_swe, load_labels, read_swe
from critic_audit.io.tokenized import iter_tokenized, read_tokenized, sequences_to_tables
from critic_audit.io.verl_dump import dump_verl_batch

__all__ = [
    "ChatReadOptions", "iter_chat", "read_chat", "write_chat_jsonl",
    "FORMATS", "InputOptions", "ReadReport", "success_of",
    "detect_format", "iter_conversations",
    "iter_react", "parse_reflexion_log", "read_react", "split_transcript",
    "iter_responses", "read_responses",
    "Labels", "iter_swe", "load_labels", "read_swe",
    "iter_tokenized", "read_tokenized", "sequences_to_tables",
    "dump_verl_batch",
]
