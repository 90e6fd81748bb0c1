"""A HotpotQA search agent over a local BM25 index (``hotpotqa``).

Data: ``hotpotqa_distractor_sample100.jsonl`` (100 hard HotpotQA distractor questions with their 10
paragraphs each; HotpotQA is CC BY-SA 4.0, the sample comes from the MIT-licensed Reflexion repository:
see ``SOURCE.md`` beside the file). The episode of seed s is question ``s mod 100``.

Protocol (ReAct-style actions in the assistant's text)::

    search[query]    -> tool message: the top ``top_k`` paragraphs of the question's own 10 (BM25,
                        rank-bm25), title and text, each cut to ``max_paragraph_chars``
    finish[answer]   -> episode ends; reward = exact match (``reward = "em"``) or token F1 (``"f1"``)
                        after SQuAD normalisation (lower case, no punctuation/articles)

A turn with neither action gets a tool message asking for one. After ``max_searches`` searches the
environment asks for ``finish``; an episode that never finishes earns 0 (the trainer's ``max_turns``).
Success = exact match.
"""

from __future__ import annotations

import functools
import json
import re
import string
from collections import Counter
from pathlib import Path
from typing import Any

from critic_audit.errors import ConfigError, InputError

__all__ = ["HotpotQASearchEnv", "exact_match", "f1_score", "normalize_answer"]

DEFAULT_DATA = (Path(__file__).resolve().parents[3] / "sample_data" / "hotpotqa_distractor_rl"
                / "hotpotqa_distractor_sample100.jsonl")
ACTION = re.compile(r"(search|finish)\[(.*?)\]", re.IGNORECASE | re.DOTALL)
SYSTEM = ("Answer the question. Use search[query] to look up paragraphs and finish[answer] to answer. "
          "One action per turn.")
EXAMPLE = ("\n\nExample.\nQuestion: In which country is the city where the Eiffel Tower stands?\n"
           "You: search[Eiffel Tower]\nTool: Eiffel Tower: a wrought-iron lattice tower in Paris, France.\n"
           "You: finish[France]")


def normalize_answer(s: str) -> str:
    """SQuAD normalisation: lower case, no punctuation, no articles, single spaces."""
    s = s.lower()
    s = "".join(ch for ch in s if ch not in set(string.punctuation))
    s = re.sub(r"\b(a|an|the)\b", " ", s)
    return " ".join(s.split())


def exact_match(prediction: str, answer: str) -> float:
    return float(normalize_answer(prediction) == normalize_answer(answer))


def f1_score(prediction: str, answer: str) -> float:
    p, a = normalize_answer(prediction).split(), normalize_answer(answer).split()
    common = Counter(p) & Counter(a)
    same = sum(common.values())
    if same == 0:
        return 0.0
    precision, recall = same / len(p), same / len(a)
    return 2 * precision * recall / (precision + recall)


def _tokens(text: str) -> list[str]:
    return normalize_answer(text).split()


@functools.lru_cache(maxsize=4)
def load_questions(path: str) -> list[dict[str, Any]]:
    """The JSONL records (``question``, ``answer``, ``context`` = [{title, sentences}] x 10).

    Raises:
        InputError: missing file or a malformed line.
    """
    p = Path(path)
    if not p.is_file():
        raise InputError("no such file", path=p, fix="pass env.kwargs.data_path (see the data's SOURCE.md)")
    out = []
    for i, line in enumerate(p.read_text(encoding="utf-8").splitlines()):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
            rec["question"], rec["answer"], rec["context"]  # noqa: B018 - required keys
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise InputError(f"malformed record ({e})", path=p, record=i + 1) from None
        out.append(rec)
    if not out:
        raise InputError("no records", path=p)
    return out


@functools.lru_cache(maxsize=256)
def _index(path: str, i: int) -> tuple[Any, list[str]]:
    try:
        from rank_bm25 import BM25Okapi
    except ImportError:
        raise ConfigError("the hotpotqa environment needs rank-bm25", fix="pip install rank-bm25") from None
    rec = load_questions(path)[i]
    docs = [f"{c['title']}: {''.join(c['sentences'])}" for c in rec["context"]]
    return BM25Okapi([_tokens(d) or [""] for d in docs]), docs


class HotpotQASearchEnv:
    """Search agent over one question's 10 paragraphs (see the module docstring).

    Args:
        data_path: the JSONL file (default: ``sample_data/hotpotqa_distractor_rl/hotpotqa_distractor_sample100.jsonl`` of the repository).
        top_k: paragraphs per search.
        max_paragraph_chars: each returned paragraph is cut to this many characters.
        max_searches: searches allowed before the environment demands ``finish``.
        reward: ``em`` or ``f1``.
    """

    name = "hotpotqa"

    def __init__(self, data_path: str | None = None, top_k: int = 2, max_paragraph_chars: int = 600,
                 max_searches: int = 3, reward: str = "f1", format_bonus: float = 0.0,
                 example: bool = False) -> None:
        """``format_bonus``: reward added at each turn whose action the environment carries out (a search
        within ``max_searches`` or the finish), so a policy that never writes an action still gets a
        signal (0 = off, the default; the answer reward is then the only one). ``example``: append a
        one-shot demonstration of the two actions to the system message."""
        if reward not in ("em", "f1"):
            raise ConfigError(f"env.kwargs.reward = {reward!r}", fix="use em or f1")
        if top_k < 1 or max_paragraph_chars < 1 or max_searches < 0:
            raise ConfigError("env.kwargs top_k and max_paragraph_chars must be >= 1, max_searches >= 0")
        if not 0.0 <= format_bonus <= 1.0:
            raise ConfigError(f"env.kwargs.format_bonus = {format_bonus!r} must be in [0, 1]", fix="e.g. 0.1")
        self.format_bonus, self.system = float(format_bonus), SYSTEM + (EXAMPLE if example else "")
        self.path = str(data_path or DEFAULT_DATA)
        self.questions = load_questions(self.path)
        self.top_k, self.max_chars, self.max_searches, self.reward_kind = top_k, max_paragraph_chars, max_searches, reward

    def reset(self, seed: int) -> list[dict[str, str]]:
        self.i = int(seed) % len(self.questions)
        self.rec = self.questions[self.i]
        self.searches = 0
        return [{"role": "system", "content": self.system}, {"role": "user", "content": f"Question: {self.rec['question']}"}]

    def search(self, query: str) -> str:
        """The top paragraphs for ``query`` (BM25 over the question's own 10)."""
        bm25, docs = _index(self.path, self.i)
        scores = bm25.get_scores(_tokens(query) or [""])
        best = sorted(range(len(docs)), key=lambda j: (-scores[j], j))[: self.top_k]
        return "\n".join(docs[j][: self.max_chars] for j in best)

    def step(self, assistant_text: str) -> tuple[list[dict[str, str]], float, bool, dict[str, Any]]:
        m = ACTION.search(assistant_text)
        if m is None:
            return [{"role": "tool", "content": "No action. Use search[query] or finish[answer]."}], 0.0, False, {}
        kind, arg = m.group(1).lower(), m.group(2).strip()
        if kind == "finish":
            em = exact_match(arg, self.rec["answer"])
            r = em if self.reward_kind == "em" else f1_score(arg, self.rec["answer"])
            return [], float(r) + self.format_bonus, True, {"success": bool(em), "answer": arg}
        if self.searches >= self.max_searches:
            return [{"role": "tool", "content": "No more searches. Answer with finish[answer]."}], 0.0, False, {}
        self.searches += 1
        return [{"role": "tool", "content": self.search(arg)}], self.format_bonus, False, {}
