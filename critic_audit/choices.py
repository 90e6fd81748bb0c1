"""The command line's choices: one ``enum.StrEnum`` per choice option, and how a bad value is refused.

:data:`CHOICES` maps each option (by parameter name) to its Enum and to a ``reject(value)`` that raises
the library's own error for a value outside it (so a bad choice, refused while the command line is
parsed, reads exactly as when the library refused it, exit 1). Library code: no typer or rich; each
Enum holds the values its library module accepts (tests/test_cli.py checks them).
"""

from __future__ import annotations

import enum
from collections.abc import Callable

from critic_audit.algorithms import ALGORITHM_NAMES
from critic_audit.errors import UsageError
from critic_audit.io.formats import FORMAT_CHOICES

__all__ = ["CHOICES", "Scope", "Overlong", "Dtype", "Backend", "RequestAssistant", "TokenIds", "RewardLayout",
           "Weighting", "FitMethod", "Reference", "Engine", "InputFormat", "Algo"]


class Scope(enum.StrEnum):
    """``analyze --scope`` (:data:`critic_audit.analysis.audit.SCOPES`)."""
    ASSISTANT = "assistant"
    ALL = "all"


class Overlong(enum.StrEnum):
    """``--overlong`` (:data:`critic_audit.turns.OVERLONG_POLICIES`)."""
    TRUNCATE = "truncate"
    DROP = "drop"


class Dtype(enum.StrEnum):
    """``--dtype`` (the names :func:`critic_audit.critic.load.resolve_dtype` reads)."""
    AUTO = "auto"
    FLOAT32 = "float32"
    BFLOAT16 = "bfloat16"
    FLOAT16 = "float16"
    FP32 = "fp32"
    BF16 = "bf16"
    FP16 = "fp16"


class Backend(enum.StrEnum):
    """``analyze --backend`` (:class:`critic_audit.critic.ScoringConfig`)."""
    PROCESSES = "processes"
    RAY = "ray"


class RequestAssistant(enum.StrEnum):
    """``--request-assistant`` (:data:`critic_audit.io.records.REQUEST_ASSISTANT_MODES`)."""
    CONTEXT = "context"
    POLICY = "policy"


class TokenIds(enum.StrEnum):
    """``--token-ids`` (:data:`critic_audit.io.records.TOKEN_ID_MODES`)."""
    AUTO = "auto"
    TEXT = "text"
    TRUST = "trust"


class RewardLayout(enum.StrEnum):
    """``check --reward-layout`` (:data:`critic_audit.check.core.REWARD_LAYOUTS`)."""
    TURN = "turn"
    OUTCOME = "outcome"
    TOKEN = "token"


class Weighting(enum.StrEnum):
    """``fit-critic --weighting`` (:data:`critic_audit.critic.fit.WEIGHTINGS`)."""
    TRAJECTORY = "trajectory"
    TOKEN = "token"


class FitMethod(enum.StrEnum):
    """``fit-critic --method`` (:data:`critic_audit.critic.train.METHODS`)."""
    HEAD = "head"
    LAYERS = "layers"
    LORA = "lora"


class Reference(enum.StrEnum):
    """``monitor --reference`` (:data:`critic_audit.analysis.monitor.REFERENCES`)."""
    PREVIOUS = "previous"
    RUNNING_MEAN = "running_mean"


class Engine(enum.StrEnum):
    """``train --engine``."""
    BUILTIN = "builtin"
    VERL = "verl"


#: ``--format``: ``auto`` and every selectable format of the registry (:mod:`critic_audit.io.formats`).
InputFormat = enum.StrEnum("InputFormat", {name.upper(): name for name in FORMAT_CHOICES})
#: ``train --algo``: every row of :data:`critic_audit.algorithms.ALGORITHM_SPECS`.
Algo = enum.StrEnum("Algo", {name.upper(): name for name in ALGORITHM_NAMES})


def _reject_algo(value: str) -> None:
    from critic_audit.train.config import AlgoConfig

    AlgoConfig(name=value)


def _reject_engine(value: str) -> None:
    raise UsageError(f"unknown engine {value!r}", fix="use --engine builtin or --engine verl")


def _reject_dtype(value: str) -> None:
    from critic_audit.critic.load import resolve_dtype

    resolve_dtype(value)


def _reject_weighting(value: str) -> None:
    from critic_audit.critic.fit import WEIGHTINGS

    raise UsageError(f"--weighting must be one of {', '.join(WEIGHTINGS)}, got {value!r}",
                     fix="use --weighting trajectory (each trajectory counts once) or token")


def _reject_method(value: str) -> None:
    from critic_audit.critic.train import METHODS

    raise UsageError(f"--method must be one of {', '.join(METHODS)}, got {value!r}",
                     fix="use --method head (ridge head, fast), layers or lora (docs/critics.md)")


def _reject_backend(value: str) -> None:
    from critic_audit.critic.options import ScoringConfig

    ScoringConfig(backend=value)


def _reject_read(field: str) -> Callable[[str], None]:
    def reject(value: str) -> None:
        from critic_audit.io.records import ReadOptions

        ReadOptions(**{field: value})
    return reject


def _reject_scope(value: str) -> None:
    from critic_audit.analysis.audit import AuditConfig

    AuditConfig(scope=value)


def _reject_overlong(value: str) -> None:
    from critic_audit.turns import TokenizeConfig

    TokenizeConfig(overlong=value)


def _reject_layout(value: str) -> None:
    from critic_audit.check import CheckConfig

    CheckConfig(reward_layout=value)


def _reject_reference(value: str) -> None:
    from critic_audit.analysis.monitor import MonitorConfig

    MonitorConfig(reference=value)


#: Every choice option, by parameter name: its Enum (the option's type: typer lists the values in
#: ``--help`` and refuses another while parsing) and how a bad value is refused: the library's own check,
#: so that the line and its fix are the library's, exit 1 (``critic_audit.cli``). The command
#: receives the value as a plain ``str``.
CHOICES: dict[str, tuple[type[enum.StrEnum], Callable[[str], None]]] = {
    "scope": (Scope, _reject_scope),
    "overlong": (Overlong, _reject_overlong),
    "dtype": (Dtype, _reject_dtype),
    "backend": (Backend, _reject_backend),
    "input_format": (InputFormat, _reject_read("format")),
    "request_assistant": (RequestAssistant, _reject_read("request_assistant")),
    "token_ids": (TokenIds, _reject_read("token_ids")),
    "reward_layout": (RewardLayout, _reject_layout),
    "weighting": (Weighting, _reject_weighting),
    "method": (FitMethod, _reject_method),
    "reference": (Reference, _reject_reference),
    "engine": (Engine, _reject_engine),
    "algo": (Algo, _reject_algo),
}
