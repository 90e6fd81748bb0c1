"""Batched multi-turn rollouts: episodes, the sampling loop (KV cache), packing, canonical tables.

Turn k of an episode is its k-th assistant message; ``response_mask`` is 1 exactly at the ids the
policy sampled (the end-of-turn token included when it was sampled), 0 at every observation, template
and padding token. A step reward of the environment is placed on the last sampled token of the turn that
earned it, so the outcome reward sits on the last policy token of the episode.
"""

from __future__ import annotations

import inspect
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import polars as pl
import torch
from torch import Tensor

from critic_audit.schema import TOKEN_SCHEMA, TRAJECTORY_SCHEMA
from critic_audit.train.chat import ChatCodec
from critic_audit.train.models import SPLIT_VOCAB, vocab_size

__all__ = ["Episode", "PackedBatch", "episodes_to_tables", "generate_episodes", "pack_episodes"]


@dataclass
class Episode:
    """One finished (or truncated) episode, token by token.

    Attributes:
        ids, roles, mask, turn: per token: id, message role, sampled by the policy, turn index (or None).
        rewards: position -> reward (only at the last token of a turn).
        messages: the conversation (observation messages and assistant turns), for chat-format export.
        reward: the return (sum of step rewards). success: the environment's flag or the threshold rule.
        num_turns: assistant turns K. truncated: stopped by a turn or token limit.
        seed, group: the environment seed and the prompt (group) index.
    """

    seed: int
    group: int
    ids: list[int] = field(default_factory=list)
    roles: list[str] = field(default_factory=list)
    mask: list[bool] = field(default_factory=list)
    turn: list[int | None] = field(default_factory=list)
    rewards: dict[int, float] = field(default_factory=dict)
    messages: list[dict[str, Any]] = field(default_factory=list)
    reward: float = 0.0
    success: bool | None = None
    num_turns: int = 0
    truncated: bool = False
    done: bool = False

    def extend(self, ids: Sequence[int], roles: Sequence[str] | str, sampled: bool, turn: int | None) -> None:
        self.ids += list(ids)
        self.roles += [roles] * len(ids) if isinstance(roles, str) else list(roles)
        self.mask += [sampled] * len(ids)
        self.turn += [turn] * len(ids)


