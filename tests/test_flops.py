"""The analytic FLOP model of scoring plans (critic_audit.critic.flops) against hand-computed counts."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from conftest import make_critic_dir
from critic_audit.critic import load_critic
from critic_audit.critic.flops import FlopModel, exact_bound, loop_flops, pairs, plan_flops
from critic_audit.critic.infer import Strategy, plan_scoring
from critic_audit.errors import ConfigError

# 2 layers, hidden 8, 2 query heads and 1 KV head of 4 dims, MLP 16
TINY = FlopModel(layers=2, hidden=8, heads=2, kv_heads=1, head_dim=4, intermediate=16)


def test_per_position_and_per_pair_by_hand():
    # per layer: q,o 2*8*8 + k,v 2*8*4 + gate/up/down 3*8*16 = 128 + 64 + 384 = 576 MACs; x2 FLOP, x2 layers, + head
    assert TINY.linear_per_position == 2 * 2 * 576 + 2 * 8 == 2320
    assert TINY.attention_per_pair == 4 * 2 * 2 * 4 == 64
    smollm = FlopModel.from_config({"num_hidden_layers": 30, "hidden_size": 576, "num_attention_heads": 9,
                                    "num_key_value_heads": 3, "intermediate_size": 1536})
    assert smollm.head_dim == 64
    assert smollm.linear_per_position == 30 * 2 * 3538944 + 2 * 576  # ~212 MFLOP a position
    assert smollm.attention_per_pair == 69120


def test_pairs_cpu_kernel_blocks_by_hand():
    # 1000 queries: blocks of 256 queries; keys in blocks of 512, each started block computed whole
    # m=0: 512 keys, m=256: 512, m=512: min(1024, 1000), m=768 (232 rows): 1000
    assert pairs(1000, 1000, causal=True) == 256 * 512 + 256 * 512 + 256 * 1000 + 232 * 1000
    assert pairs(100, 100, causal=True) == 100 * 100  # one key block: nothing skipped
    assert pairs(1000, 1000, causal=True, kernel="exact") == 1000 * 1001 // 2
    assert pairs(9, 109, causal=False) == 9 * 109  # a masked continuation: the whole rectangle
    assert pairs(9, 109, causal=False, kernel="exact") == 9 * 100 + 45
    assert pairs(0, 5, causal=False) == 0
    with pytest.raises(ConfigError):
        pairs(5, 10, causal=True)
    with pytest.raises(ConfigError, match="kernel"):
        pairs(5, 5, causal=True, kernel="fast")


def test_plan_flops_shared_prefix_by_hand():
    rng = np.random.default_rng(1)
    prompt = rng.integers(3, 250, 100)
    seqs = [np.concatenate([prompt, [10 + k], rng.integers(3, 250, 9)]) for k in range(3)]  # 110 tokens each
    plan = plan_scoring(seqs, 4096, Strategy(min_prefix=64))
    # the prompt (100 positions, is_causal, one key block) then 3 rows of 9 over 109 keys, masked
    got = plan_flops(plan, TINY, split_attention=False)
    assert got["positions"] == 100 + 27 and got["pairs"] == 100 * 100 + 3 * 9 * 109
    assert got["total"] == 127 * 2320 + (10000 + 2943) * 64
    # split attention: 27 queries x 100 prefix keys unmasked, each row's 9 causal (one block of 32 x 9)
    assert plan_flops(plan, TINY)["pairs"] == 100 * 100 + 27 * 100 + 3 * 81
    ex = plan_flops(plan, TINY, kernel="exact")
    assert ex["pairs"] == 5050 + 3 * (9 * 100 + 45)
    # the bound: the 100-token prompt plus the one more token the three share: same radix tree here
    assert exact_bound(seqs, TINY)["positions"] == 127
    naive = loop_flops([len(s) for s in seqs], TINY)
    assert naive["positions"] == 330 and naive["pairs"] == 3 * 110 * 110


def test_plan_flops_padded_and_packed_by_hand():
    seqs = [np.arange(3, 3 + n) % 200 + 3 for n in (41, 21, 11)]  # fed: 40, 20, 10 (no shared prefix of 64)
    # fewest pads + 32 a pass: 40 + 2 x 20 + 2 x 32 = 144 < 3 x 40 + 32
    assert [b.shape() for b in plan_scoring(seqs, 4096, Strategy(share_prefix=False))] == [(1, 40), (2, 20)]
    padded = plan_scoring(seqs, 4096, Strategy(share_prefix=False, pass_tokens=1000))
    assert [b.shape() for b in padded] == [(3, 40)]
    assert plan_flops(padded, TINY)["pairs"] == 3 * 40 * 40 and plan_flops(padded, TINY)["positions"] == 120
    assert plan_flops(padded, TINY, attention_mask=True)["pairs"] == 3 * 40 * 40
    packed = plan_scoring(seqs, 4096, Strategy(layout="packed", share_prefix=False, pack_length=70))
    assert [b.shape() for b in packed] == [(1, 70)]
    assert plan_flops(packed, TINY)["pairs"] == 70 * 70  # the block-diagonal mask: the whole square
    assert plan_flops(packed, TINY, kernel="exact")["pairs"] == 820 + 210 + 55
    assert plan_flops(packed, TINY, kernel="exact")["positions"] == 70


def test_prefix_nodes_fed_once_per_path():
    """A nested radix tree: the outer span fed once, each inner span once, as score_plan's stack does."""
    rng = np.random.default_rng(3)
    a, b, c = rng.integers(3, 250, 80), rng.integers(3, 250, 70), rng.integers(3, 250, 70)
    seqs = [np.concatenate([a, b, rng.integers(3, 250, 5)]) for _ in range(2)]
    seqs += [np.concatenate([a, c, rng.integers(3, 250, 5)]) for _ in range(2)]
    plan = plan_scoring(seqs, 4096, Strategy(min_prefix=64))
    got = plan_flops(plan, TINY, split_attention=False)
    # fed: 154 positions each. a (80, causal), b (70 over 150 keys, masked), 2 rows of 4 over 154; c likewise
    assert [b.shape() for b in plan] == [(2, 4), (2, 4)]
    assert got["positions"] == 80 + 70 + 8 + 70 + 8
    assert got["pairs"] == 80 * 80 + 2 * (70 * 150 + 2 * 4 * 154)


def test_model_matches_the_backbone(tmp_path):
    with torch.no_grad():
        critic = load_critic(make_critic_dir(tmp_path / "c"), device="cpu", dtype="float32")
    model = FlopModel.from_config(critic.backbone.config)
    linear = sum(m.weight.numel() for m in critic.backbone.modules() if isinstance(m, torch.nn.Linear))
    assert model.linear_per_position == 2 * linear + 2 * critic.backbone.config.hidden_size
    with pytest.raises(ConfigError):
        FlopModel.from_config({"hidden_size": 8})
