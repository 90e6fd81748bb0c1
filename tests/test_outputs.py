"""Output folders (issue 12, items 1 and 5): only what critic-audit provably wrote is replaced or removed.

The destructive cases run against a temporary HOME and project folder (monkeypatch), never the real ones.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from critic_audit import outputs
from critic_audit.cli import app
from critic_audit.errors import ConfigError

runner = CliRunner()


def _run(*args):
    return runner.invoke(app, [str(a) for a in args])


def _one_line_error(res, *needles):
    assert res.exit_code == 1, res.output
    lines = [ln for ln in res.output.strip().splitlines() if ln.strip() and not ln.startswith(("tokenize", "critic"))]
    assert lines and lines[0].startswith("error:"), res.output
    assert "unexpected" not in res.output and "Traceback" not in res.output, res.output
    text = " ".join(ln.strip() for ln in lines)
    for n in needles:
        assert n in text, (n, text)


def _tree(folder: Path) -> dict[str, str]:
    return {p.relative_to(folder).as_posix(): p.read_text() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture()
def sandbox(tmp_path, monkeypatch):
    """A temporary HOME holding a project folder, which is the current folder."""
    home = tmp_path / "home"
    project = home / "project"
    (project / "src").mkdir(parents=True)
    (project / "src" / "a.py").write_text("x = 1\n")
    (home / ".bashrc").write_text("export X=1\n")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(project)
    return home, project


def test_folder_with_summary_json_is_not_deleted(sandbox, rollouts, critic_dir):
    """The issue's reproduction: a folder that merely holds a summary.json keeps every file."""
    home, project = sandbox
    p = project / "p"
    (p / "src").mkdir(parents=True)
    (p / "src" / "a.py").write_text("x\n")
    (p / "summary.json").write_text("{}\n")
    before = _tree(p)
    res = _run("analyze", rollouts, "--critic", critic_dir, "--out", p, "--no-plots", "--bootstrap", 20)
    _one_line_error(res, "not a critic-audit output folder", "src/", "summary.json", "--overwrite")
    assert _tree(p) == before
    # --overwrite never replaces a file the tool did not write: the summary.json of `--json > summary.json`
    res = _run("analyze", rollouts, "--critic", critic_dir, "--out", p, "--no-plots", "--bootstrap", 20, "--overwrite")
    _one_line_error(res, "summary.json was not written by critic-audit", "refusing to replace it")
    assert _tree(p) == before
    # without the clash, --overwrite writes next to the other files and keeps them
    (p / "summary.json").rename(p / "my_summary.json")
    res = _run("analyze", rollouts, "--critic", critic_dir, "--out", p, "--no-plots", "--bootstrap", 20, "--overwrite")
    assert res.exit_code == 0, res.output
    assert (p / "src" / "a.py").read_text() == "x\n" and (p / "my_summary.json").read_text() == "{}\n"
    manifest = json.loads((p / outputs.MANIFEST).read_text())
    assert "summary.json" in manifest["files"] and "src/a.py" not in manifest["files"]
    # a second --overwrite run replaces its own files only
    res = _run("analyze", rollouts, "--critic", critic_dir, "--out", p, "--no-plots", "--bootstrap", 30, "--overwrite")
    assert res.exit_code == 0, res.output
    assert (p / "src" / "a.py").exists() and (p / "my_summary.json").exists()
    assert json.loads((p / "config.json").read_text())["audit"]["n_boot"] == 30
    assert not [q for q in p.parent.iterdir() if q.name.startswith(".p.")]


