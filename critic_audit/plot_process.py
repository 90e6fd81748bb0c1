"""The plots of an audit drawn in a separate process while the caller goes on.

A streamed ``analyze`` (:mod:`critic_audit.pipeline.stream`) knows everything its plots draw (the
per-trajectory table, the value-trace tokens, the turn means, the step histogram) before it computes
the summary's bootstrap intervals and quality gates, which take seconds on a whole run: a second
process draws the plots meanwhile, on another core, with the same code as in one process
(:func:`critic_audit.report.render_plots`), so the files are the same. The process is started before the
tokens are read, so that its imports (matplotlib) are done by the time it has plots to draw; only
for inputs of :data:`PLOT_PROCESS_MIN_BYTES` or more (a small audit draws its plots itself).

Protocol: the child (``python -m critic_audit.plot_process``) reads one job path per line on stdin (a
pickle of :func:`~critic_audit.report.render_plots`' arguments, written in a private temporary folder),
draws the plots into that folder and answers one line per job: ``ok PATH`` (a pickle of the stems drawn)
or ``error PATH`` (a pickle of the exception raised, re-raised in the caller). Nothing is written to
the output folder until :meth:`PlotProcess.collect` moves the plots in.
"""

from __future__ import annotations

import os
import pickle
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Collection
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import polars as pl


#: Tokens files (bytes, all parts) from which a streamed ``analyze`` draws its plots in a second process:
#: below, the summary takes too little time to hide the plots behind, and the process's start-up
#: (an interpreter, matplotlib: ~0.5 s CPU) would be spent for nothing (16 MiB: ~2M tokens).
PLOT_PROCESS_MIN_BYTES = 16 << 20


class PlotProcessError(RuntimeError):
    """The plot process ended (killed, out of memory) before answering: the caller draws the plots itself."""


class PlotProcess:
    """A child process that draws plots (module docstring); a context manager that ends it.

    Raises:
        OSError: the process cannot be started (the caller draws the plots itself then).
    """

    def __init__(self) -> None:
        import critic_audit

        self.dir = Path(tempfile.mkdtemp(prefix="critic-audit-plots-"))
        self.jobs = 0
        env = dict(os.environ)
        root = str(Path(critic_audit.__file__).resolve().parents[1])
        if root not in _site_dirs():  # a checkout on sys.path (not installed): the child imports this one too
            env["PYTHONPATH"] = os.pathsep.join([root, *filter(None, [env.get("PYTHONPATH")])])
        self._err = open(self.dir / "stderr.txt", "wb")  # noqa: SIM115 - closed in close()
        try:
            self.proc = subprocess.Popen([sys.executable, "-m", "critic_audit.plot_process", str(self.dir)],
                                         stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, stderr=self._err, env=env)
        except OSError:
            self._err.close()
            shutil.rmtree(self.dir, ignore_errors=True)
            raise

    def draw(self, tokens: pl.DataFrame, per_trajectory: pl.DataFrame, *, box_by: str | None = None,
             summary: Any = None, turns: pl.DataFrame | None = None, steps: Any = None,
             stems: Collection[str] | None = None) -> None:
        """Hand one call of :func:`critic_audit.report.render_plots` (the same arguments, without the
        folder) to the child and return at once."""
        job = self.dir / f"job{self.jobs}.pkl"
        with open(job, "wb") as f:
            pickle.dump({"tokens": tokens, "per_trajectory": per_trajectory, "box_by": box_by, "summary": summary,
                         "turns": turns, "steps": steps, "stems": None if stems is None else list(stems)},
                        f, protocol=pickle.HIGHEST_PROTOCOL)
        assert self.proc.stdin is not None
        self.jobs += 1
        try:
            self.proc.stdin.write(f"{job}\n".encode())
            self.proc.stdin.flush()
        except OSError:  # the child is gone (a broken pipe): collect() says so
            pass

    def collect(self, folder: Path) -> list[str]:
        """Wait for every job handed over, move its plots into ``folder/plots`` and return their stems
        (each job's in :func:`~critic_audit.report.render_plots` order, jobs in the order handed over).

        Raises:
            the exception a job raised; PlotProcessError: the child ended before answering.
        """
        assert self.proc.stdout is not None
        stems: list[str] = []
        while self.jobs:
            line = self.proc.stdout.readline().decode().rstrip("\n")
            if not line:
                self._err.flush()
                tail = (self.dir / "stderr.txt").read_text(errors="replace").strip().splitlines()[-3:]
                self.jobs = 0
                raise PlotProcessError(f"the plot process ended (exit code {self.proc.poll()}) before drawing the "
                                       "plots" + (f": {' / '.join(tail)}" if tail else ""))
            self.jobs -= 1
            status, path = line.split(" ", 1)
            with open(path, "rb") as f:
                payload = pickle.load(f)
            if status != "ok":
                raise payload
            stems += payload
        (folder / "plots").mkdir(parents=True, exist_ok=True)
        drawn = self.dir / "out" / "plots"
        for f in sorted(drawn.iterdir()) if drawn.is_dir() else []:
            shutil.move(f, folder / "plots" / f.name)
        return stems

    def close(self) -> None:
        """End the child and remove the temporary folder. The child is killed, not waited for: every
        job handed over was answered and its files moved (:meth:`collect`), or the caller gave up on
        them (an error, Ctrl-C); its own clean exit (unloading matplotlib, ~0.3 s) is not worth waiting for."""
        try:
            if self.proc.stdin is not None:
                self.proc.stdin.close()
        except OSError:
            pass
        self.proc.kill()
        self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self._err.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> PlotProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _site_dirs() -> set[str]:
    """The interpreter's site-packages folders (resolved): an installed critic_audit is found there by
    any child interpreter, and putting one on ``PYTHONPATH`` would place it before the standard library."""
    import site

    dirs = [*site.getsitepackages(), site.getusersitepackages()] if hasattr(site, "getsitepackages") else []
    return {str(Path(d).resolve()) for d in dirs}


