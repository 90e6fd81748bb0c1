"""Optional vLLM backend: per-token critic values from vLLM's pooling runner.

**Untested here**: vLLM is not installed in critic-audit's test environment (it needs a GPU build), so
no test runs this module; it is a thin, guarded wrapper kept small on purpose. The default path,
:func:`critic_audit.critic.score_values`, is the tested one.

It serves a Hugging Face **token-classification folder with one label** (``*ForTokenClassification``,
``score.weight``), which vLLM runs with ``runner="pooling"`` and the ``token_classify`` task. Other
formats (verl FSDP shards, TRL value heads, OpenRLHF, PEFT, GGUF + head) are not read by vLLM:
load them with :func:`critic_audit.critic.load_critic` and write a token-classification folder with
:func:`critic_audit.critic.save_critic` first. vLLM computes the head in the model dtype (bf16 on GPU),
unlike :func:`score_values`, whose head is float32.

The t-1 convention is the same as :func:`score_values`: vLLM returns the head's output at every
position ``t`` (the value read after token ``t``), so ``values[t] = out[t-1]`` and ``values[0] = nan``.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from critic_audit.errors import ConfigError


def vllm_available() -> bool:
    """Whether the ``vllm`` package can be imported (located without importing it)."""
    try:
        return importlib.util.find_spec("vllm") is not None
    except (ImportError, ValueError):
        return False


def make_vllm_critic(path: str | Path, *, dtype: str = "auto", **llm_kwargs: Any) -> Any:
    """A ``vllm.LLM`` for a token-classification critic folder in pooling mode."""
    if not vllm_available():
        raise ConfigError("the vLLM backend needs the package 'vllm', which is not installed",
                          fix="pip install vllm (GPU machines), or use score_values")
    from vllm import LLM

    try:  # vLLM >= 0.10: runner / convert
        return LLM(model=str(path), runner="pooling", convert="classify", dtype=dtype, **llm_kwargs)
    except TypeError:  # older releases: task=
        return LLM(model=str(path), task="classify", dtype=dtype, **llm_kwargs)


def score_values_vllm(llm: Any, sequences: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Per-token values of token-id ``sequences`` with a ``vllm.LLM`` from :func:`make_vllm_critic`.

    Returns float32 arrays with ``values[0] = nan`` and ``values[t] = head(h[t-1])``, like
    :func:`critic_audit.critic.score_values`. Raw head outputs are requested (no sigmoid/softmax).
    """
    from vllm import PoolingParams

    try:
        params = PoolingParams(use_activation=False)
    except TypeError:  # older name
        params = PoolingParams(activation=False)
    prompts = [{"prompt_token_ids": [int(t) for t in np.asarray(s)[:-1]]} for s in sequences if len(s) > 1]
    outs = llm.encode(prompts, pooling_params=params, pooling_task="token_classify") if prompts else []
    it = iter(outs)
    result = []
    for s in sequences:
        v = np.full(len(s), np.nan, dtype=np.float32)
        if len(s) > 1:
            data = next(it).outputs.data
            data = data.float().cpu().numpy() if hasattr(data, "cpu") else np.asarray(data, dtype=np.float32)
            v[1:] = data.reshape(len(s) - 1, -1)[:, 0]
        result.append(v)
    return result
