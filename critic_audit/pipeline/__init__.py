"""The commands' pipelines, above the library layers: ``analyze`` (read once, tokenize, score,
decompose, write) and ``fit-critic``.

Layering: ``cli -> pipeline -> analysis | critic | io | turns | outputs``. Modules:

* :mod:`~critic_audit.pipeline.analyze`: :func:`analyze`, the orchestrator, one critic or several;
* :mod:`~critic_audit.pipeline.scoring`: the scoring of the tokens that lack a value (in process,
  resumable cache, or workers), as :class:`ScoringConfig` says (how the critic runs, and its
  :class:`CacheOptions`; both from :mod:`critic_audit.critic.options`, re-exported here);
* :mod:`~critic_audit.pipeline.folder`: the output folder (what may be replaced, writing, publishing);
* :mod:`~critic_audit.pipeline.fit`: :func:`fit_critic`.

Input reading lives in :mod:`critic_audit.io.inputs` (:func:`~critic_audit.io.inputs.read_all`), the
helpers that read an audit folder back in :mod:`critic_audit.io.tables`.
"""

from critic_audit.pipeline.analyze import PRE_SCORING_EXCLUSIONS, AnalyzeOutcome, analyze
from critic_audit.pipeline.fit import fit_critic
from critic_audit.pipeline.folder import OUTPUT_NAMES, check_output_folder
from critic_audit.pipeline.scoring import CacheOptions, ScoringConfig, critic_labels

__all__ = ["analyze", "AnalyzeOutcome", "fit_critic", "ScoringConfig", "CacheOptions", "critic_labels", "check_output_folder",
           "OUTPUT_NAMES", "PRE_SCORING_EXCLUSIONS"]
