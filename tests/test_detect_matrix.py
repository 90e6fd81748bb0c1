"""The detection confusion matrix (issue 34.10): every sample file of every format in ``tests/data`` is
claimed by exactly its own format (an empty off-diagonal), and a file that two formats' rules accept is
refused in one line naming them and ``--format``.

HOW TO ADD A FORMAT OR A SAMPLE: add one row to :data:`SAMPLES` for every file you put under
``tests/data`` (the path relative to ``tests/data`` -> what a folder search does with it):

* the format name that must read it (``"tau2"``, ``"inspect"``, ...): the test asserts that this format's
  rule accepts the file and that no other format's rule does (``critic_audit.io.detect.claims_of`` /
  ``claimants``; the generic ``chat`` layout is a fallback, claiming only what no producer claims);
* ``"skip:<reason>"``: the folder search passes it over with that reason (``skip:not_rollout_file`` for a
  README-like file, ``skip:harbor_native_log``, ...), listed in ``input.skipped_file_list``;
* ``"companion"``: read with its rollouts, neither a rollout file nor skipped (a Harbor trial's
  ``verifier/reward.txt``, a vf-eval ``metadata.json``).

``test_every_sample_has_a_row`` fails for a file without a row, so a new sample cannot skip the matrix.
``LICENSE``, ``SOURCE.md`` and ``README.md`` files need no row.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
from typer.testing import CliRunner

from critic_audit.cli import app
from critic_audit.errors import InputError
from critic_audit.io import ReadOptions, ReadReport
from critic_audit.io.content import by_content, is_compressed
from critic_audit.io.detect import claimants, claims_of, detect_file, resolve_inputs
from critic_audit.io.formats import FORMATS
from critic_audit.io.inputs import read_all

from conftest import DATA

_NO_ROW = {"LICENSE", "SOURCE.md", "README.md"}
_ALL_SUFFIXES = tuple(sorted({s for f in FORMATS.values() for s in f.suffixes}, key=len, reverse=True))

#: Every sample file of tests/data -> the format that reads it, ``skip:<reason>`` or ``companion``.
SAMPLES: dict[str, str] = {
    "areal/make_samples.py": "skip:not_rollout_file",
    "areal/trial1/rollout/3/7.jsonl": "areal",
    "areal/trial1/rollout/4/8.jsonl": "areal",
    "areal/trial1/rollout/5/9.jsonl": "areal",
    "atif/job-demo/config.json": "skip:not_rollout_file",
    "atif/job-demo/trial-1/agent/trajectory.json": "atif",
    "atif/job-demo/trial-1/verifier/reward.txt": "companion",
    "atif/job-demo/trial-2/agent/trajectory.json": "atif",
    "harbor/job-golden/config.json": "skip:not_rollout_file",
    "harbor/job-golden/hello-world__linear/agent/trajectory.cont-1.json": "atif",
    "harbor/job-golden/hello-world__linear/agent/trajectory.json": "atif",
    "harbor/job-golden/hello-world__linear/result.json": "companion",
    "harbor/job-golden/hello-world__openhands/agent/trajectory.json": "atif",
    "harbor/job-golden/hello-world__openhands/verifier/reward.txt": "companion",
    "harbor/job-golden/hello-world__summ/agent/trajectory.json": "atif",
    "harbor/job-golden/hello-world__summ/agent/trajectory.summarization-1-answers.json": "atif",
    "harbor/job-golden/hello-world__summ/agent/trajectory.summarization-1-questions.json": "atif",
    "harbor/job-golden/hello-world__summ/agent/trajectory.summarization-1-summary.json": "atif",
    "harbor/job-golden/hello-world__summ/verifier/reward.txt": "companion",
    "harbor/job-golden/hello-world__timeout/agent/episode-0/debug.json": "skip:harbor_native_log",
    "harbor/job-golden/hello-world__timeout/agent/episode-0/prompt.txt": "skip:harbor_native_log",
    "harbor/job-golden/hello-world__timeout/agent/trajectory.json": "atif",
    "harbor/job-golden/result.json": "companion",
    "harbor/traces/hello-world-invalid-json.traces.json": "skip:harbor_traces_export",
    "harbor_holdout/job-holdout/hello-world__invalid/agent/gemini-cli.trajectory.json": "skip:gemini_cli_log",
    "harbor_holdout/job-holdout/hello-world__invalid/agent/trajectory.json": "atif",
    "harbor_holdout/job-holdout/hello-world__invalid/verifier/reward.txt": "companion",
    "harbor_holdout/job-holdout/hello-world__nofc/agent/mini-swe-agent.trajectory.json": "skip:harbor_native_log",
    "harbor_holdout/job-holdout/hello-world__nofc/agent/trajectory.json": "atif",
    "harbor_holdout/job-holdout/hello-world__nofc/verifier/reward.txt": "companion",
    "hotpotqa_distractor_rl/ReAct_base_subset_2_trials.txt": "react",
    "hotpotqa_distractor_rl/hotpotqa_distractor_sample4.jsonl": "skip:not_rollout_file",
    "inspect/2025-02-11T15-18-04-05-00_popularity_mj7khqpMM4GBCfVQozKgzB.eval": "inspect",
    "inspect/2025-05-12T20-28-13-04-00_popularity.json": "inspect",
    "inspect/2025-05-12T20-28-26-04-00_security-guide.json": "inspect",
    "inspect/log_images.json": "inspect",
    "inspect/log_streaming.eval": "inspect",
    "inspect_unscored/2025-02-11T15-17-00-05-00_popularity_dPiJifoWeEQBrfWsAopzWr.eval": "inspect",
    "mini_swe_agent_2025/github_issue.traj.json": "swe",
    "mini_swe_agent_2025/local.traj.json": "swe",
    "nemo_gym/aviary/example_rollouts.jsonl": "responses",
    "nemo_gym/blackjack/example_rollouts.jsonl": "responses",
    "nemo_gym/blackjack/example_rollouts_materialized_inputs.jsonl": "skip:nemo_gym_task_inputs",
    "nemo_gym/competitive_coding_challenges/example_rollouts.jsonl": "responses",
    "nemo_gym/graphwalks/example_rollouts.jsonl": "responses",
    "nemo_gym/hermes_agent/example_math_rollouts.jsonl": "responses",
    "openhands/multi_swe_bench/output.jsonl": "openhands",
    "openhands/native/openhands_trajectory.json": "openhands",
    "openhands/opendevin_2024/output.jsonl": "openhands",
    "openhands_sdk/events.jsonl": "openhands",
    "openhands_trajs/basic_gui_mode.json": "openhands",
    "openhands_trajs/basic_interactions.json": "openhands",
    "openhands_trajs/wrong_initial_state.json": "openhands",
    "openhands_resolver/output.jsonl": "openhands",
    "prime_rl/make_samples.py": "skip:not_rollout_file",
    "prime_rl/outputs/token_exports/step_3/STABLE": "companion",
    "prime_rl/outputs/token_exports/step_3/rank_0.jsonl": "prime_tokens",
    "prime_rl/outputs_v0/token_exports/rank_0.jsonl": "prime_tokens",
    "prime_rl_traces/make_samples.py": "skip:not_rollout_file",
    # all/ beside effective/: the same episodes; a folder search reads effective/ (all/ when named)
    "prime_rl_traces/episode_v2026_08_21/rollouts/step_2/train/all/traces.jsonl": "skip:prime_rl_all_beside_effective",
    "prime_rl_traces/episode_v2026_08_21/rollouts/step_2/train/effective/traces.jsonl": "vf_traces",
    "prime_rl_traces/trace_v2026_08_15/rollouts/step_1/train/effective/traces.jsonl": "vf_traces",
    "prime_rl_traces/rollout_v2026_07_09/rollouts/step_0/train/effective/traces.jsonl": "vf_traces",
    "prime_rl_traces/stream_v2026_09_02/monitors/file/metrics.jsonl": "skip:prime_rl_metrics",
    "prime_rl_traces/stream_v2026_09_02/monitors/file/traces/annotations/orchestrator.index.jsonl": "skip:prime_rl_trace_index",
    "prime_rl_traces/stream_v2026_09_02/monitors/file/traces/annotations/orchestrator/00000.jsonl": "skip:prime_rl_trace_annotations",
    "prime_rl_traces/stream_v2026_09_02/monitors/file/traces/live/t9.jsonl": "skip:prime_rl_live_trace",
    "prime_rl_traces/stream_v2026_09_02/monitors/file/traces/stream.index.jsonl": "skip:prime_rl_trace_index",
    "prime_rl_traces/stream_v2026_09_02/monitors/file/traces/stream/00000.jsonl.zst": "vf_traces",  # a sealed chunk: zstd, read by content
    "prime_rl_traces/stream_v2026_09_02/monitors/file/traces/stream/00001.jsonl": "vf_traces",
    "sharegpt_llamafactory/glaive_toolcall_en_demo_first8.json": "chat",
    "swe/gpt4__swe-agent-test-repo__default_from_url__t-0.00__p-0.95__c-3.00__install-1/"
    "6e44b9__sweagenttestrepo-1c2844.traj": "swe",
    "swe/gpt4__swe-agent__test-repo__default_from_url__t-0.00__p-0.95__c-3.00__install-1/"
    "swe-agent__test-repo-i1.traj": "swe",
    "swe/mini-swe-agent/mini-swe-agent-trajectory.json": "swe",
    "swe_holdout/demonstrations/ctf/misc/networking_1.traj": "swe",
    "swe_holdout/demonstrations/function_calling_simple.traj": "swe",
    "swe_holdout/demonstrations/replay__marshmallow-code__marshmallow-1867__xml_sys-env_window100__t-0.20__p-0.95__c-2.00__install-1/marshmallow-code__marshmallow-1867.traj": "swe",
    "tau2/telecom_gpt-4o_subset.json": "tau2",
    "tau_bench/gpt-4o-airline_subset.json": "taubench",
    "verifiers/continuation-quality--meta-llama--llama-3.1-405b/3762eafa/metadata.json": "companion",
    "verifiers/continuation-quality--meta-llama--llama-3.1-405b/3762eafa/results.jsonl": "verifiers",
    "verifiers/math-python--gpt-4.1-mini/578769a7/metadata.json": "companion",
    "verifiers/math-python--gpt-4.1-mini/578769a7/results.jsonl": "verifiers",
    "verifiers/tool-test--gpt-4.1-mini/066dba27/metadata.json": "companion",
    "verifiers/tool-test--gpt-4.1-mini/066dba27/results.jsonl": "verifiers",
    "verifiers/wordle--gpt-4.1-mini/9a56fe55/metadata.json": "companion",
    "verifiers/wordle--gpt-4.1-mini/9a56fe55/results.jsonl": "verifiers",
    "verifiers_holdout/arc-agi-3--gpt-4.1-mini/7a5fcb34/metadata.json": "companion",
    "verifiers_holdout/arc-agi-3--gpt-4.1-mini/7a5fcb34/results.jsonl": "verifiers",
    "verifiers_holdout/mcp-env--gpt-4.1-mini/468ee950/metadata.json": "companion",
    "verifiers_holdout/mcp-env--gpt-4.1-mini/468ee950/results.jsonl": "verifiers",
    "verifiers_holdout/wordle--qwen--qwen3-30b-a3b-thinking-2507/50bdff53/metadata.json": "companion",
    "verifiers_holdout/wordle--qwen--qwen3-30b-a3b-thinking-2507/50bdff53/results.jsonl": "verifiers",
    "verl_rollouts/make_samples.py": "skip:not_rollout_file",
    "verl_rollouts/rollout_data/1.jsonl": "verl_rollouts",
    "verl_rollouts/rollout_data/2.jsonl": "verl_rollouts",
    "verl_rollouts/sglang_multiturn_doc/1.jsonl": "verl_rollouts",
}


def _samples() -> list[str]:
    return sorted(str(p.relative_to(DATA)) for p in DATA.rglob("*")
                  if p.is_file() and p.name not in _NO_ROW and not any(x.startswith(".") for x in p.parts))


def _folder_verdicts() -> dict[str, str]:
    """What one lenient folder search over tests/data does with each file: its format, ``skip:<reason>``,
    or ``companion`` (neither read nor listed)."""
    rep = ReadReport()
    [res] = resolve_inputs([DATA], ReadOptions(lenient=True), rep)
    out = {str((f.origin or f.path).relative_to(DATA)): f.format for f in res.files}  # origin: a compressed file
    out.update({str(Path(f["path"]).relative_to(DATA)): f"skip:{f['reason']}" for f in rep.skipped_file_list})
    return out


def _as_read(path: Path) -> Path:
    """A compressed sample's decompressed copy (the file the rules see: read by content), else ``path``."""
    return by_content(path, _ALL_SUFFIXES) if is_compressed(path) else path


