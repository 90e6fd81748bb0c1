"""Input readers: rollout files -> :class:`critic_audit.schema.Conversation` records.

Only :mod:`critic_audit.schema` and :mod:`critic_audit.errors` are imported from here (layering:
``io -> schema, errors``).
"""

from critic_audit.io.chat import ChatReadOptions, iter_chat, read_chat, write_chat_jsonl

__all__ = ["ChatReadOptions", "iter_chat", "read_chat", "write_chat_jsonl"]
