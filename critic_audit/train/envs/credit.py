"""A synthetic multi-turn credit-assignment environment with a tiny vocabulary.

Episode (``num_decisions = 3``, ``report_turns = 1``; the defaults are 2 decisions, 2 cues, 2 choices,
2-token decision turns, 12-token tool outputs and a 12-token report turn)::

    system     pick L or R
    user       cue C                 <- a cue letter; the right choice is a fixed function of the cue
    assistant  L                     <- decision turn 0 (at most ``decision_tokens`` tokens)
    tool       ok x z y w ...        <- a tool output of ``observation_tokens`` filler tokens
    user       cue A
    assistant  R                     <- decision turn 1
    ...
    user       report
    assistant  ok ok ok ...          <- report turn: free text, at most ``report_tokens`` tokens; irrelevant
                                        to the outcome

The reward comes only at the end: the fraction of right decisions (``reward = "fraction"``) or 1 when
all are right (``"all"``), plus ``format_bonus`` times the fraction of decisions naming a valid choice. Early choices decide the outcome; the long report turn and the long tool
outputs carry no signal, so an estimator that spreads credit over every token pays for it. Turn lengths
are configurable: short decision turns beside long report turns, and tool outputs of any length (e.g.
a 4-token answer next to a 600-token observation).

The cue -> choice map is drawn once from ``task_seed`` (every choice is used). Success means every
decision right. The first non-blank character of a decision turn is the choice. A tiny Llama (2 layers,
hidden 64) trained from scratch with the trainer's defaults learns the default task within 200 steps on
some seeds (MPO: success 0.95 and 0.98 over the last 20 steps on seeds 0 and 2) and not yet on others
(0.21 on seed 1, where it still picks one choice whatever the cue); docs/train.md has the figures.
"""

from __future__ import annotations

import functools
import random

from typing import Any

from critic_audit.errors import ConfigError

__all__ = ["CreditAssignmentEnv", "credit_tokenizer"]

CHOICES = "LRUD"
CUES = "ABCEFGHJ"
FILLER = ("x", "y", "z", "w")
WORDS = ("pick", "or", "cue", "ok", "report", "done")
SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "[UNK]")

#: ChatML (as SmolLM2-Instruct) without a default system prompt.
CHATML = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