def _sample_next(logits: Tensor, temperature: float, top_k: int, generator: torch.Generator) -> Tensor:
    logits = logits.float() / temperature
    if top_k:
        kth = torch.topk(logits, min(top_k, logits.shape[-1]), dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


def _cache(out: Any) -> Any:
    return out["cache"] if "cache" in out else out["past_key_values"]


@torch.no_grad()
def sample_turn(policy: Any, prefixes: list[list[int]], limits: list[int], eos_id: int, pad_id: int,
                temperature: float, top_k: int, generator: torch.Generator, device: torch.device,
                autocast: Callable[[], Any]) -> list[tuple[list[int], bool]]:
    """Sample one assistant turn for every prefix: left-padded prefill, then one token at a time with
    the KV cache, until eos or the row's limit. Returns ``(ids, ended_with_eos)`` per row (eos included)."""
    n = len(prefixes)
    width = max(len(p) for p in prefixes)
    ids = torch.full((n, width), pad_id, dtype=torch.long)
    attn = torch.zeros((n, width), dtype=torch.long)
    for i, p in enumerate(prefixes):
        ids[i, width - len(p):] = torch.tensor(p, dtype=torch.long)
        attn[i, width - len(p):] = 1
    ids, attn = ids.to(device), attn.to(device)
    pos = (attn.cumsum(-1) - 1).clamp(min=0)
    params = inspect.signature(policy.forward).parameters
    # the prefill's (n, width, V) logits are only read at the last position: for a chat vocabulary ask
    # for that one (49k ids x 8 rows x 3,000 tokens is 4.7 GB of float32)
    keep = {"logits_to_keep": 1} if "logits_to_keep" in params and vocab_size(policy) >= SPLIT_VOCAB else {}
    with autocast():
        out = policy(input_ids=ids, attention_mask=attn, position_ids=pos, use_cache=True, **keep)
    cache_kw = "cache" if "cache" in params else "past_key_values"
    past, logits = _cache(out), out.logits[:, -1]
    next_pos = pos[:, -1:] + 1
    limit = torch.tensor(limits, device=device)
    finished = limit <= 0
    sampled: list[list[int]] = [[] for _ in range(n)]
    eos = [False] * n
    for t in range(max(limits)):
        tok = _sample_next(logits, temperature, top_k, generator)
        tok = torch.where(finished, torch.full_like(tok, pad_id), tok)
        for i in (~finished).nonzero().flatten().tolist():
            sampled[i].append(int(tok[i]))
        hit_eos = (tok == eos_id) & ~finished
        for i in hit_eos.nonzero().flatten().tolist():
            eos[i] = True
        finished = finished | hit_eos | (limit <= t + 1)
        if bool(finished.all()):
            break
        attn = torch.cat([attn, torch.ones((n, 1), dtype=attn.dtype, device=device)], dim=1)
        with autocast():
            out = policy(input_ids=tok[:, None], attention_mask=attn, position_ids=next_pos,
                         use_cache=True, **{cache_kw: past})
        past, logits = _cache(out), out.logits[:, -1]
        next_pos = next_pos + 1
    return list(zip(sampled, eos))


def generate_episodes(policy: Any, codec: ChatCodec, make_env: Callable[[], Any], seeds: Sequence[int],
                      groups: Sequence[int], *, max_turns: int, max_new_tokens: int, max_context: int,
                      temperature: float, top_k: int, success_threshold: float, generator: torch.Generator,
                      device: torch.device, autocast: Callable[[], Any]) -> list[Episode]:
    """Run one episode per seed, all in lockstep: turn k of every live episode is sampled as one batch.

    An episode ends when the environment says ``done``, after ``max_turns`` turns, or when it would
    exceed ``max_context`` tokens (``truncated``); its return is the sum of the rewards so far.
    """
    envs = [make_env() for _ in seeds]
    eps = [Episode(seed=int(s), group=int(g)) for s, g in zip(seeds, groups)]
    for env, ep in zip(envs, eps):
        obs = list(env.reset(int(ep.seed)))
        ids, roles = codec.observation([], obs)
        ep.messages = obs
        ep.extend(ids, roles, False, None)
    infos: list[dict[str, Any]] = [{} for _ in eps]
    for k in range(max_turns):
        live = []
        for i, (env, ep) in enumerate(zip(envs, eps)):
            if ep.done:
                continue
            lim = max_new_tokens
            hook = getattr(env, "turn_token_limit", None)
            if hook is not None and hook(k) is not None:
                lim = min(lim, int(hook(k)))
            lim = min(lim, max_context - len(ep.ids))
            if lim < 1:
                ep.done = ep.truncated = True
                continue
            live.append((i, lim))
        if not live:
            break
        turns = sample_turn(policy, [eps[i].ids for i, _ in live], [lim for _, lim in live], codec.eos_id,
                            codec.pad_id, temperature, top_k, generator, device, autocast)
        for (i, _), (ids, ended) in zip(live, turns):
            ep, env = eps[i], envs[i]
            ep.extend(ids, "assistant", True, k)
            ep.num_turns = k + 1
            content = codec.decode(ids[:-1] if ended else ids)
            result = env.step(content)
            obs, r, done = result[0], float(result[1]), bool(result[2])
            if len(result) > 3 and result[3]:
                infos[i] = dict(result[3])
            if r != 0.0:
                ep.rewards[len(ep.ids) - 1] = ep.rewards.get(len(ep.ids) - 1, 0.0) + r
            ep.reward += r
            history = ep.messages
            ep.messages = history + [{"role": "assistant", "content": content}] + list(obs or [])
            if done:
                ep.done = True
                continue
            tail = codec.closing(history, content, ended)
            ep.extend(tail, "assistant", False, None)
            o_ids, o_roles = codec.observation(history + [{"role": "assistant", "content": content}], list(obs or []))
            ep.extend(o_ids, o_roles, False, None)
            if len(ep.ids) >= max_context:
                ep.done = ep.truncated = True
    for ep, info in zip(eps, infos):
        if not ep.done:
            ep.truncated = True
        ep.done = True
        ep.success = bool(info["success"]) if "success" in info else bool(ep.reward >= success_threshold)
    return eps


@dataclass
class PackedBatch:
    """Episodes as right-padded (B, T) tensors.

    input_ids int64 (pad id at padding); attention_mask int64 (1 = real token); response_mask bool
    (1 = sampled by the policy); token_rewards float32 (step rewards on the last token of their turn);
    group_ids (B,) int64; turn_ids (B, T) int64 (k at policy tokens, -1 elsewhere).
    """

    input_ids: Tensor
    attention_mask: Tensor
    response_mask: Tensor
    token_rewards: Tensor
    group_ids: Tensor
    turn_ids: Tensor

    def rows(self, index: Tensor) -> PackedBatch:
        """The rows ``index``, trimmed to their longest row."""
        width = max(int(self.attention_mask[index].sum(-1).max()), 2)
        return PackedBatch(*(x[index][:, :width] if x.dim() == 2 else x[index] for x in (
            self.input_ids, self.attention_mask, self.response_mask, self.token_rewards, self.group_ids,
            self.turn_ids)))


def pack_episodes(episodes: Sequence[Episode], pad_id: int) -> PackedBatch:
    """Right-pad the episodes into a :class:`PackedBatch` (on CPU)."""
    B, T = len(episodes), max(len(e.ids) for e in episodes)
    ids = torch.full((B, T), pad_id, dtype=torch.long)
    attn = torch.zeros((B, T), dtype=torch.long)
    mask = torch.zeros((B, T), dtype=torch.bool)
    rewards = torch.zeros((B, T), dtype=torch.float32)
    turns = torch.full((B, T), -1, dtype=torch.long)
    for i, e in enumerate(episodes):
        n = len(e.ids)
        ids[i, :n] = torch.tensor(e.ids)
        attn[i, :n] = 1
        mask[i, :n] = torch.tensor(e.mask)
        turns[i, :n] = torch.tensor([-1 if k is None else k for k in e.turn])
        for pos, r in e.rewards.items():
            rewards[i, pos] = r
    groups = torch.tensor([e.group for e in episodes], dtype=torch.long)
    return PackedBatch(ids, attn, mask, rewards, groups, turns)


def episodes_to_tables(episodes: Sequence[Episode], *, step: int, checkpoint: str, source: str,
                       values: Tensor | None = None, old_log_probs: Tensor | None = None,
                       advantages: Tensor | None = None) -> tuple[pl.DataFrame, pl.DataFrame]:
    """The canonical trajectories and tokens tables (``docs/tables.md``) of one step's episodes.

    ``tokens`` carries ``value`` (the critic's V_t at rollout time at every position; null at t = 0 and
    when the algorithm has no critic) and the extra columns ``old_log_prob`` (nats, the behaviour policy's
    log-probability of a sampled token; null at masked tokens) and ``advantage`` (null at masked tokens).
    Trajectory ids are ``step{step}-{row}``; ``metadata`` holds the seed, the group and ``truncated``.
    """
    tids = [f"step{step}-{i}" for i in range(len(episodes))]
    trajs = pl.DataFrame({
        "trajectory_id": tids,
        "group_id": [f"step{step}-g{e.group}" for e in episodes],
        "checkpoint": [checkpoint] * len(episodes),
        "source": [source] * len(episodes),
        "reward": [e.reward for e in episodes],
        "success": [e.success for e in episodes],
        "num_turns": [e.num_turns for e in episodes],
        "metadata": [json.dumps({"seed": e.seed, "group": e.group, "truncated": e.truncated}) for e in episodes],
    }, schema=TRAJECTORY_SCHEMA)
    cols: dict[str, list[Any]] = {k: [] for k in (*TOKEN_SCHEMA, "old_log_prob", "advantage")}
    for i, e in enumerate(episodes):
        n = len(e.ids)
        cols["trajectory_id"] += [tids[i]] * n
        cols["position"] += list(range(n))
        cols["token_id"] += e.ids
        cols["role"] += e.roles
        cols["turn"] += e.turn
        cols["response_mask"] += e.mask

        def col(x: Tensor | None, masked_only: bool) -> list[float | None]:
            if x is None:
                return [None] * n
            row = x[i, :n].tolist()
            return [None if (masked_only and not m) or (t == 0 and not masked_only) or not math.isfinite(v) else v
                    for t, (v, m) in enumerate(zip(row, e.mask))]

        cols["value"] += col(values, False)
        cols["old_log_prob"] += col(old_log_probs, True)
        cols["advantage"] += col(advantages, True)
    schema = {**TOKEN_SCHEMA, "old_log_prob": pl.Float32(), "advantage": pl.Float32()}
    return trajs, pl.DataFrame(cols, schema=schema)


def episodes_to_chat(episodes: Sequence[Episode], *, step: int) -> list[dict[str, Any]]:
    """One chat-format record per episode (``messages``, ``reward``, ``success``, ``group_id``), the input
    ``critic-audit analyze`` reads with any critic's tokenizer."""
    return [{"id": f"step{step}-{i}", "group_id": f"step{step}-g{e.group}", "messages": e.messages,
             "reward": e.reward, "success": e.success} for i, e in enumerate(episodes)]
