"""The demo critic's fit data (sample_data/critic_fit/) is kept apart from the demo's audited sample:
no task / question on both sides, and the Reflexion subset reads as documented (SOURCE.md)."""

import re
from pathlib import Path

from critic_audit.io.inputs import read_inputs

ROOT = Path(__file__).resolve().parent.parent
FIT = ROOT / "sample_data" / "critic_fit"


def _norm(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", " ", text.lower()).strip()


def _question(conv) -> str:
    if conv.metadata and conv.metadata.get("question"):
        return _norm(conv.metadata["question"])
    first = next(m for m in conv.messages if m["role"] == "user")["content"]
    return _norm(first.removeprefix("Question:"))


def test_reflexion_subset_reads_as_documented():
    convs = read_inputs([FIT / "wikipedia_react_hotpotqa_fit.txt"])
    assert len(convs) == 93
    assert sum(c.success for c in convs) == 32
    assert len({c.group_id for c in convs}) == 93  # one run per question
    assert all(c.metadata["trial"] == 1 for c in convs)


def test_no_hotpotqa_question_on_both_sides():
    sample = read_inputs([ROOT / "sample_data" / "fireact_hotpotqa"])
    fit = read_inputs([FIT / "fireact_gpt35_fit.json"])
    refl = read_inputs([FIT / "wikipedia_react_hotpotqa_fit.txt"])
    audited = {_question(c) for c in sample}
    assert len(audited) == 40
    assert not audited & {_question(c) for c in fit}
    assert not audited & {_question(c) for c in refl}
    assert not {_question(c) for c in fit} & {_question(c) for c in refl}  # one question, one source


def test_no_tau_bench_task_on_both_sides():
    sample = read_inputs([ROOT / "sample_data" / "tau_bench_airline"])
    fit = read_inputs([FIT / "tau_airline_fit.json"])
    assert len(fit) == 128
    tasks = {c.group_id for c in fit}
    assert len(tasks) == 32 and not tasks & {c.group_id for c in sample}
