"""The plots of a streamed analyze are drawn in a second process (critic_audit.plot_process): the same
files as drawn in one process, an error raised there is raised in the caller, and the process ends
with the caller's work."""

import shutil

import polars as pl
import pytest

from critic_audit.analysis.audit import AuditConfig
from critic_audit.pipeline import analyze
from critic_audit.plot_process import PlotProcess
from test_stream_analyze import _dump


def test_plots_drawn_in_the_second_process_are_those_drawn_in_one(tmp_path, monkeypatch):
    from critic_audit import plot_process
    from critic_audit.report import rerender

    started = []
    monkeypatch.setattr(plot_process, "PLOT_PROCESS_MIN_BYTES", 0)  # (a small run draws in process)
    monkeypatch.setattr(plot_process, "PlotProcess", lambda: started.append(1) or PlotProcess())
    run = _dump(tmp_path / "run", steps=3, rows=16)
    out = tmp_path / "s"
    s = analyze([run], out, scoring=None, audit_config=AuditConfig(n_boot=100), plots=True)
    assert s.summary.to_dict()["streamed"] and len(s.summary.to_dict()["by_checkpoint"]) == 3 and started
    drawn = {p.name: p.read_bytes() for p in (out / "plots").iterdir()}
    # every plot, the per-checkpoint one (drawn from the summary) too, as PNG and SVG
    assert {n.rsplit(".", 1)[0] for n in drawn} >= {"value_traces", "value_grid", "eta2_hist", "eta2_ecdf",
                                                    "eta2_box", "step_distributions", "turn_position",
                                                    "eta2_ev_by_checkpoint"}
    assert all(f"{n.rsplit('.', 1)[0]}.svg" in drawn for n in drawn if n.endswith(".png"))
    md = (out / "report.md").read_text()
    html = (out / "report.html").read_text()
    shutil.copytree(out, tmp_path / "again")
    rerender(tmp_path / "again")  # drawn in this process from the folder's files
    again = tmp_path / "again"
    for name, data in drawn.items():
        if name.endswith(".png"):  # (an SVG carries its date and random clip ids)
            assert (again / "plots" / name).read_bytes() == data, name
    assert (again / "report.md").read_text() == md
    assert (again / "report.html").read_text() == html
    assert not list(out.glob(".critic-audit.tmp-*"))


def test_an_error_in_the_plot_process_is_raised_in_the_caller(tmp_path):
    per = pl.DataFrame({"trajectory_id": ["a"]})  # no statistics to draw
    with PlotProcess() as p:
        p.draw(pl.DataFrame(), per, stems=["eta2_hist"])
        with pytest.raises(Exception, match="excluded"):
            p.collect(tmp_path)
        p.draw(pl.DataFrame(), per, stems=[])  # the process goes on after a failed job
        assert p.collect(tmp_path) == []


def test_the_plot_process_ends_with_the_caller(tmp_path):
    p = PlotProcess()
    folder = p.dir
    p.draw(pl.DataFrame(), pl.DataFrame({"trajectory_id": ["a"]}), stems=[])
    p.close()  # a job pending (the caller failed): ended at once
    assert p.proc.poll() is not None and not folder.exists()


def test_a_small_run_draws_its_plots_in_process(tmp_path, monkeypatch):
    from critic_audit import plot_process

    def refuse():
        raise AssertionError("a small run started a plot process")

    monkeypatch.setattr(plot_process, "PlotProcess", refuse)
    run = _dump(tmp_path / "run", steps=2, rows=8)
    analyze([run], tmp_path / "s", scoring=None, audit_config=AuditConfig(n_boot=50), plots=True)
    assert (tmp_path / "s" / "plots" / "eta2_ev_by_checkpoint.png").exists()


def test_a_plot_process_that_dies_leaves_the_plots_to_the_caller(tmp_path, monkeypatch):
    from critic_audit import plot_process

    def dead():
        p = PlotProcess()
        p.proc.kill()  # (killed, out of memory: before any job)
        p.proc.wait()
        return p

    monkeypatch.setattr(plot_process, "PLOT_PROCESS_MIN_BYTES", 0)
    monkeypatch.setattr(plot_process, "PlotProcess", dead)
    run = _dump(tmp_path / "run", steps=2, rows=8)
    analyze([run], tmp_path / "s", scoring=None, audit_config=AuditConfig(n_boot=50), plots=True)
    assert {p.name for p in (tmp_path / "s" / "plots").iterdir()} >= {"value_traces.png", "eta2_ev_by_checkpoint.svg"}
    assert "eta2_ev_by_checkpoint.png" in (tmp_path / "s" / "report.md").read_text()


def test_the_plot_process_removes_its_folder_when_the_caller_dies():
    p = PlotProcess()
    folder = p.dir
    p.proc.stdin.close()  # what a killed caller leaves: the end of the child's input, no close()
    p.proc.wait(timeout=60)
    assert not folder.exists()
    p.close()
