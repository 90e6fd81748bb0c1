"""critic-audit inside verl (the ``[verl]`` extra): MPO and the estimators verl lacks, in verl's registries.

- :mod:`~critic_audit.integrations.verl.plugin` registers the estimators (``mpo``, ``decoupled_gae``,
  ``vapo``, ``sao``) and policy losses (``mpo``, ``sao``); ``import verl`` loads it by itself (entry
  point ``verl.plugins``).
- :mod:`~critic_audit.integrations.verl.trainer`: :func:`values_to_estimators` and the trainer
  ``critic_audit_sync`` (values to our estimators, per-step rollout dumps for ``critic-audit analyze``).
- :mod:`~critic_audit.integrations.verl.main`: the launcher, ``python -m critic_audit.integrations.verl.main``.
- :mod:`~critic_audit.integrations.verl.options`: the ``critic_audit.*`` options.

See docs/verl.md. Nothing here is imported by ``import critic_audit``.
"""
