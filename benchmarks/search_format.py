"""How often a policy writes an action the HotpotQA search environment can carry out (``search[...]`` or
``finish[...]``), and the reward it earns, over the first turns of a batch of episodes: whether RL on
``--env hotpotqa`` has any reward to start from (docs/train.md, "A pretrained chat policy on HotpotQA").

    python benchmarks/search_format.py --policy smollm2-135m --episodes 16 --turns 3 --temperature 1.0
    python benchmarks/search_format.py --policy smollm2-135m --set 'env.kwargs={example=true}'

One torch thread by default (``--threads``). Prints one summary line and the first assistant turns.
"""

from __future__ import annotations

import argparse
import re
import tempfile
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--policy", default="smollm2-135m", help="model.policy (smollm2-135m or a local HF folder)")
    ap.add_argument("--layers", type=int, default=None, help="keep only the first N layers (model.layers)")
    ap.add_argument("--episodes", type=int, default=16)
    ap.add_argument("--turns", type=int, default=3, help="assistant turns per episode at most")
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--set", dest="overrides", action="append", default=[], help="more train config overrides")
    a = ap.parse_args()

    import torch

    torch.set_num_threads(a.threads)
    from critic_audit.train import Trainer, load_config

    over = ["env.name=hotpotqa", f"model.policy={a.policy}", f"env.max_new_tokens={a.max_new_tokens}",
            f"env.max_turns={a.turns}", f"rollout.temperature={a.temperature}", *a.overrides]
    if a.layers:
        over.append(f"model.layers={a.layers}")
    cfg = load_config(None, over)
    with tempfile.TemporaryDirectory() as tmp:
        tr = Trainer(cfg, f"{tmp}/run")
        t0 = time.perf_counter()
        eps = tr.generate(list(range(a.episodes)), list(range(a.episodes)))
        dt = time.perf_counter() - t0
    turns = [m["content"] for e in eps for m in e.messages if m["role"] == "assistant"]
    act = sum(bool(re.search(r"(search|finish)\[", t, re.IGNORECASE)) for t in turns)
    fin = sum(bool(re.search(r"finish\[", t, re.IGNORECASE)) for t in turns)
    print(f"{a.policy} layers={a.layers or 'all'} T={a.temperature}: {len(eps)} episodes, {len(turns)} assistant turns "
          f"in {dt:.0f} s; with an action {act}, finish {fin}; reward mean {sum(e.reward for e in eps) / len(eps):.3f}")
    for t in turns[:6]:
        print("  ", repr(t[:160]))


if __name__ == "__main__":
    main()
