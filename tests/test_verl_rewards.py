"""Masked rewards in the verl plugin (issue 12, item 6): refused by default, moved and counted on request.

Runs without verl: the plugin's estimator is called through a minimal stand-in of verl's
``core_algos`` registry (the real verl path is in tests/test_verl_integration.py).
"""

from __future__ import annotations

import importlib
import json
import sys
import types

import pytest
import torch

from critic_audit.errors import ConfigError
from critic_audit.integrations.verl.options import OPTIONS_ENV, validate_options
from critic_audit.integrations.verl.rewards import (
    METRIC_DROPPED,
    METRIC_MOVED,
    masked_reward_metrics,
    move_masked_rewards,
    place_masked_rewards,
)
from critic_audit.rl import MAEConfig, MaskedRewardError, RolloutBatch, compute_advantages

MASK = torch.tensor([[1, 1, 0, 0], [0, 1, 0, 1], [0, 0, 1, 1]])
REWARDS = torch.tensor([[0.0, 0.0, 0.0, 1.0], [0.0, 0.0, 0.5, 0.0], [2.0, 0.0, 0.0, 3.0]])


def test_raise_by_default_names_row_and_position():
    masked_reward_metrics()
    with pytest.raises(MaskedRewardError) as e:
        place_masked_rewards(REWARDS, MASK)
    msg = str(e.value)
    assert "3 non-zero reward(s) on masked tokens" in msg and "row 0, position 3" in msg
    assert "masked_rewards=move" in msg and "\n" not in msg
    assert masked_reward_metrics() == {METRIC_MOVED: 0.0, METRIC_DROPPED: 0.0}
    clean = REWARDS * MASK
    assert place_masked_rewards(clean, MASK) is clean


def test_move_is_counted_as_metrics():
    masked_reward_metrics()
    out = place_masked_rewards(REWARDS, MASK, "move")
    # row 0: 1.0 from position 3 to 1; row 1: 0.5 from 2 to 1; row 2: 2.0 at 0 has no policy token before: dropped
    assert out.tolist() == [[0.0, 1.0, 0.0, 0.0], [0.0, 0.5, 0.0, 0.0], [0.0, 0.0, 0.0, 3.0]]
    assert masked_reward_metrics() == {METRIC_MOVED: 2.0, METRIC_DROPPED: 1.0}
    assert masked_reward_metrics() == {METRIC_MOVED: 0.0, METRIC_DROPPED: 0.0}  # reset per step
    moved, n = move_masked_rewards(REWARDS, MASK)
    assert n == 3 and torch.equal(moved, out)


def test_option_is_validated():
    assert validate_options({"masked_rewards": "move"}) == {"masked_rewards": "move"}
    with pytest.raises(ConfigError, match="masked_rewards"):
        validate_options({"masked_rewards": "drop"})
    with pytest.raises(ConfigError, match="not a mode"):
        place_masked_rewards(REWARDS, MASK, "ignore")


@pytest.fixture()
def plugin(monkeypatch):
    """The plugin imported against a stand-in of verl's core_algos registries."""
    core = types.ModuleType("verl.trainer.ppo.core_algos")
    core.ADV_ESTIMATOR_REGISTRY = {}
    core.POLICY_LOSS_REGISTRY = {}

    def register_policy_loss(name):
        def deco(fn):
            core.POLICY_LOSS_REGISTRY[name] = fn
            return fn
        return deco

    core.register_policy_loss = register_policy_loss
    core.agg_loss = lambda **kw: None
    ppo = types.ModuleType("verl.trainer.ppo")
    ppo.core_algos = core
    for name, mod in (("verl", types.ModuleType("verl")), ("verl.trainer", types.ModuleType("verl.trainer")),
                      ("verl.trainer.ppo", ppo), ("verl.trainer.ppo.core_algos", core)):
        monkeypatch.setitem(sys.modules, name, mod)
    monkeypatch.delitem(sys.modules, "critic_audit.integrations.verl.plugin", raising=False)
    mod = importlib.import_module("critic_audit.integrations.verl.plugin")
    yield mod, core
    sys.modules.pop("critic_audit.integrations.verl.plugin", None)


def test_plugin_estimator_raises_by_default_and_moves_on_request(plugin, monkeypatch):
    mod, core = plugin
    est = core.ADV_ESTIMATOR_REGISTRY["mpo"]
    values = torch.randn(3, 4, generator=torch.Generator().manual_seed(0))
    monkeypatch.delenv(OPTIONS_ENV, raising=False)
    with pytest.raises(MaskedRewardError, match="masked_rewards=move"):
        est(token_level_rewards=REWARDS, response_mask=MASK, values=values)
    monkeypatch.setenv(OPTIONS_ENV, json.dumps({"masked_rewards": "move", "whiten": False}))
    masked_reward_metrics()
    adv, ret = est(token_level_rewards=REWARDS, response_mask=MASK, values=values)
    ref = compute_advantages("mae", RolloutBatch(place_masked_rewards(REWARDS, MASK, "move"), values, MASK.bool()),
                             MAEConfig(whiten=False))
    assert torch.equal(adv, ref.advantages) and torch.equal(ret, ref.returns)
    assert mod.masked_reward_metrics() == {METRIC_MOVED: 4.0, METRIC_DROPPED: 2.0}  # two calls of move
