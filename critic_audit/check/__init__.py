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
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from critic_audit.check.checks import (
    CHECKS, STATUSES, CheckConfig, CheckOutcome, CheckReport, Example, REWARD_LAYOUTS, run_checks,
)
from critic_audit.check.data import CheckRollout, load_rollouts, rollouts_from_verl_batch

__all__ = ["CHECKS", "STATUSES", "REWARD_LAYOUTS", "CheckConfig", "CheckOutcome", "CheckReport", "CheckRollout",
           "Example", "check_rollouts", "check_verl_batch", "load_rollouts", "rollouts_from_verl_batch",
           "run_checks", "write_report"]


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

    Raises:
        InputError, SchemaError: unreadable input. CheckpointError: a bad tokenizer / policy folder.
        TemplateError: a chat template that cannot render the conversations.
    """
    from critic_audit.io.records import ReadReport
    from critic_audit.turns import TokenizeConfig

    tok = None
    tok_path = tokenizer if tokenizer is not None else policy
    if tok_path is not None:
        tok = _load_tokenizer(Path(tok_path), trust_remote_code)
    report = ReadReport()
    rollouts = load_rollouts(inputs, read_options=read_options, tokenizer=tok,
                             tokenize_config=TokenizeConfig(chat_template=chat_template), report=report)
    notes = []
    if report.skipped:
        notes.append(f"skipped {sum(report.skipped.values())} bad record(s): "
                     + ", ".join(f"{k}: {v}" for k, v in sorted(report.skipped.items())))
    if policy is not None:
        from critic_audit.check.policy import apply_policy

        notes.append(apply_policy(rollouts, policy, device=device, dtype=dtype, token_budget=token_budget,
                                  trust_remote_code=trust_remote_code))
    res = run_checks(rollouts, config, tokenizer=tok, chat_template=chat_template, notes=notes)
    res.config.update(inputs=[str(p) for p in inputs], formats=dict(report.formats),
                      tokenizer=None if tok_path is None else str(tok_path),
                      policy=None if policy is None else str(policy))
    return res


def _load_tokenizer(path: Path, trust_remote_code: bool) -> Any:
    """A tokenizer folder (``tokenizer.json`` / ``tokenizer_config.json``; no model config needed)."""
    from critic_audit.critic.load import quiet_transformers
    from critic_audit.errors import CheckpointError

    if not path.is_dir():
        raise CheckpointError("no such tokenizer folder", path=path, fix="pass a folder written by save_pretrained")
    from transformers import AutoTokenizer

    try:
        with quiet_transformers():
            return AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as e:
        raise CheckpointError(f"cannot load the tokenizer ({str(e).splitlines()[0]})", path=path,
                              fix="pass the folder the rollouts' tokenizer was saved to (tokenizer.save_pretrained)") from None


def check_verl_batch(batch: Any, config: CheckConfig | None = None) -> CheckReport:
    """Run the checks on one verl training batch (no tokenizer: the reward, mask, length, log-prob and
    group checks). ``batch``: a ``DataProto`` or dict of tensors (see
    :func:`critic_audit.check.rollouts_from_verl_batch`); ``report.metrics()`` gives the loggable
    figures."""
    return run_checks(rollouts_from_verl_batch(batch), config)


def write_report(report: CheckReport, path: str | Path) -> Path:
    """Write ``report`` as JSON to ``path`` atomically (a reader never sees half a file).

    Raises:
        InputError: the folder cannot be created or written.
    """
    from critic_audit.io.common import write_text_atomic

    return write_text_atomic(json.dumps(report.as_dict(), indent=2, default=str) + "\n", path)