@pytest.mark.parametrize(("out", "words"), [
    ("/", "filesystem root"),
    (".", "current folder"),
    ("", "--out is empty ('')"),  # review 2 item 15: once "'.' is the current folder"
    ("~", "home folder"),
    ("HOME", "home folder"),
    ("PARENT", "parent of"),
])
def test_dangerous_out_paths_are_one_line_errors(sandbox, rollouts, critic_dir, out, words):
    home, project = sandbox
    out = {"HOME": str(home), "PARENT": str(home.parent)}.get(out, out)
    before_home, before_project = _tree(home), _tree(project)
    for overwrite in ((), ("--overwrite",)):
        res = _run("analyze", rollouts, "--critic", critic_dir, "--out", out, "--no-plots", "--bootstrap", 20, *overwrite)
        _one_line_error(res, words)
    assert _tree(home) == before_home and _tree(project) == before_project


def test_symlink_loop_is_one_line_error(sandbox, rollouts, critic_dir):
    home, project = sandbox
    os.symlink(project / "loop_b", project / "loop_a")
    os.symlink(project / "loop_a", project / "loop_b")
    for out in ("loop_a", "loop_a/sub"):
        res = _run("analyze", rollouts, "--critic", critic_dir, "--out", out, "--no-plots", "--bootstrap", 20)
        _one_line_error(res, "symlink loop")
    res = _run("train", "--out", "loop_a", "--quiet")
    _one_line_error(res, "symlink loop")


def test_fit_critic_and_build_critic_refuse_foreign_folders(sandbox, tmp_path):
    """--overwrite of the critic writers replaces a critic folder, never a folder of other files."""
    from critic_audit.critic.fit import save_critic
    from conftest import make_critic_dir

    home, project = sandbox
    backbone = tmp_path / "lm"
    make_critic_dir(backbone, with_head=False)
    import numpy as np

    w = np.zeros(32, dtype=np.float32)
    with pytest.raises(ConfigError, match="home folder"):
        save_critic(backbone, w, 0.0, home, overwrite=True)
    with pytest.raises(ConfigError, match="current folder"):
        save_critic(backbone, w, 0.0, project, overwrite=True)
    with pytest.raises(ConfigError, match="did not write"):
        save_critic(backbone, w, 0.0, project / "src", overwrite=True)
    assert (project / "src" / "a.py").exists()
    out = save_critic(backbone, w, 0.5, project / "critic")
    assert json.loads((out / outputs.MANIFEST).read_text())["kind"] == "critic"
    with pytest.raises(ConfigError, match="not empty"):
        save_critic(backbone, w, 0.0, out)
    save_critic(backbone, w, 1.5, out, overwrite=True)
    assert json.loads((out / "critic_audit.json").read_text())["hidden_size"] == 32
    assert not [q for q in (project).iterdir() if q.name.startswith(".")]


# ------------------------------------------------------------------------------------ the helper itself


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_stale_staging_folders_of_killed_runs_are_removed(tmp_path):
    out = tmp_path / "audit"
    stale = tmp_path / ".audit.tmp-dead1"
    stale.mkdir()
    (stale / "tokens.parquet").write_bytes(b"x" * 1000)
    (stale / outputs.STAGING_MARKER).write_text(json.dumps({"pid": _dead_pid(), "host": socket.gethostname()}))
    alive = tmp_path / ".audit.tmp-alive"
    alive.mkdir()
    (alive / outputs.STAGING_MARKER).write_text(json.dumps({"pid": os.getpid(), "host": socket.gethostname()}))
    unmarked = tmp_path / ".audit.tmp-notours"
    unmarked.mkdir()
    (unmarked / "keep.txt").write_text("not ours")
    # a swapped-out old output of a killed run (killed between the two renames), and the user's look-alike
    old = tmp_path / f".audit.old-{_dead_pid()}-1"
    old.mkdir()
    (old / "summary.json").write_text("{}")
    outputs.write_manifest(old, "analyze")
    lookalike = tmp_path / f".audit.old-{_dead_pid()}-2"
    lookalike.mkdir()
    (lookalike / "mine.txt").write_text("mine")
    with outputs.staging(out) as tmp:
        (tmp / "summary.json").write_text("{}")
        outputs.publish(tmp, out, kind="analyze")
    assert not stale.exists() and not old.exists()
    assert alive.exists() and (unmarked / "keep.txt").exists() and (lookalike / "mine.txt").exists()
    assert sorted(p.name for p in out.iterdir()) == [outputs.MANIFEST, "summary.json"]