@functools.lru_cache(maxsize=4)
def credit_tokenizer() -> Any:
    """A word-level tokenizer (about 35 tokens) with a ChatML chat template; spaces and newlines are
    tokens of their own, so ``decode(encode(text)) == text`` for text made of its words."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = [*SPECIALS, " ", "\n", "system", "user", "assistant", "tool", *WORDS, *CHOICES, *CUES, *FILLER]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(vocab)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"\s"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   bos_token="<|im_start|>", unk_token="[UNK]")
    fast.chat_template = CHATML
    return fast


class CreditAssignmentEnv:
    """Decisions early, reward late (see the module docstring).

    Args:
        num_decisions: decision turns (each decided by its own cue).
        num_choices: choices per decision (2..4: L R U D).
        num_cues: distinct cue letters (2..8).
        report_turns: free-text turns after the decisions (irrelevant to the reward).
        decision_tokens: token limit of a decision turn.
        report_tokens: token limit of a report turn.
        observation_tokens: filler tokens in the tool output after each decision.
        reward: ``fraction`` (right decisions / num_decisions) or ``all`` (1 if all right, else 0).
        format_bonus: added to the final reward times the fraction of decision turns that start with a
            valid choice letter (right or wrong) [ours: a random 2-layer model over ~35 tokens rarely
            names a choice at all; the bonus still arrives only at the end]. 0 turns it off.
        task_seed: draws the cue -> choice map.

    Raises:
        ConfigError: a value outside its range.
    """

    name = "credit"

    def __init__(self, num_decisions: int = 2, num_choices: int = 2, num_cues: int = 2, report_turns: int = 1,
                 decision_tokens: int = 2, report_tokens: int = 12, observation_tokens: int = 12,
                 reward: str = "fraction", format_bonus: float = 0.1, task_seed: int = 0) -> None:
        if not 1 <= num_decisions <= 64:
            raise ConfigError(f"env.kwargs.num_decisions = {num_decisions} must be in 1..64")
        if not 2 <= num_choices <= len(CHOICES):
            raise ConfigError(f"env.kwargs.num_choices = {num_choices} must be in 2..{len(CHOICES)}")
        if not 2 <= num_cues <= len(CUES):
            raise ConfigError(f"env.kwargs.num_cues = {num_cues} must be in 2..{len(CUES)}")
        for n in ("report_turns", "observation_tokens"):
            if locals()[n] < 0:
                raise ConfigError(f"env.kwargs.{n} = {locals()[n]} must be >= 0")
        for n in ("decision_tokens", "report_tokens"):
            if locals()[n] < 1:
                raise ConfigError(f"env.kwargs.{n} = {locals()[n]} must be >= 1")
        if reward not in ("fraction", "all"):
            raise ConfigError(f"env.kwargs.reward = {reward!r}", fix="use fraction or all")
        self.num_decisions, self.num_choices, self.num_cues = num_decisions, num_choices, num_cues
        self.report_turns, self.decision_tokens, self.report_tokens = report_turns, decision_tokens, report_tokens
        if not 0 <= format_bonus <= 1:
            raise ConfigError(f"env.kwargs.format_bonus = {format_bonus} must be in [0, 1]", fix="e.g. 0.1 (the default)")
        self.observation_tokens, self.reward_kind, self.format_bonus = observation_tokens, reward, format_bonus
        self.valid: list[bool] = []
        task = random.Random(task_seed)
        answers = [i % num_choices for i in range(num_cues)]
        task.shuffle(answers)
        #: the right choice letter of every cue letter
        self.answer = {CUES[i]: CHOICES[a] for i, a in enumerate(answers)}
        self.turn = 0
        self.right: list[bool] = []

    def tokenizer(self) -> Any:
        """The environment's word-level tokenizer (for a ``tiny`` policy)."""
        return credit_tokenizer()

    def turn_token_limit(self, turn: int) -> int:
        """Decision turns are short, report turns long."""
        return self.decision_tokens if turn < self.num_decisions else self.report_tokens

    def _cue(self) -> dict[str, str]:
        return {"role": "user", "content": f"cue {self.cues[self.turn]}"}

    def reset(self, seed: int) -> list[dict[str, str]]:
        """The system prompt and the first cue."""
        self.rng = random.Random(seed)
        self.cues = [CUES[self.rng.randrange(self.num_cues)] for _ in range(self.num_decisions)]
        self.turn, self.right, self.valid = 0, [], []
        system = {"role": "system", "content": "pick " + " or ".join(CHOICES[: self.num_choices])}
        return [system, self._cue()]

    def step(self, assistant_text: str) -> tuple[list[dict[str, str]], float, bool, dict[str, Any]]:
        """Score a decision (no reward yet) or a report turn; the reward comes with ``done``."""
        obs: list[dict[str, str]] = []
        if self.turn < self.num_decisions:
            choice = assistant_text.strip()[:1]
            self.right.append(choice == self.answer[self.cues[self.turn]])
            self.valid.append(choice != "" and choice in CHOICES[: self.num_choices])
            filler = " ".join(self.rng.choice(FILLER) for _ in range(self.observation_tokens))
            obs.append({"role": "tool", "content": ("ok " + filler).strip()})
        self.turn += 1
        if self.turn < self.num_decisions:
            obs.append(self._cue())
        elif self.turn < self.num_decisions + self.report_turns:
            obs.append({"role": "user", "content": "report"})
        else:
            n_right = sum(self.right)
            success = n_right == self.num_decisions
            reward = n_right / self.num_decisions if self.reward_kind == "fraction" else float(success)
            reward += self.format_bonus * sum(self.valid) / self.num_decisions
            return [], float(reward), True, {"success": success, "right": n_right}
        return obs, 0.0, False, {}


