"""Analytic FLOP counts of scoring plans: what each strategy costs, and the bound of any exact method.

Model (a decoder of ``L`` layers, hidden ``H``, ``n_q`` query heads and ``n_kv`` key/value heads of
``d`` dims, a gated MLP of width ``I``: Llama, Qwen2, SmolLM2, Mistral); one multiply-add = 2 FLOP:

- **linear** FLOP per position fed (pads included, they go through every layer):
  ``2 L (2 H n_q d + 2 H n_kv d + 3 H I) + 2 H`` (q/o, k/v projections, gate/up/down, the value head).
  Norms, rotary embeddings, activations and the embedding lookup are left out (O(H) per position).
- **attention** FLOP per query-key pair a kernel computes: ``4 L n_q d`` (``Q K^T`` and ``P V`` for
  every query head; grouped KV heads save memory, not FLOP). Softmax and masking are left out.

Which pairs a kernel computes (``kernel``):

- ``"cpu-sdpa"``: PyTorch's CPU flash-attention kernel (``aten/src/ATen/native/cpu/FlashAttentionKernel.cpp``)
  as transformers calls it. Queries go in blocks of ``q_split`` rows (256 when the query length is
  >= 768, 64 when >= 192, else 32), keys in blocks of 512. With ``is_causal`` (no mask: transformers
  passes it when the query and key lengths are equal and no padding mask is given, i.e. a whole
  sequence, or right-padded rows) a query block starting at ``m`` computes the key blocks that start
  below ``min(m + q_block, kv)``, each whole (``min(512, kv - n)`` keys): the upper triangle is skipped
  block-wise, the diagonal blocks are computed in full. With a mask (a continuation over a cached
  prefix, where the query is shorter than the keys; the block-diagonal mask of a packed row; the
  padding mask) every pair of the ``q x kv`` rectangle is computed, masked or not.
- ``"exact"``: only the pairs causal attention needs: a position at absolute index ``p`` attends to
  ``p + 1`` keys (a kernel that skips every masked pair, e.g. variable-length flash-attention on CUDA,
  up to its block size). Pads cost nothing.

:func:`exact_bound` is the least any exact method can compute: every distinct position of the
sequences' radix tree fed once (shared prefixes of any length) and the causal pairs only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from critic_audit.critic.infer import ScoreBatch, Strategy, plan_scoring
from critic_audit.errors import ConfigError

KERNELS = ("cpu-sdpa", "exact")
KV_SPLIT = 512


@dataclass(frozen=True)
class FlopModel:
    """The shape of a decoder backbone, for FLOP counts (see the module docstring)."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int

    @classmethod
    def from_config(cls, config: Any) -> FlopModel:
        """From a transformers config (or its config.json dict; ``text_config`` is followed).

        Raises:
            ConfigError: a field the model needs is missing.
        """
        get = config.get if isinstance(config, dict) else (lambda k, d=None: getattr(config, k, d))
        if get("text_config") is not None:
            return cls.from_config(get("text_config"))
        try:
            hidden, heads = int(get("hidden_size")), int(get("num_attention_heads"))
            return cls(layers=int(get("num_hidden_layers")), hidden=hidden, heads=heads,
                       kv_heads=int(get("num_key_value_heads") or heads),
                       head_dim=int(get("head_dim") or hidden // heads), intermediate=int(get("intermediate_size")))
        except TypeError as e:
            raise ConfigError("the backbone's config lacks a field the FLOP model needs (hidden_size, "
                              "num_attention_heads, num_hidden_layers, intermediate_size)") from e

    @property
    def linear_per_position(self) -> int:
        """FLOP of the linear layers (and the value head) for one position fed."""
        h, d = self.hidden, self.head_dim
        per_layer = 2 * h * self.heads * d + 2 * h * self.kv_heads * d + 3 * h * self.intermediate
        return 2 * self.layers * per_layer + 2 * h

    @property
    def attention_per_pair(self) -> int:
        """FLOP of attention for one query-key pair, over all layers and query heads."""
        return 4 * self.layers * self.heads * self.head_dim


def q_split(q_len: int) -> int:
    """The query block of PyTorch's CPU flash-attention kernel for a query of ``q_len`` rows."""
    return 256 if q_len >= 768 else 64 if q_len >= 192 else 32


def pairs(q_len: int, kv_len: int, *, causal: bool, kernel: str = "cpu-sdpa") -> int:
    """Query-key pairs computed by one attention call of one row: ``q_len`` queries that are the last
    ``q_len`` of ``kv_len`` positions (``kv_len - q_len`` cached before them).

    ``causal``: the call runs with ``is_causal`` (``q_len == kv_len``, no mask); otherwise a mask is
    passed and the CPU kernel computes the whole rectangle. Under ``"exact"`` both give the causal
    pairs ``sum_p (p + 1)`` over the query positions ``p``.
    """
    if kernel not in KERNELS:
        raise ConfigError(f"unknown attention kernel {kernel!r}", fix=f"use one of {', '.join(KERNELS)}")
    if q_len <= 0:
        return 0
    start = kv_len - q_len
    if kernel == "exact":
        return q_len * start + q_len * (q_len + 1) // 2
    if not causal:
        return q_len * kv_len
    if start:
        raise ConfigError("is_causal needs a query as long as the keys")
    qs, total = q_split(q_len), 0
    for m in range(0, q_len, qs):
        qb = min(qs, q_len - m)
        num_keys = min(m + qb, kv_len)
        total += qb * min(-(-num_keys // KV_SPLIT) * KV_SPLIT, kv_len)
    return total


def _counts(positions: int, n_pairs: int, model: FlopModel) -> dict[str, int]:
    lin, att = positions * model.linear_per_position, n_pairs * model.attention_per_pair
    return {"positions": positions, "pairs": n_pairs, "linear": lin, "attention": att, "total": lin + att}


def plan_flops(batches: Sequence[ScoreBatch], model: FlopModel, *, kernel: str = "cpu-sdpa",
               attention_mask: bool = False, split_attention: bool = True) -> dict[str, int]:
    """FLOP of running ``batches`` with :func:`~critic_audit.critic.infer.score_plan` (in one call).

    Shared spans are counted as ``score_plan``'s prefix cache feeds them: once per call while the
    plan stays under them (a plan split in chunks feeds them once per chunk). ``kernel="cpu-sdpa"``
    counts pads (linear and attention) and the masked pairs the CPU kernel computes;
    ``"exact"`` counts real positions and causal pairs only. ``attention_mask``: the padding mask
    is passed (no ``is_causal``). ``split_attention``: batches that ask for split attention get it
    (CPU, SDPA): ``q x P`` unmasked pairs to the prefix plus the causal blocks of the row's own
    ``q`` positions, instead of the masked ``q x (P + q)`` rectangle.

    Returns:
        ``{"positions", "pairs", "linear", "attention", "total"}``: positions fed, query-key pairs
        computed per layer and head, linear / attention / total FLOP (ints).
    """
    exact = kernel == "exact"
    positions = n_pairs = 0
    current: list[tuple] = []
    for bt in batches:
        split = split_attention and bt.split_attention and not attention_mask

        def attend(q: int, start: int) -> int:
            """Pairs of one row of ``q`` positions after ``start`` cached ones."""
            if split and start and not exact:
                return q * start + pairs(q, q, causal=True, kernel=kernel)
            return pairs(q, start + q, causal=not start and not attention_mask, kernel=kernel)

        if bt.prefix:
            j = 0
            while j < len(current) and j < len(bt.prefix) and current[j][0] == bt.prefix[j][0]:
                j += 1
            del current[j:]
            for node in bt.prefix[j:]:
                _, s, e = node
                positions += e - s
                n_pairs += attend(e - s, s)
                current.append(node)
        p = bt.prefix_length
        rows, cols = bt.shape()
        if not rows:
            continue
        if exact:
            segs = [seg for row in bt.rows for seg in row]
            positions += sum(e - s for _, s, e in segs)
            n_pairs += sum(pairs(e - s, e, causal=False, kernel="exact") for _, s, e in segs)
        else:
            positions += rows * cols
            if bt.packed:
                n_pairs += rows * pairs(cols, cols, causal=False, kernel=kernel)
            else:
                n_pairs += rows * attend(cols, p)
    return _counts(positions, n_pairs, model)


def loop_flops(lengths: Sequence[int], model: FlopModel, *, kernel: str = "cpu-sdpa") -> dict[str, int]:
    """FLOP of the naive loop: each sequence of ``lengths[i]`` tokens fed whole, alone, with ``is_causal``."""
    positions = sum(int(n) for n in lengths)
    return _counts(positions, sum(pairs(int(n), int(n), causal=True, kernel=kernel) for n in lengths), model)


def exact_bound(sequences: Sequence[np.ndarray], model: FlopModel) -> dict[str, int]:
    """The least FLOP an exact method needs for the values of ``sequences`` (``len - 1`` positions
    each): every distinct position of their radix tree fed once, causal pairs only."""
    plan = plan_scoring(sequences, 1 << 62, Strategy(share_prefix=True, min_prefix=1))
    return plan_flops(plan, model, kernel="exact")
