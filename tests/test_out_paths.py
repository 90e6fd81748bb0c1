"""Output paths of every command that writes (review 2: items 1, 2, 7, 8, 14, 15, 16, 17).

An output never replaces what the command reads (the one guard :func:`critic_audit.outputs.refuse_input_clash`),
a wrong --out is one line naming its real cause, and a re-audit finds its inputs from any folder.
"""

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from critic_audit.cli import app
from critic_audit.errors import ConfigError
from critic_audit.outputs import refuse_input_clash
from test_monitor import _assert_one_line_error

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[1]
STEP = ROOT / "sample_data" / "credit_ppo_run" / "rollouts" / "step_000019"  # verl-style tables with values


def _run(*args):
    return runner.invoke(app, [str(a) for a in args])


def _one_line_error(res, *needles, code: int = 1) -> str:
    """monitor's test of one clean error line (exit ``code``, each needle in it); returns that line."""
    _assert_one_line_error(res, *needles, code=code)
    return (res.stderr if hasattr(res, "stderr") else res.output).strip()


def _chat(path: Path, n: int = 4) -> Path:
    rows = [{"id": f"t{i}", "reward": float(i % 2), "messages": [{"role": "user", "content": f"q{i}"},
                                                                  {"role": "assistant", "content": f"a{i}"}]}
            for i in range(n)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture(scope="module")
def audit(tmp_path_factory) -> Path:
    """A streamed analyze folder of one sample checkpoint (no critic: its tables carry values)."""
    out = tmp_path_factory.mktemp("audit") / "A"
    res = _run("analyze", STEP, "--out", out, "--no-plots", "--bootstrap", 20)
    assert res.exit_code == 0, res.output
    assert (out / "turns.parquet").is_file() and (out / "trajectories.parquet").is_file()
    return out


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


def test_monitor_never_replaces_a_file_of_the_audit_it_reads(audit):
    """Item 1: `monitor A --out A/trajectories.parquet` replaced the audit's own table (no --overwrite)."""
    before = _snapshot(audit)
    for name in ("trajectories.parquet", "turns.parquet"):
        for extra in ((), ("--overwrite",)):
            _one_line_error(_run("monitor", audit, "--out", audit / name, "--bootstrap", 20, *extra),
                            f"--out {audit / name} is a file inside the input folder {audit}",
                            "never replaced, even with --overwrite", "(fix: pass a path outside")
    assert _snapshot(audit) == before  # nothing changed, byte for byte
    # a file of another kind outside the audit folder (an audit's table copied away) needs --overwrite
    other = audit.parent / "copy.parquet"
    shutil.copy(audit / "trajectories.parquet", other)
    _one_line_error(_run("monitor", audit, "--out", other, "--bootstrap", 20), "not replaced without --overwrite")
    assert other.read_bytes() == before["trajectories.parquet"]
    assert _run("monitor", audit, "--out", other, "--overwrite", "--bootstrap", 20).exit_code == 0
    # a new file inside the audit folder is refused too: analyze --out AUDIT --overwrite would delete it
    # (review 3 new #2)
    new = audit / "turn_scores.parquet"
    _one_line_error(_run("monitor", audit, "--out", new, "--bootstrap", 20), "a folder critic-audit wrote")
    assert not new.exists() and _snapshot(audit) == before
    assert _run("plot", audit).exit_code == 0  # the folder still reads


def test_check_never_replaces_its_input(tmp_path):
    """Item 2: `check chat.jsonl --out chat.jsonl --overwrite` replaced the rollouts with the report."""
    chat = _chat(tmp_path / "chat.jsonl")
    before = chat.read_bytes()
    for extra in ((), ("--overwrite",)):
        line = _one_line_error(_run("check", chat, "--out", chat, *extra))
        assert "is (or holds) the input" in line or "not a report critic-audit check wrote" in line
    _one_line_error(_run("check", chat, "--out", chat, "--overwrite"), f"--out {chat} is (or holds) the input {chat}",
                    "(fix: pass another --out, e.g. --out check.json)")
    assert chat.read_bytes() == before
    # a folder of rollouts: an existing file in it is never replaced either; a new one is written
    d = tmp_path / "runs"
    d.mkdir()
    inner = _chat(d / "a.jsonl")
    _one_line_error(_run("check", d, "--out", inner, "--overwrite"), "inside the input folder")
    assert inner.read_bytes() == before
    assert _run("check", chat, "--out", tmp_path / "check.json").exit_code == 0
    assert json.loads((tmp_path / "check.json").read_text())["tool"] == "critic-audit check"


def test_analyze_and_writers_share_the_guard(tmp_path):
    """Every writer goes through refuse_input_clash: analyze (its folder holds the input), fit-critic
    (--out / --head-out on the rollouts), train (--out on its config), before any work."""
    chat = _chat(tmp_path / "chat.jsonl")
    _one_line_error(_run("analyze", chat, "--out", tmp_path), f"--out {tmp_path} is (or holds) the input {chat}")
    _one_line_error(_run("fit-critic", chat, "--out", chat), "is (or holds) the input")
    _one_line_error(_run("fit-critic", chat, "--out", tmp_path / "c", "--head-out", chat),
                    f"--head-out {chat} is (or holds) the input")
    cfg = tmp_path / "run.toml"
    cfg.write_text("steps = 1\n")
    _one_line_error(_run("train", "--out", cfg, "--config", cfg), f"--out {cfg} is (or holds) the input {cfg}")
    head = tmp_path / "head.safetensors"
    head.write_bytes(b"x")
    _one_line_error(_run("build-critic", "--head", head, "--out", tmp_path), "is (or holds) the input")
    assert chat.read_bytes() and cfg.read_text() == "steps = 1\n" and head.read_bytes() == b"x"
    # the library function: the same lines
    with pytest.raises(ConfigError, match="is a file inside the input folder"):
        refuse_input_clash(chat, [tmp_path])
    refuse_input_clash(tmp_path / "new.json", [tmp_path])  # a new file inside an input folder: fine
    refuse_input_clash(tmp_path / "elsewhere", [chat])


def test_reaudit_finds_its_inputs_from_any_folder(tmp_path, monkeypatch):
    """Item 7: `analyze AUDIT --scope all` from another folder said the inputs were not there
    (config.json and summary.json recorded them relative to the first run's folder)."""
    work = tmp_path / "work"
    shutil.copytree(STEP, work / "rollouts")
    monkeypatch.chdir(work)
    assert _run("analyze", "rollouts", "--out", "audit", "--no-plots", "--bootstrap", 20).exit_code == 0
    cfg = json.loads((work / "audit" / "config.json").read_text())
    summ = json.loads((work / "audit" / "summary.json").read_text())
    assert cfg["inputs"] == [str(work / "rollouts")] == summ["inputs"] and cfg["cwd"] == str(work)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    res = _run("analyze", work / "audit", "--scope", "all", "--out", "re", "--no-plots", "--bootstrap", 20)
    assert res.exit_code == 0, res.output
    again = json.loads((elsewhere / "re" / "summary.json").read_text())
    assert again["scope"] == "all" and again["inputs"] == [str(work / "audit")]  # the folder audited

    def old_style(cwd: str | None) -> None:  # a folder of an older version: relative inputs
        for name in ("summary.json", "config.json"):
            d = json.loads((work / "audit" / name).read_text())
            d["inputs"] = ["rollouts"]
            d.pop("cwd", None)
            if cwd is not None and name == "config.json":
                d["cwd"] = cwd
            (work / "audit" / name).write_text(json.dumps(d))

    # relative to the recorded cwd (the audit folder moved away from it, so only that cwd finds them)
    old_style(str(work))
    shutil.move(work / "audit", tmp_path / "far")
    res = _run("analyze", tmp_path / "far", "--scope", "all", "--out", "re2", "--no-plots", "--bootstrap", 20)
    assert res.exit_code == 0, res.output
    # no cwd recorded: relative to the folder holding the audit folder
    shutil.move(tmp_path / "far", work / "audit")
    old_style(None)
    res = _run("analyze", work / "audit", "--scope", "all", "--out", "re3", "--no-plots", "--bootstrap", 20)
    assert res.exit_code == 0, res.output
    # inputs nowhere: the line still says so
    shutil.move(work / "rollouts", tmp_path / "gone")
    _one_line_error(_run("analyze", work / "audit", "--scope", "all", "--out", "re4", "--no-plots"),
                    "are not there to read again")


def test_out_errors_name_the_real_cause(tmp_path):
    """Items 8 and 15: /proc/xyz was "in use by another process", a file parent "cannot lock (File
    exists)", and an empty --out "'.' is the current folder"."""
    chat = _chat(tmp_path / "chat.jsonl")
    if Path("/proc").is_dir():
        # review 3 new #8: the OS's reason, and no chmod advice when the cause is not permissions
        line = _one_line_error(_run("analyze", chat, "--out", "/proc/critic_audit_xyz"),
                               "cannot create /proc/critic_audit_xyz: the system refuses a new file in /proc (",
                               "(fix: pass another --out")
        assert "in use" not in line and "chmod" not in line and "does not let it be made" not in line
    _one_line_error(_run("analyze", chat, "--out", chat / "x"),
                    f"cannot create {chat / 'x'}: its parent {chat} is a file, not a folder", "(fix: pass another --out")
    # (exit 1, as every refused output path)
    _one_line_error(_run("analyze", chat, "--out", ""), "--out is empty ('')", "(fix: pass a folder of its own")
    _one_line_error(_run("monitor", tmp_path, "--out", ""), "--out is empty", "turn_scores.parquet")
    _one_line_error(_run("check", chat, "--out", ""), "--out is empty", "e.g. --out check.json")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["chat.jsonl"]


def test_check_out_with_a_trailing_slash_is_a_folder(tmp_path):
    """Item 14: `check --out newdir/` wrote a file named newdir. A trailing slash names a folder, and the
    report is one file (docs/check.md: a folder is refused before the run)."""
    chat = _chat(tmp_path / "chat.jsonl")
    _one_line_error(_run("check", chat, "--out", f"{tmp_path}/newdir/"), "ends in '/', so it names a folder",
                    f"(fix: pass a file name, e.g. --out {tmp_path}/newdir/check.json)")
    _one_line_error(_run("monitor", tmp_path, "--out", f"{tmp_path}/scores/"), "ends in '/'")
    assert not (tmp_path / "newdir").exists() and not (tmp_path / "scores").exists()


def test_option_errors_carry_a_fix_and_overwrite_is_one_flag():
    """Item 16: `check --max-turn-tokens 0` and `fit-critic --method bogus` lacked "(fix: ...)";
    fit-critic / build-critic offered --overwrite/--no-overwrite where the others offer --overwrite."""
    _one_line_error(_run("check", "x.jsonl", "--max-turn-tokens", 0), "--max-turn-tokens 0 must be >= 1",
                    "(fix: pass the sampler's per-turn max_tokens", code=2)
    _one_line_error(_run("check", "x.jsonl", "--max-response-tokens", 0), "(fix: ", code=2)
    _one_line_error(_run("fit-critic", "x.jsonl", "--out", "c", "--method", "bogus"),
                    "--method must be one of head, layers, lora, got 'bogus'", "(fix: use --method head", code=2)
    _one_line_error(_run("fit-critic", "x.jsonl", "--out", "c", "--weighting", "bogus"), "(fix: ", code=2)
    for cmd in ("fit-critic", "build-critic", "analyze", "check", "monitor"):
        res = runner.invoke(app, [cmd, "--help"], env={"COLUMNS": "200"})
        assert "--overwrite" in res.output and "--no-overwrite" not in res.output, cmd
    _one_line_error(_run("fit-critic", "x.jsonl", "--out", "c", "--no-overwrite"), "No such option", code=2)


def test_audit_folder_without_trajectories_names_it(audit, tmp_path):
    """Item 17: an audit folder missing trajectories.parquet blamed turns.parquet's columns."""
    broken = tmp_path / "B"
    shutil.copytree(audit, broken)
    (broken / "trajectories.parquet").unlink()
    line = _one_line_error(_run("analyze", broken, "--out", tmp_path / "C", "--no-plots"),
                           f"{broken / 'trajectories.parquet'}: no such file", "(fix: restore trajectories.parquet")
    assert "lacks column" not in line
    assert not (tmp_path / "C").exists()


def test_file_outputs_are_checked_before_the_work(tmp_path, audit):
    """Item 8 for the file outputs (monitor, check, fit-critic --head-out) and fit-critic's folder: the
    real cause, before the work (a fit refused at its end would lose it). The chat file below holds one
    trajectory, too few to fit: the output's line coming first shows the order."""
    chat = _chat(tmp_path / "chat.jsonl", n=1)
    f = tmp_path / "f.txt"
    f.write_text("x")
    for args in (("monitor", audit, "--out", f / "x.parquet", "--bootstrap", 20),
                 ("check", chat, "--out", f / "r.json"),
                 ("fit-critic", chat, "--out", f / "c"),
                 ("fit-critic", chat, "--out", tmp_path / "c", "--head-out", f / "h.safetensors")):
        _one_line_error(_run(*args), "cannot create", f"its parent {f} is a file, not a folder")
    if Path("/proc").is_dir():
        for args in (("monitor", audit, "--out", "/proc/x.parquet", "--bootstrap", 20),
                     ("check", chat, "--out", "/proc/r.json"), ("fit-critic", chat, "--out", "/proc/c")):
            line = _one_line_error(_run(*args), "cannot create /proc/", "the system refuses a new file in /proc")
            assert "chmod" not in line
    full = tmp_path / "full"
    full.mkdir()
    (full / "mine.txt").write_text("mine")
    _one_line_error(_run("fit-critic", chat, "--out", full), "output folder exists and is not empty", "--overwrite")
    _one_line_error(_run("fit-critic", chat, "--out", tmp_path / "c", "--head-out", f),
                    f"--head-out {f} exists; it is not replaced without --overwrite")
    _one_line_error(_run("fit-critic", chat, "--out", tmp_path / "c", "--head-out", full), "is a folder")
    _one_line_error(_run("fit-critic", chat, "--out", tmp_path / "c"), "only 1 trajectories")  # then the input
    assert f.read_text() == "x" and (full / "mine.txt").read_text() == "mine" and not (tmp_path / "c").exists()
