"""``critic-audit check``: the credit-assignment bugs the field keeps hitting, found in logged rollouts
alone (no critic): rewards on masked tokens, dropped turn rewards, groups without signal, returns
reset at tool spans, masks off the chat template's turn tokens, empty / over-long / truncated turns,
re-tokenization drift, sampler vs trainer log-prob mismatch and collapsing importance weights, and
turn-count / turn-length imbalance. See ``docs/check.md``.

Library only (no typer / rich); the CLI's ``check`` command and the verl plugin call
:func:`check_rollouts` / :func:`check_verl_batch`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from critic_audit.check.checks import (
    CHECKS, STATUSES, CheckConfig, CheckOutcome, CheckReport, Example, REWARD_LAYOUTS, run_checks,
)
from critic_audit.check.data import CheckRollout, load_rollouts, rollouts_from_verl_batch

__all__ = ["CHECKS", "STATUSES", "REWARD_LAYOUTS", "CheckConfig", "CheckOutcome", "CheckReport", "CheckRollout",
           "Example", "check_rollouts", "check_verl_batch", "load_rollouts", "rollouts_from_verl_batch",
           "check_report_path", "run_checks", "write_report"]


def check_rollouts(
    inputs: Sequence[str | Path],
    config: CheckConfig | None = None,
    *,
    read_options: Any = None,
    tokenizer: str | Path | None = None,
    chat_template: str | None = None,
    policy: str | Path | None = None,
    device: str = "auto",
    dtype: str = "auto",
    token_budget: int = 16384,
    trust_remote_code: bool = False,
    allow_pickle: bool = False,
) -> CheckReport:
    """Read ``inputs`` (every format ``analyze`` reads) and run every check.

    Args:
        inputs: rollout files or folders.
        config: :class:`CheckConfig`.
        read_options: :class:`critic_audit.io.records.ReadOptions` (format, keys, lenient; default: a
            reward is not required).
        tokenizer: a folder with the tokenizer (and chat template) the rollouts were made with; the
            policy's when ``policy`` is given and this is not.
        chat_template: a Jinja template replacing the tokenizer's.
        policy: a causal-LM checkpoint: the trainer-side log-probs are recomputed with it.
        device, dtype, token_budget, trust_remote_code: how the policy runs.
        allow_pickle: read pickle policy weights (``pytorch_model.bin``) with
            ``torch.load(weights_only=True)`` (the CLI's ``--allow-pickle``); refused otherwise.

    Raises:
        InputError, SchemaError: unreadable input, or no rollout to check. CheckpointError: a bad tokenizer / policy folder
            (pickle-only weights without ``allow_pickle``: refused before the input is read).
        ConfigError: a policy that lacks weights (they would be randomly initialised), or whose
            vocabulary or context does not fit the rollouts.
        TemplateError: a chat template that cannot render the conversations.
    """
    from critic_audit.io.records import ReadReport
    from critic_audit.turns import TokenizeConfig

    if policy is not None and not allow_pickle:  # before reading the input, not after
        from critic_audit.critic.checkpoint import refuse_pickle_only

        refuse_pickle_only(Path(policy))
    tok = None
    tok_path = tokenizer if tokenizer is not None else policy
    if tok_path is not None:
        tok = _load_tokenizer(Path(tok_path), trust_remote_code)
    report = ReadReport()
    tcfg = TokenizeConfig(chat_template=chat_template, keep_template_system=True)
    rollouts = load_rollouts(inputs, read_options=read_options, tokenizer=tok, tokenize_config=tcfg, report=report)
    rollouts, reward_note = _rewards_as_analyze(rollouts, report, read_options, inputs)
    if not rollouts:  # a gate that passes on nothing would pass on a broken export
        from critic_audit.errors import InputError

        skipped = sum(report.skipped.values()) if report.skipped else 0
        raise InputError("no rollouts to check in the input" + (f" ({skipped} bad record(s) skipped)" if skipped else ""),
                         path=inputs[0] if len(inputs) == 1 else None,
                         fix="pass a file with at least one record" + (" (drop --lenient to see the first bad "
                                                                        "record)" if skipped else ""))
    notes = _skip_notes(report) + ([reward_note] if reward_note else [])
    if policy is not None:
        from critic_audit.check.policy import apply_policy

        notes.append(apply_policy(rollouts, policy, device=device, dtype=dtype, token_budget=token_budget,
                                  trust_remote_code=trust_remote_code, allow_pickle=allow_pickle))
    res = run_checks(rollouts, config, tokenizer=tok, chat_template=chat_template, notes=notes)
    res.config.update(inputs=[str(p) for p in inputs], formats=dict(report.formats),
                      tokenizer=None if tok_path is None else str(tok_path),
                      policy=None if policy is None else str(policy))
    res.input = {**report.as_dict(), "rows_read": dict(report.rows_read)}
    return res


def _where(r: Any) -> str:
    """A rollout as an error names it: its file and record (conversations), else its collection and id."""
    return r.source if ": record" in r.source else f"{r.collection or 'input'}: trajectory {r.trajectory_id!r}"


def _rewards_as_analyze(rollouts: list[Any], report: Any, ropts: Any, inputs: Sequence[Any]) -> tuple[list[Any], str]:
    """Hold the rewards to ``analyze``'s rule (review 2 #6); ``rollouts`` were read without requiring one.
    ``--reward-key`` that no rollout has is an error. Within one collection (a file, or the folder
    that tells files apart; ``--source``: all of them) some rollouts with a reward and others without
    (no field, or null) is one error line naming the first such record and the field looked for, or
    with ``--lenient`` those rollouts are skipped and counted in ``report`` (``missing_reward``). A
    collection with no reward at all (a format that carries none, e.g. prime-rl's token exports since
    2026-06-27) is kept, with a note: the reward checks read the other rollouts.

    Returns:
        (rollouts kept, note: '' or a line for the report's notes).

    Raises:
        InputError: ``--reward-key`` that no record has; a rollout without a reward beside rewarded
            ones of its collection (strict mode).
    """
    from collections import Counter

    from critic_audit.errors import InputError
    from critic_audit.io.records import REWARD_KEYS, ReadOptions

    ropts = ropts or ReadOptions(require_reward=False)
    has = [r.reward is not None or r.token_rewards is not None for r in rollouts]
    n, have = len(rollouts), sum(has)
    if have == n:
        return rollouts, ""
    key = ropts.reward_key
    wanted = repr(key) if key else f"any of {list(REWARD_KEYS)}"
    if key is not None and not have:
        raise InputError(f"missing reward: none of the {n} rollouts has a field {key!r} (or it is null in every one)",
                         path=inputs[0] if len(inputs) == 1 else None,
                         fix=f"--reward-key {key} names a field no record has: name the field that holds the "
                             f"reward, or drop --reward-key to look for any of {list(REWARD_KEYS)}")
    per, got = Counter(r.collection for r in rollouts), Counter(r.collection for r, h in zip(rollouts, has) if h)
    mixed = [not h and got[r.collection] > 0 for r, h in zip(rollouts, has)]
    nm = sum(mixed)
    for r, m in zip(rollouts, mixed):
        if not m:
            continue
        err = InputError(f"{_where(r)}: missing reward: no non-null field {wanted}, while "
                         f"{got[r.collection]} of the {per[r.collection]} rollouts of {r.collection!r} have one",
                         fix="give every record a numeric reward, name the field that holds it with --reward-key, or "
                             "pass --lenient to skip (and count) the records without one")
        err.reason = "missing_reward"  # type: ignore[attr-defined]
        if not ropts.lenient:
            raise err
        report.skip(err)
    kept = [r for r, m in zip(rollouts, mixed) if not m]
    if nm:
        report.records_read = len(kept)
    none = n - have - nm
    notes = ([f"{nm} of {n} rollouts have no reward beside rewarded ones of their file: skipped (--lenient)"]
             if nm else [])
    if none:
        cols = sorted({str(r.collection) for r, h, m in zip(rollouts, has, mixed) if not h and not m})
        notes.append(f"{none} of {n} rollouts carry no reward (no field {wanted}; "
                     f"{', '.join(cols[:3])}{' ...' if len(cols) > 3 else ''}): the reward checks read the other "
                     f"{n - none - nm}")
    return kept, "; ".join(notes)


def _skip_notes(report: Any) -> list[str]:
    """Notes on what the readers passed over: bad records (lenient mode) and files that hold no
    rollouts, with the first example of each reason."""
    notes = []
    if report.skipped:
        first = next(iter(report.examples.values()), "")
        notes.append(f"skipped {sum(report.skipped.values())} bad record(s): "
                     + ", ".join(f"{k}: {v}" for k, v in sorted(report.skipped.items()))
                     + (f" (e.g. {first})" if first else ""))
    if report.skipped_files:
        examples = [p for ps in report.skipped_file_examples.values() for p in ps][:3]
        notes.append(f"skipped {sum(report.skipped_files.values())} file(s) not read as rollouts: "
                     + ", ".join(f"{k}: {v}" for k, v in sorted(report.skipped_files.items()))
                     + (f" (e.g. {', '.join(examples)})" if examples else ""))
    return notes


def _load_tokenizer(path: Path, trust_remote_code: bool) -> Any:
    """A tokenizer folder (``tokenizer.json`` / ``tokenizer_config.json``; no model config needed)."""
    from critic_audit.critic.load import quiet_transformers
    from critic_audit.errors import CheckpointError

    if not path.is_dir():
        raise CheckpointError("no such tokenizer folder", path=path, fix="pass a folder written by save_pretrained")
    from transformers import AutoTokenizer

    try:
        with quiet_transformers():
            # the exact text of the ids: transformers' space clean-up is for WordPiece (it warns on each BPE
            # decode when the saved config asks for it, and leaves the text as it is)
            return AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code,
                                                 clean_up_tokenization_spaces=False)
    except (OSError, ValueError) as e:
        raise CheckpointError(f"cannot load the tokenizer ({str(e).splitlines()[0]})", path=path,
                              fix="pass the folder the rollouts' tokenizer was saved to (tokenizer.save_pretrained)") from None


def check_verl_batch(batch: Any, config: CheckConfig | None = None) -> CheckReport:
    """Run the checks on one verl training batch (no tokenizer: the reward, mask, length, log-prob and
    group checks). ``batch``: a ``DataProto`` or dict of tensors (see
    :func:`critic_audit.check.rollouts_from_verl_batch`); ``report.metrics()`` gives the loggable
    figures."""
    return run_checks(rollouts_from_verl_batch(batch), config)


def _is_check_report(path: Path) -> bool:
    """``path`` holds a JSON report this command wrote (its ``tool`` field, or the report's own keys in
    one written before the field existed)."""
    from critic_audit.check.core import REPORT_TOOL

    try:
        with open(path, "rb") as fh:
            doc = json.loads(fh.read(64 << 20))
    except (OSError, ValueError):
        return False
    if not isinstance(doc, dict):
        return False
    return doc.get("tool") == REPORT_TOOL or (
        "tool" not in doc and {"status", "n_trajectories", "checks_by_status", "checks", "config"} <= doc.keys())


def check_report_path(path: str | Path, *, overwrite: bool = False, option: str = "--out") -> Path:
    """``path`` resolved, or a clean refusal: the report is one file, and a file ``check`` did not
    write is never replaced unless ``overwrite``.

    Raises:
        ConfigError: an empty path, ``.``, ``/``, the home or current folder (or a parent of them), a
            symlink loop, an existing folder, a path that cannot be created (its parent is a file or
            not writable), or an existing file that is not a check report (without ``overwrite``).
    """
    from critic_audit.errors import ConfigError
    from critic_audit.outputs import check_out_path, check_writable

    raw = str(path)
    if raw.strip() == ".":  # (an empty path: check_out_path's "is empty")
        raise ConfigError(f"{option} {raw!r} is not a file name",
                          fix=f"pass the report's file, e.g. {option} check.json")
    if os.path.isdir(os.path.expanduser(raw)):  # before check_out_path, whose lines speak of folders
        raise ConfigError(f"{option} {raw} is a folder; the report is one JSON file",
                          fix=f"pass a file name, e.g. {option} {Path(raw) / 'check.json'}")
    p = check_out_path(raw, option=option, example="check.json")
    check_writable(p, option=option)  # before the run: a parent that is a file, a read-only folder
    if p.exists() and not overwrite and not _is_check_report(p):
        raise ConfigError(f"{option} {raw} exists and is not a report critic-audit check wrote; it is left alone",
                          fix="pass another file name, or --overwrite to replace it")
    return p


def write_report(report: CheckReport, path: str | Path, *, overwrite: bool = False) -> Path:
    """Write ``report`` as JSON to ``path`` atomically (a reader never sees half a file). An existing
    file is replaced only when it is a previous check report (its ``tool`` field) or ``overwrite``.

    Raises:
        ConfigError: a path :func:`check_report_path` refuses, or a folder that cannot be written.
    """
    from critic_audit.errors import ConfigError
    from critic_audit.outputs import atomic_write_text

    p = check_report_path(path, overwrite=overwrite)
    try:
        return atomic_write_text(p, json.dumps(report.as_dict(), indent=2, default=str) + "\n")
    except OSError as e:
        raise ConfigError(f"cannot write the report ({e.strerror or e})", path=p,
                          fix="choose a writable path") from None
