"""Exceptions for user-facing errors.

Every error a user can cause is a :class:`CriticAuditError`. Its message is one line that names the
file, the record and the fix. The CLI prints it in red and exits 1 (2 for a :class:`UsageError`, as
for click's own usage errors) without a traceback; set
``CRITIC_AUDIT_DEBUG=1`` to see the traceback.
"""

from __future__ import annotations

from pathlib import Path


#: Temporary files that stand in for a user's file (a decompressed copy, a link given a suffix), by
#: path: messages name the user's file instead (:func:`show_path_as`).
_SHOWN_AS: dict[str, str] = {}


def show_path_as(stand_in: str | Path, shown: str | Path) -> None:
    """Name ``shown`` (the user's file, e.g. ``traces.jsonl.zst``) in every error whose path is
    ``stand_in`` (its decompressed copy in a temporary folder)."""
    _SHOWN_AS[str(stand_in)] = str(shown)


def shown_path(path: str | Path) -> str:
    """``path`` as messages name it: the user's file for a stand-in (:func:`show_path_as`), else itself."""
    return _SHOWN_AS.get(str(path), str(path))


class CriticAuditError(Exception):
    """Base class of every error the CLI reports as one clean line."""

    def __init__(
        self,
        problem: str,
        *,
        path: str | Path | None = None,
        record: str | int | None = None,
        fix: str | None = None,
    ) -> None:
        self.problem = problem
        self.path = None if path is None else str(path)
        self.record = record
        self.fix = fix
        super().__init__(self._format())

    def _format(self) -> str:
        where = ""
        if self.path is not None:
            where = shown_path(self.path)
        if self.record is not None:
            where = f"{where}: record {self.record}" if where else f"record {self.record}"
        msg = f"{where}: {self.problem}" if where else self.problem
        if self.fix:
            msg = f"{msg} (fix: {self.fix})"
        return msg


class InputError(CriticAuditError):
    """Rollout input that cannot be read: missing file, unknown format, malformed record."""


class SchemaError(CriticAuditError):
    """A table that does not match its canonical schema (missing column, wrong dtype, bad key)."""


class TemplateError(CriticAuditError):
    """A tokenizer or chat template that cannot render the conversations as needed."""


class CheckpointError(CriticAuditError):
    """A critic checkpoint folder that cannot be loaded as a value model."""


class ConfigError(CriticAuditError):
    """An option or config value outside its allowed range."""


class UsageError(ConfigError):
    """An option value the command refuses before reading any input (out of range, an unknown choice,
    options that exclude each other): a usage error, so the CLI exits 2 as click does for an unknown
    option, with the same one line."""


class TrainingError(CriticAuditError):
    """A training run that cannot go on: an update that made the weights non-finite (NaN / inf)."""


class ScoringError(CriticAuditError):
    """A scoring worker that failed, died or loaded another critic (distributed scoring)."""