def test_every_sample_has_a_row():
    missing = [f for f in _samples() if f not in SAMPLES]
    stale = [f for f in SAMPLES if not (DATA / f).is_file()]
    assert not missing, f"add a row to SAMPLES for each new sample file: {missing}"
    assert not stale, f"rows for files that are gone: {stale}"


def test_confusion_matrix_has_an_empty_off_diagonal():
    """Rows: the format each sample belongs to; columns: the formats whose rule claims it."""
    matrix: Counter = Counter()
    for rel, want in SAMPLES.items():
        if want.startswith(("skip:", "companion")):
            continue
        got = claimants(claims_of(_as_read(DATA / rel)))
        for c in got or ["(none)"]:
            matrix[(want, c)] += 1
    off = {k: v for k, v in matrix.items() if k[0] != k[1]}
    assert not off, f"files claimed by another format (row format, claiming format): {off}"
    formats = {v for v in SAMPLES.values() if not v.startswith(("skip:", "companion"))}
    assert {k[0] for k in matrix} == formats


@pytest.mark.parametrize("rel", sorted(SAMPLES))
def test_each_sample_is_claimed_by_its_own_format(rel):
    want = SAMPLES[rel]
    path = _as_read(DATA / rel)
    if not want.startswith(("skip:", "companion")):
        assert claimants(claims_of(path)) == [want]
        assert detect_file(path) == want
    elif want == "skip:not_rollout_file":
        assert claimants(claims_of(path)) == []  # no format's rule accepts it