def start_plot_process() -> PlotProcess | None:
    """A :class:`PlotProcess`, or None when no process can be started (no Python executable known, as
    in an embedded interpreter, or the start fails): the plots are then drawn in this one."""
    if not sys.executable:
        return None
    try:
        return PlotProcess()
    except OSError:
        return None


def _answer(path: Path, status: str, payload: Any) -> None:
    out = path.with_suffix(".out")
    with open(out, "wb") as f:
        pickle.dump(payload, f, protocol=pickle.HIGHEST_PROTOCOL)
    sys.stdout.write(f"{status} {out}\n")
    sys.stdout.flush()


def _serve() -> None:
    """The child: import the plotting code now (the caller is still reading), then draw each job; at the
    end of its input (the caller closed it, or died), remove the temporary folder (``argv[1]``)."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the caller's: it ends this process
    from critic_audit import plots  # noqa: F401  (matplotlib, imported before the first job arrives)
    from critic_audit.report import render_plots

    for line in sys.stdin:
        path = Path(line.rstrip("\n"))
        try:
            with open(path, "rb") as f:
                job = pickle.load(f)
            path.unlink()  # (the tables it holds are in this process now: no second copy in a tmpfs /tmp)
            stems = render_plots(path.parent / "out", job.pop("tokens"), job.pop("per_trajectory"), **job)
        except Exception as e:  # noqa: BLE001 - handed back to the caller, who raises it
            try:
                pickle.loads(pickle.dumps(e))
            except Exception:  # noqa: BLE001 - an exception that does not survive pickling
                e = RuntimeError(f"{type(e).__name__}: {e}")
            _answer(path, "error", e)
            continue
        _answer(path, "ok", stems)
    if len(sys.argv) > 1:  # stdin closed: the caller is done, or was killed before it could remove the folder
        shutil.rmtree(sys.argv[1], ignore_errors=True)


if __name__ == "__main__":
    _serve()
