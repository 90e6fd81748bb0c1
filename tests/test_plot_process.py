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


def test_plots_drawn_in_the_second_process_are_those_drawn_in_one(tmp_path):
    from critic_audit.report import rerender

    run = _dump(tmp_path / "run", steps=3, rows=16)
    out = tmp_path / "s"
    s = analyze([run], out, scoring=None, audit_config=AuditConfig(n_boot=100), plots=True)
    assert s.summary.to_dict()["streamed"] and len(s.summary.to_dict()["by_checkpoint"]) == 3
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
