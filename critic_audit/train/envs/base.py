"""The multi-turn environment protocol and how environments are found by name.

An environment is one episode's state machine over chat messages::

    env = Env(**kwargs)
    observation = env.reset(seed)                  # list of messages: [{"role": "system"|"user", "content": str}, ...]
    observation, reward, done = env.step(text)     # text: the assistant's turn (decoded, without end-of-turn)
                                                   # observation: messages after it ("user" or "tool" roles)

``step`` may also return a fourth item, an ``info`` dict; ``info["success"]`` (bool) overrides the
trainer's success rule (return >= ``algo.success_threshold``). Optional attributes:

- ``turn_token_limit(turn: int) -> int | None``: sample at most this many tokens in assistant turn k
  (the trainer also caps it at ``env.max_new_tokens``);
- ``tokenizer() -> PreTrainedTokenizerBase``: the tokenizer a ``tiny`` policy uses (a small-vocabulary
  environment brings its own); environments without one need a loaded model.

A fresh instance is built for every episode, so an environment may keep per-episode state freely.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

from critic_audit.errors import ConfigError

__all__ = ["Environment", "StepResult", "builtin_environments", "resolve_environment"]

Message = dict[str, Any]
StepResult = tuple[list[Message], float, bool]


@runtime_checkable
class Environment(Protocol):
    """A multi-turn environment (see the module docstring)."""

    def reset(self, seed: int) -> list[Message]: ...

    def step(self, assistant_text: str) -> tuple[Any, ...]: ...


def builtin_environments() -> dict[str, str]:
    """Built-in names -> ``module:Class``."""
    return {
        "credit": "critic_audit.train.envs.credit:CreditAssignmentEnv",
        "hotpotqa": "critic_audit.train.envs.search:HotpotQASearchEnv",
    }


def resolve_environment(name: str) -> Callable[..., Environment]:
    """The environment class (or factory) for ``name``: a built-in name or ``module:Class``.

    Raises:
        ConfigError: unknown name, module not importable, no such attribute, or no reset/step.
    """
    target = builtin_environments().get(name, name)
    if ":" not in target:
        raise ConfigError(f"unknown environment {name!r}",
                          fix=f"use {', '.join(builtin_environments())} or module:Class")
    module_name, _, attr = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ConfigError(f"cannot import environment module {module_name!r} ({e})",
                          fix="check the name and that the module is on PYTHONPATH") from None
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ConfigError(f"module {module_name!r} has no attribute {attr!r}", fix="check the class name")
        obj = getattr(obj, part)
    if not callable(obj) or (isinstance(obj, type) and not (hasattr(obj, "reset") and hasattr(obj, "step"))):
        raise ConfigError(f"{target} is not an environment (needs reset(seed) and step(text))")
    return obj
