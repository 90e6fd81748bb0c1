"""Score token sequences with a critic: per-token values with the t-1 convention.

``values[t] = head(h[t-1])`` for ``t >= 1`` and ``values[0] = nan``: the value of token ``t`` is read at
position ``t-1``, i.e. ``V_t`` is the value of the state *before* token ``t`` was generated (the
convention of verl, TRL and OpenRLHF, which take ``values[:, :-1]`` aligned with the actions).

Since ``h[t-1]`` only depends on tokens ``0..t-1`` (causal attention), the last token of each sequence
is never fed to the backbone.

Throughput: sequences are sorted by length (longest first) and packed greedily into batches whose padded
size ``rows x max length`` stays within ``token_budget`` (a single longer sequence runs alone), with
right padding. Right padding never changes the hidden states of real tokens under
causal attention, so values do not depend on batch composition; for that reason the padding mask is
not even passed by default (``attention_mask=False``), which keeps SDPA on its fused causal kernel.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import torch

from critic_audit.critic.load import Critic
from critic_audit.errors import ConfigError

Progress = Callable[[int, int], None]


@contextlib.contextmanager
def torch_threads(n: int | None) -> Iterator[None]:
    """``torch.set_num_threads(n)`` for the block, the previous count after (nothing when None).

    CPU kernels (oneDNN) round differently at another thread count, so bit-identical values across
    runs need the same threads."""
    if n is None:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def plan_batches(lengths: Sequence[int], token_budget: int) -> list[list[int]]:
    """Group indices into batches: sorted by length, longest first, ``rows x max_len <= token_budget``.

    Zero-length entries are left out. A single sequence longer than the budget forms its own batch.
    """
    if token_budget < 1:
        raise ConfigError(f"token_budget must be >= 1, got {token_budget}")
    order = sorted((i for i, n in enumerate(lengths) if n > 0), key=lambda i: (-lengths[i], i))
    batches: list[list[int]] = []
    current: list[int] = []
    width = 0
    for i in order:
        n = lengths[i]
        if current and (len(current) + 1) * max(width, n) > token_budget:
            batches.append(current)
            current, width = [], 0
        current.append(i)
        width = max(width, n)
    if current:
        batches.append(current)
    return batches


def hidden_states(
    critic_or_backbone: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor | None
) -> torch.Tensor:
    """Backbone forward -> ``last_hidden_state`` [rows, cols, hidden] (backbone dtype)."""
    backbone = critic_or_backbone.backbone if isinstance(critic_or_backbone, Critic) else critic_or_backbone
    out = backbone(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
    return out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]


def iter_hidden_batches(
    backbone: torch.nn.Module,
    device: torch.device,
    sequences: Sequence[np.ndarray],
    *,
    token_budget: int,
    pad_id: int = 0,
    stats: dict | None = None,
    progress: Progress | None = None,
    attention_mask: bool = False,
):
    """Yield ``(indices, hidden, lengths)`` for batches of ``seq[:-1]`` (the positions whose hidden
    state defines a value). ``hidden`` is float32 [rows, cols, hidden] on ``device``; ``lengths[r]`` is
    the number of real positions of row ``r`` (``len(seq) - 1``). Fills ``stats`` (see
    :func:`score_values`).
    """
    fed = [max(len(s) - 1, 0) for s in sequences]
    batches = plan_batches(fed, token_budget)
    total = sum(fed)
    done = 0
    computed = 0
    shapes: list[tuple[int, int]] = []
    t0 = time.perf_counter()
    if progress:
        progress(0, total)
    for idx in batches:
        cols = max(fed[i] for i in idx)
        ids = torch.full((len(idx), cols), pad_id, dtype=torch.long)
        mask = torch.zeros((len(idx), cols), dtype=torch.long)
        for r, i in enumerate(idx):
            n = fed[i]
            ids[r, :n] = torch.from_numpy(np.array(sequences[i][:n], dtype=np.int64))  # a copy: inputs may be read-only
            mask[r, :n] = 1
        ids = ids.to(device)
        # Right padding + causal attention: real positions never see the pads, so the mask is not
        # needed for them. Passing it makes SDPA materialise a [rows, 1, cols, cols] mask and leave its
        # fused causal kernel (2-4x slower on CPU); without it, padded rows compute garbage we never read.
        h = hidden_states(backbone, ids, mask.to(device) if attention_mask else None).float()
        shapes.append((len(idx), cols))
        computed += len(idx) * cols
        n_real = sum(fed[i] for i in idx)
        done += n_real
        yield idx, h, [fed[i] for i in idx]
        if progress:
            progress(done, total)
    if stats is not None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        seconds = time.perf_counter() - t0
        stats.update(
            n_sequences=len(sequences),
            n_batches=len(batches),
            batch_shapes=shapes,
            real_tokens=total,
            computed_tokens=computed,
            padding_efficiency=(total / computed) if computed else 1.0,
            seconds=seconds,
            tokens_per_s=(total / seconds) if seconds > 0 else math.inf,
        )


def _validate(sequences: Sequence[np.ndarray], max_length: int, vocab: int | None) -> list[np.ndarray]:
    out = []
    for i, s in enumerate(sequences):
        a = np.asarray(s)
        if a.ndim != 1:
            raise ConfigError(f"sequence {i} has shape {a.shape}; expected a 1-D array of token ids")
        if a.size and not np.issubdtype(a.dtype, np.integer):
            raise ConfigError(f"sequence {i} has dtype {a.dtype}; expected integer token ids")
        if len(a) > max_length:
            raise ConfigError(
                f"sequence {i} has {len(a)} tokens, more than the critic's context of {max_length}",
                fix="truncate sequences to the critic's max_length before scoring",
            )
        if a.size and (a.min() < 0 or (vocab is not None and a.max() >= vocab)):
            raise ConfigError(
                f"sequence {i} has token ids outside [0, {vocab})", fix="tokenize with the critic's tokenizer"
            )
        out.append(a)
    return out


def score_values(
    critic: Critic,
    sequences: Sequence[np.ndarray],
    *,
    token_budget: int = 16384,
    progress: Progress | None = None,
    stats: dict | None = None,
    attention_mask: bool = False,
) -> list[np.ndarray]:
    """Per-token critic values for each token-id sequence, in input order.

    Args:
        critic: from :func:`critic_audit.critic.load_critic`.
        sequences: 1-D integer arrays of token ids (each at most ``critic.max_length`` long).
        token_budget: cap on a batch's padded size ``rows x max length`` (a longer single sequence
            runs alone). Lower it if memory runs out; on CPU 4096-16384 is a good range.
        progress: optional ``progress(done_tokens, total_tokens)`` called after each batch.
        stats: optional dict filled with ``n_sequences``, ``n_batches``, ``batch_shapes`` (list of
            ``(rows, cols)``), ``real_tokens`` and ``computed_tokens`` (fed positions, i.e. ``len - 1``
            per sequence, and padded positions), ``padding_efficiency`` (real / computed),
            ``seconds`` and ``tokens_per_s`` (real fed tokens per second).
        attention_mask: pass the padding mask to the backbone. Not needed for causal decoders with
            right padding (the values are the same, see the batch-independence test) and 2-4x slower
            on CPU for padded batches, so off by default; turn it on for a backbone that is not causal.

    Returns:
        float32 arrays of the same lengths: ``values[0] = nan``, ``values[t] = head(h[t-1])``.

    Raises:
        ConfigError: a sequence longer than ``critic.max_length``, not 1-D integer, with ids out of
            the vocabulary, or ``token_budget < 1``.
    """
    vocab = _vocab_size(critic)
    seqs = _validate(sequences, critic.max_length, vocab)
    results = [np.full(len(s), np.nan, dtype=np.float32) for s in seqs]
    pad_id = getattr(critic.tokenizer, "pad_token_id", None) or 0
    w = critic.head.weight.detach().float().reshape(-1)
    b = critic.head.bias.detach().float().reshape(()) if critic.head.bias is not None else 0.0
    with torch.inference_mode():
        for idx, h, lens in iter_hidden_batches(
            critic.backbone,
            critic.device,
            seqs,
            token_budget=token_budget,
            pad_id=pad_id,
            stats=stats,
            progress=progress,
            attention_mask=attention_mask,
        ):
            v = (h @ w + b).cpu().numpy()  # float32 [rows, cols]
            for r, i in enumerate(idx):
                results[i][1:] = v[r, : lens[r]]
    return results


def _vocab_size(critic: Critic) -> int | None:
    try:
        emb = critic.backbone.get_input_embeddings()
        return int(emb.num_embeddings)
    except (AttributeError, NotImplementedError):
        return None