def test_a_killed_publish_leaves_the_old_output_or_the_new(tmp_path, monkeypatch):
    out = tmp_path / "o"
    with outputs.staging(out) as tmp:
        (tmp / "a.txt").write_text("old")
        outputs.publish(tmp, out, kind="analyze")
    real_replace = os.replace
    calls = []

    def dying_replace(src, dst):
        calls.append((src, dst))
        if len(calls) == 3:  # manifest, old aside, new in: the new rename fails, the old comes back
            raise OSError(28, "No space left on device")
        return real_replace(src, dst)

    monkeypatch.setattr(outputs.os, "replace", dying_replace)
    with pytest.raises(OSError), outputs.staging(out) as tmp:
        (tmp / "a.txt").write_text("new")
        outputs.publish(tmp, out, kind="analyze")
    monkeypatch.setattr(outputs.os, "replace", real_replace)
    assert (out / "a.txt").read_text() == "old"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_a_manifest_cannot_reach_out_of_its_folder(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    folder = tmp_path / "out"
    folder.mkdir()
    (folder / "link").symlink_to(tmp_path)
    for files in (["../victim.txt"], ["/etc/passwd"], ["link/victim.txt"]):
        (folder / outputs.MANIFEST).write_text(json.dumps({"tool": "critic-audit", "files": files, "dirs": []}))
        outputs.remove_owned(folder)
        assert victim.read_text() == "precious"
    (folder / outputs.MANIFEST).write_text(json.dumps({"tool": "critic-audit", "files": [], "dirs": ["link"]}))
    assert outputs.foreign_entries(folder) == ["link"]  # a symlinked folder is never the tool's
    with pytest.raises(ConfigError, match="did not write"):
        outputs.check_replaceable(folder)


def test_remove_owned_keeps_files_the_tool_did_not_write(tmp_path):
    folder = tmp_path / "run"
    (folder / "plots").mkdir(parents=True)
    (folder / "plots" / "x.png").write_text("p")
    (folder / "summary.json").write_text("{}")
    outputs.write_manifest(folder, "analyze", dirs=["plots"])
    assert outputs.is_ours(folder)
    (folder / "mine.txt").write_text("mine")
    assert outputs.foreign_entries(folder) == ["mine.txt"]
    assert not outputs.remove_owned(folder)
    assert sorted(p.name for p in folder.iterdir()) == ["mine.txt"]


def test_atomic_write_keeps_the_old_file_on_error(tmp_path):
    f = tmp_path / "x.json"
    outputs.atomic_write_text(f, "old")

    def fail(tmp: Path) -> None:
        tmp.write_text("half")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        outputs.atomic_write(f, fail)
    assert f.read_text() == "old" and sorted(p.name for p in tmp_path.iterdir()) == ["x.json"]
    assert (f.stat().st_mode & 0o777) != 0o600  # not mkstemp's private mode


def test_folder_lock_refuses_another_process_and_survives_kill_9(tmp_path, lock_holder):
    out = tmp_path / "run"
    holder = lock_holder(out)
    lock_file = outputs.lock_path(out)
    assert lock_file == tmp_path / ".run.lock"
    assert json.loads(lock_file.read_text())["pid"] == holder.pid
    with pytest.raises(ConfigError) as e:
        outputs.lock_folder(out, command="critic-audit analyze")
    msg = str(e.value)
    assert msg.startswith(f"--out {out} is in use by process {holder.pid} (critic-audit train, since ")
    assert f"kill {holder.pid}" in msg and "--resume works after it" in msg
    assert not out.exists()  # refused before anything was written
    # the holder is killed with SIGKILL: it cannot clean up, its lock file stays, and the OS released the lock
    holder.kill()
    holder.wait()
    assert lock_file.exists()
    with outputs.lock_folder(out, command="critic-audit train") as held:
        assert json.loads(lock_file.read_text())["pid"] == os.getpid()
        again = outputs.lock_folder(out, command="critic-audit train")  # re-entrant within one process
        again.release()
        assert held.path in outputs._HELD and lock_file.exists()  # the outer hold still locks it
    assert outputs.lock_path(out) not in outputs._HELD
    assert not lock_file.exists()  # removed on release: no stray file next to the folder
    lock_holder(out).kill()  # released for real: another process takes it


def test_analyze_on_a_folder_in_use_is_one_line_error(sandbox, rollouts, critic_dir, lock_holder):
    home, project = sandbox
    out = project / "audit"
    holder = lock_holder(out)
    res = _run("analyze", rollouts, "--critic", critic_dir, "--out", out)
    _one_line_error(res, f"--out {out} is in use by process {holder.pid}", f"kill {holder.pid}")
    assert not out.exists() and not (project / "audit.scoring-cache").exists()


def test_no_plots_rerun_removes_the_earlier_plots_but_never_a_users_file(sandbox, rollouts, critic_dir):
    home, project = sandbox
    out = project / "audit"
    assert _run("analyze", rollouts, "--critic", critic_dir, "--out", out, "--bootstrap", 20).exit_code == 0
    ours = sorted(p.name for p in (out / "plots").iterdir())
    m = outputs.read_manifest(out)
    assert ours and m["dirs"] == ["plots"] and m["dir_files"] == {"plots": [f"plots/{n}" for n in ours]}
    (out / "plots" / "mine.png").write_bytes(b"my own figure")
    (out / "notes.md").write_text("mine\n")
    # a file of the user's inside plots/ is not the tool's: refused without --overwrite, naming it
    res = _run("analyze", rollouts, "--critic", critic_dir, "--out", out, "--bootstrap", 20, "--no-plots")
    _one_line_error(res, "plots/mine.png")
    res = _run("analyze", rollouts, "--critic", critic_dir, "--out", out, "--bootstrap", 20, "--no-plots", "--overwrite")
    assert res.exit_code == 0, res.output
    # the earlier run's plots and reports are gone (no stale figure beside the new summary), the user's stay
    assert sorted(p.name for p in (out / "plots").iterdir()) == ["mine.png"]
    assert not (out / "report.md").exists() and not (out / "report.html").exists()
    assert (out / "plots" / "mine.png").read_bytes() == b"my own figure" and (out / "notes.md").read_text() == "mine\n"
    m = outputs.read_manifest(out)
    # plots/ stays the tool's folder, with none of its files: the user's file in it is not claimed
    assert m["dirs"] == ["plots"] and m["dir_files"] == {"plots": []}
    assert not any(f.startswith("plots/") for f in m["files"])
    assert sorted(outputs.foreign_entries(out)) == ["notes.md", "plots/mine.png"]
    # plots again: the tool's figures come back next to the user's, which the manifest does not claim
    res = _run("analyze", rollouts, "--critic", critic_dir, "--out", out, "--bootstrap", 20, "--overwrite")
    assert res.exit_code == 0, res.output
    assert sorted(p.name for p in (out / "plots").iterdir()) == sorted([*ours, "mine.png"])
    assert outputs.read_manifest(out)["dir_files"] == {"plots": [f"plots/{n}" for n in ours]}
    # critic-audit plot re-renders the tool's figures only
    (out / "plots" / ours[0]).write_bytes(b"stale")
    res = _run("plot", out)
    assert res.exit_code == 0, res.output
    assert (out / "plots" / ours[0]).read_bytes() != b"stale" and (out / "plots" / "mine.png").exists()
    assert sorted(outputs.foreign_entries(out)) == ["notes.md", "plots/mine.png"]
    assert not [q for q in out.parent.iterdir() if q.name.startswith(".audit.")]  # no staging or lock left


def test_no_plots_overwrite_next_to_a_users_file_removes_the_earlier_plots(sandbox, rollouts, critic_dir):
    """The earlier plots leave with --no-plots --overwrite also when the user's file is outside plots/."""
    home, project = sandbox
    out = project / "audit"
    (out).mkdir()
    (out / "notes.md").write_text("mine\n")
    assert _run("analyze", rollouts, "--critic", critic_dir, "--out", out, "--bootstrap", 20, "--overwrite").exit_code == 0
    assert (out / "plots").is_dir()
    res = _run("analyze", rollouts, "--critic", critic_dir, "--out", out, "--bootstrap", 20, "--no-plots", "--overwrite")
    assert res.exit_code == 0, res.output
    assert not (out / "plots").exists() and (out / "notes.md").read_text() == "mine\n"
    assert outputs.foreign_entries(out) == ["notes.md"]


def test_analyze_writes_into_an_existing_folder_without_renaming_it(tmp_path):
    """An empty mount point as --out (a tmpfs, a Docker/Kubernetes output volume) cannot be renamed or removed
    ("[Errno 16] Device or resource busy"): analyze moves its files into an existing folder one by one (the
    staging folder inside it, on its filesystem) and never renames the folder; a rerun replaces what it wrote."""
    import json as _json

    from conftest import SAMPLE
    from critic_audit.analysis.audit import AuditConfig
    from critic_audit.outputs import MANIFEST
    from critic_audit.pipeline import analyze

    src = SAMPLE / "credit_ppo_run" / "rollouts" / "step_000199"
    out = tmp_path / "vol"
    out.mkdir()
    ino = os.stat(out).st_ino
    cfg = AuditConfig(n_boot=200)
    analyze([src], out, scoring=None, audit_config=cfg, plots=True)
    assert os.stat(out).st_ino == ino and sorted(p.name for p in tmp_path.iterdir()) == ["vol"]
    files = set(_json.loads((out / MANIFEST).read_text())["files"])
    assert {"summary.json", "trajectories.parquet", "report.html"} <= files
    assert not [p.name for p in out.iterdir() if p.name.startswith(".")]  # no staging folder left
    from critic_audit.report import rerender

    (out / "report.html").unlink()
    rerender(out)  # plot stages inside the folder too (a sibling would be on another filesystem than a mount)
    assert (out / "report.html").exists() and os.stat(out).st_ino == ino
    assert sorted(p.name for p in tmp_path.iterdir()) == ["vol"]
    assert not [p.name for p in out.iterdir() if p.name.startswith(".")]
    analyze([src], out, scoring=None, audit_config=cfg, plots=False)  # the tool's folder: written into again
    assert os.stat(out).st_ino == ino and sorted(p.name for p in tmp_path.iterdir()) == ["vol"]
    assert not (out / "report.html").exists() and not (out / "plots").exists()  # the earlier run's, removed
    assert sorted(p.name for p in out.iterdir()) == sorted({*_json.loads((out / MANIFEST).read_text())["files"], MANIFEST})


def test_an_unwritable_out_is_refused_before_the_work(tmp_path):
    """An --out the tool could not write at the end is one line before the audit runs ("cannot write to OUT:
    ... fix: ..."), not an unexpected OSError after it."""
    from critic_audit.errors import ConfigError
    from critic_audit.outputs import check_writable

    if Path("/proc").is_dir():  # read-only for every user, root included
        with pytest.raises(ConfigError) as e:
            check_writable(Path("/proc/critic_audit_out"))
        assert str(e.value).startswith("cannot create /proc/critic_audit_out: the system refuses a new file in /proc (")
        assert "pass another --out" in str(e.value) and "chmod" not in str(e.value)
    check_writable(tmp_path / "new" / "out")  # a writable parent: fine
    if os.geteuid() == 0:
        return  # root writes a 0555 folder
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        with pytest.raises(ConfigError, match=r"^cannot write to .*ro: Permission denied"):
            check_writable(ro)
    finally:
        ro.chmod(0o755)
