"""The format registry: every input format, its sniff rule, its file suffixes and its reader.

Detection (:func:`critic_audit.io.detect.detect_file`), dispatch (:func:`critic_audit.io.detect.read_file`),
the CLI's ``--format`` choices and its help text all derive from :data:`FORMATS`; adding a reader is
one :func:`register` call here plus its module. Light on purpose (no reader is imported until used),
so that the CLI can build its help without loading polars.

A reader module provides:

* ``sniff_record(record, options) -> bool``: the first record of a JSON / JSONL file is this format's;
* optionally ``sniff_file(path, head, options) -> bool``: the file is this format's from its name or its
  first 20,000 characters (``head``; "" for a binary file), without parsing it;
* ``read_file(spec, options, report)``: conversation formats yield
  :class:`critic_audit.schema.Conversation` records of the file ``spec.path``; table formats return
  ``(trajectories, tokens)`` canonical tables of the input ``spec.path`` (file or folder);
* optionally ``collection_of(path, root) -> str | None``: the collection (``source``) of a file of a format
  that holds one rollout per file (SWE-agent runs, Harbor jobs, tau2 ``dir``-layout runs); None (or no
  such function): the file-name rule applies. Groups are numbered per collection (``GROUPS_SPAN_FILES``,
  default True where ``collection_of`` is defined), else per file;
* optionally ``is_companion_file(path) -> bool``: a file that belongs to this format's rollout files
  without being one (a Harbor trial's ``verifier/reward.txt``, a vf-eval run's ``metadata.json``): read
  with them, so a folder search neither reads it nor counts it as stray;
* optionally ``file_kind(path, options) -> str``: ``tables`` or ``conversations`` for one file, when a
  format can be either (ATIF files with token ids are read as tokens).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType

__all__ = ["Format", "FORMATS", "FORMAT_CHOICES", "register", "format_help", "get_format"]


@dataclass(frozen=True)
class Format:
    """One input format.

    Attributes:
        name: the ``--format`` name.
        kind: ``conversations`` (messages, tokenized with the critic's chat template) or ``tables``
            (token ids already: canonical tables).
        summary: one line for the ``--format`` help and ``docs/input_formats.md``.
        suffixes: file name endings this format reads (lower case); a folder search reads only these.
        module: the reader module (see the module docstring for what it defines).
        selectable: offered as a ``--format`` choice (False: detected only).
        fallback: a generic layout, not one producer's (OpenAI chat ``messages``): it claims a file only
            when no producer-specific format does (a mini-swe-agent trajectory or a tau-bench results
            file also holds ``messages`` / ``traj`` lists, and is read by its producer's reader).
        overrides: formats whose rule also accepts this format's files by design, that this one wins
            over (token-id rows of verifiers are read by ``tokenized``). Any other pair of formats that
            both claim a file makes it ambiguous: refused in one line naming them and ``--format``
            (:func:`critic_audit.io.detect.detect_file`).
    """

    name: str
    kind: str
    summary: str
    suffixes: tuple[str, ...]
    module: str
    selectable: bool = True
    fallback: bool = False
    overrides: tuple[str, ...] = ()

    def reader(self) -> ModuleType:
        """The reader module (imported on first use, then kept: a folder search asks every format's
        hooks of every file)."""
        mod = _READERS.get(self.module)
        if mod is None:
            mod = _READERS[self.module] = importlib.import_module(self.module)
        return mod


#: The reader modules imported so far, by module name.
_READERS: dict[str, ModuleType] = {}


#: Every format, in detection order (the first whose sniff rule accepts a file reads it).
FORMATS: dict[str, Format] = {}


def register(fmt: Format) -> Format:
    """Add ``fmt`` to :data:`FORMATS` (a name may be registered once)."""
    if fmt.name in FORMATS or fmt.name in ("auto", "mixed"):
        raise ValueError(f"input format {fmt.name!r} is registered already")
    if fmt.kind not in ("conversations", "tables"):
        raise ValueError(f"format kind must be conversations or tables, got {fmt.kind!r}")
    FORMATS[fmt.name] = fmt
    return fmt


_JSON = (".json", ".jsonl", ".ndjson")

register(Format("tables", "tables", "canonical tables: a folder with tokens.parquet (+ trajectories.parquet), a "
                "tokens Parquet file, or a verl dump folder (step_*.tokens.parquet)", (".parquet",),
                "critic_audit.io.tables", selectable=False))
register(Format("tokenized", "tables", "token-id rows (verl-style input_ids + response_mask, verifiers "
                "prompt_ids + completion_ids steps)", (".parquet", *_JSON), "critic_audit.io.tokenized",
                overrides=("verifiers",)))
register(Format("prime_tokens", "tables", "prime-rl trainer token exports (token_exports/step_<s>/rank_<r>.jsonl, "
                "schema v1: token_ids, loss_mask, advantages, inference + trainer log-probs; also saved as a JSON array / object)",
                _JSON,
                "critic_audit.io.prime_tokens"))
register(Format("vf_traces", "tables", "verifiers v1 traces.jsonl (prime-rl rollouts/step_<N>/<kind>/<subset>/, vf-eval "
                "v1 runs: Episode / Trace records with token-level message-graph nodes)", _JSON,
                "critic_audit.io.vf_traces"))
register(Format("atif", "conversations", "ATIF trajectories (Harbor RFC 0001, v1.0-1.8; exact tokens when "
                "steps carry token ids)", (".json",), "critic_audit.io.atif"))
register(Format("openhands", "conversations", "OpenHands evaluation output.jsonl (EvalOutput rows: history event "
                "stream, test_result labels) and saved event-stream trajectories", _JSON, "critic_audit.io.openhands"))
register(Format("swe", "conversations", "SWE-agent / mini-swe-agent trajectories (*.traj, *.traj.json; several in "
                "a JSON array or JSONL)", (".traj", ".traj.json", *_JSON), "critic_audit.io.swe"))
register(Format("inspect", "conversations", "Inspect AI eval logs (.json EvalLog, .eval zip: samples/<id>_epoch_<n>.json; "
                "reward from scores, C/I/P/N grades as 1/0/0.5/0)", (".json", ".eval"), "critic_audit.io.inspect_log"))
register(Format("tau2", "conversations", "tau2-bench results (tau2 run: Results JSON with simulations, or a "
                "dir-layout simulations/<id>.json)", (".json",), "critic_audit.io.tau2"))
register(Format("taubench", "conversations", "tau-bench (v1) results (run.py: a JSON array of EnvRunResult "
                "{task_id, reward, info, traj, trial})", (".json",), "critic_audit.io.taubench"))
register(Format("verl_rollouts", "conversations", "verl trainer.rollout_data_dir JSONL (<step>.jsonl rows: decoded "
                "input / output text, score, step; turns recovered from the template's remnants, re-rendered)", _JSON,
                "critic_audit.io.verl_rollouts"))
register(Format("areal", "conversations", "AReaL trajectory dumps (rollout/<version>/<task_id>.jsonl: prompt / completion "
                "text, segments prompt / gen / context, head / tail version, version_rle)", _JSON, "critic_audit.io.areal"))
register(Format("verifiers", "conversations", "verifiers / vf-eval results (prompt + completion message lists, "
                "example_id groups; also TRL / datasets conversational rows)", _JSON, "critic_audit.io.verifiers"))
register(Format("responses", "conversations", "OpenAI Responses records, NeMo Gym rollouts", _JSON,
                "critic_audit.io.responses"))
register(Format("react", "conversations", "ReAct transcripts (a string field, Reflexion .txt / .log logs)",
                (*_JSON, ".txt", ".log"), "critic_audit.io.react"))
register(Format("chat", "conversations", "OpenAI chat-completions records (messages lists)", _JSON,
                "critic_audit.io.chat", fallback=True))

#: ``--format`` values: ``auto`` (detect per file) and every selectable format.
FORMAT_CHOICES = ("auto", *(f.name for f in FORMATS.values() if f.selectable))


def get_format(name: str) -> Format:
    """The registered format ``name`` (KeyError for an unknown one)."""
    return FORMATS[name]


def format_help() -> str:
    """The ``--format`` help text: every choice with its one-line summary."""
    parts = [f"{f.name} ({f.summary})" for f in FORMATS.values() if f.selectable]
    return "Input format: auto (detected per file; folders searched recursively), " + "; ".join(parts) + "."