def test_a_folder_search_does_what_the_table_says():
    got = {k: v for k, v in _folder_verdicts().items() if Path(k).name not in _NO_ROW}
    want = {k: v for k, v in SAMPLES.items() if v != "companion"}
    assert got == want
    assert not [k for k, v in SAMPLES.items() if v == "companion" and k in got]


# --------------------------------------------------------------------------------------------- producer rules


def test_an_areal_row_is_not_a_verifiers_completion():
    # AReaL trajectory dumps hold prompt / completion strings and a reward beside multi-turn segments:
    # the verifiers rule must not read them as one single-turn completion
    from critic_audit.io.verifiers import is_verifiers_record

    areal = {"prompt": "<|im_start|>user\nsolve<|im_end|>", "completion": "I call the tool", "reward": 1.0,
             "segments": [{"role": "prompt"}, {"role": "gen"}, {"role": "context"}, {"role": "gen"}],
             "head_version": 3, "tail_version": 4, "version_rle": [[3, 10], [4, 12]]}
    bare = {"prompt": "solve", "completion": "42", "reward": 1.0}  # a text pair and a reward: no producer named
    vf = {"example_id": 0, "prompt": "solve", "completion": "42", "reward": 1.0, "task": "default"}
    assert [is_verifiers_record(r) for r in (areal, bare, vf)] == [False, False, True]


def _hybrid(tmp_path: Path) -> Path:
    """A row that two producers' rules both accept: an OpenHands EvalOutput row that also carries
    verifiers' prompt / completion message lists."""
    row = {"instance_id": "t1", "history": [{"id": 0, "source": "user", "action": "message",
                                             "args": {"content": "hi"}, "message": "hi"}],
           "prompt": [{"role": "user", "content": "hi"}], "completion": [{"role": "assistant", "content": "ok"}],
           "reward": 1.0, "test_result": {"resolved": True}}
    p = tmp_path / "run" / "rows.jsonl"
    p.parent.mkdir()
    p.write_text(json.dumps(row) + "\n")
    return p


def test_an_ambiguous_file_is_refused_in_one_line(tmp_path):
    p = _hybrid(tmp_path)
    assert claimants(claims_of(p)) == ["openhands", "verifiers"]
    with pytest.raises(InputError) as e:
        detect_file(p)
    assert "openhands" in str(e.value) and "verifiers" in str(e.value) and "--format openhands|verifiers" in str(e.value)
    res = CliRunner().invoke(app, ["check", str(p.parent), "--json"])
    assert res.exit_code != 0
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "ambiguous" in lines[0] and "--format" in lines[0]
    # the choice it asks for reads it; --lenient skips and counts it
    read = read_all([p.parent], ReadOptions(format="openhands"))
    assert [c.trajectory_id for c in read.conversations] == ["t1"]
    rep = ReadReport()
    with pytest.raises(InputError, match="holds no rollout file"):
        read_all([p.parent], ReadOptions(lenient=True), report=rep)
    assert rep.skipped_files == {"ambiguous_format": 1}
