"""Every ```python block of README.md and docs/*.md runs as written, and the ``critic-audit`` lines of the
```bash blocks run too (issue 35.4).

Each block runs in a fresh temporary working folder. A fragment that uses files or names it never makes
(``"path/to/critic"``, ``rollouts.jsonl``, ``ids_1``) gets them from a hidden set-up below, keyed by the
page and the block's first line: tiny critics and tokenizers built from a config (conftest), rollouts of
the conftest format, the shipped sample data. A block that no set-up names runs on its own, so a new
block that needs one fails here until it has one. Blocks that cannot run in a test are listed in
:data:`PY_SKIP` / :data:`BASH_SKIP` with the reason; they are still compiled (python) or parsed.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import pytest

from conftest import SAMPLE, conv, tiny_train_toml

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

TINY_TOML = tiny_train_toml(steps=1)


def blocks(lang: str) -> list[tuple[str, int, str]]:
    """``(page, line, code)`` of every fenced block of ``lang`` (``python``, or ``bash`` with ``sh``)."""
    tags = ("python",) if lang == "python" else ("bash", "sh", "console", "shell")
    out = []
    for page in PAGES:
        text = page.read_text()
        for m in re.finditer(r"^( *)```(\w+)\n(.*?)^\1```", text, re.S | re.M):
            if m.group(2) in tags:
                code = "\n".join(ln[len(m.group(1)):] for ln in m.group(3).splitlines())
                out.append((page.relative_to(ROOT).as_posix(), text[:m.start()].count("\n") + 1, code))
    return out


def _key(page: str, code: str) -> tuple[str, str]:
    return page, next(ln.strip() for ln in code.splitlines() if ln.strip())


# --------------------------------------------------------------------------------------------- set-ups

def _rollouts(path: Path, n: int = 8, reward_key: str = "reward") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    recs = []
    for i in range(n):
        r = conv(i, 2 + i % 3, float(i % 2))
        r[reward_key] = r.pop("reward")
        recs.append(r)
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return path


def _critic(critic_dir: Path, where: str) -> Path:
    dst = Path(where)
    if not dst.exists():
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(critic_dir, dst)
    return dst


def _ids(critic_dir: Path) -> list[list[int]]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(critic_dir)
    return [tok.encode("Thought: I need to search. Action: search[Paris]"), tok.encode("Book the flight.")]


def _setup_score_values(cd: Path) -> dict:
    _critic(cd, "path/to/critic")
    ids_1, ids_2 = _ids(cd)
    return {"ids_1": ids_1, "ids_2": ids_2}


def _setup_analyze_api(cd: Path) -> dict:
    _critic(cd, "my_critic")
    _rollouts(Path("rollouts.jsonl"))
    return {}


def _setup_read_chat(cd: Path) -> dict:
    _rollouts(Path("runs") / "a.jsonl", reward_key="return")
    return {}


def _setup_dump(cd: Path) -> dict:
    import torch

    g = torch.Generator().manual_seed(0)
    batch = {"prompts": torch.randint(3, 250, (2, 4), generator=g), "responses": torch.randint(3, 250, (2, 5), generator=g),
             "values": torch.rand(2, 5, generator=g), "token_level_rewards": torch.tensor([[0, 0, 0, 0, 1.0]] * 2)}
    batch["input_ids"] = torch.cat([batch["prompts"], batch["responses"]], dim=1)
    return {"batch": batch, "self": SimpleNamespace(global_steps=3)}


def _setup_monitor(cd: Path) -> dict:
    shutil.copytree(SAMPLE / "credit_ppo_run" / "rollouts" / "step_000199", "audit_out")
    return {}


def _setup_train(cd: Path) -> dict:
    import torch

    torch.set_num_threads(1)
    Path("my.toml").write_text(TINY_TOML)
    return {}


def _setup_verl_trainer(cd: Path) -> dict:
    pytest.importorskip("verl", reason="the verl plugin's example needs the [verl] extra")

    class Trainer:  # the RayPPOTrainer method the example sits in
        def _compute_advantage(self, batch, metrics):
            return batch
    return {"self": Trainer(), "batch": {}, "metrics": {}}


#: (page, first line of the block) -> the hidden set-up: makes the files the block names in the working
#: folder and returns the names it uses without defining them
PY_SETUP: dict[tuple[str, str], Callable[[Path], dict]] = {
    ("docs/critics.md", "from critic_audit.critic import ScoringConfig, load_critic, score"): _setup_score_values,
    ("docs/critics.md", "from critic_audit.critic import CacheOptions, ScoringConfig, cache_root_for"): _setup_analyze_api,
    ("docs/input_formats.md", "from critic_audit.io import ChatReadOptions, read_chat"): _setup_read_chat,
    ("docs/input_formats.md", "from critic_audit.io.verl_dump import dump_verl_batch"): _setup_dump,
    ("docs/monitor.md", "from critic_audit.analysis.monitor import MonitorConfig, monitor"): _setup_monitor,
    ("docs/train.md", "from critic_audit.train import Trainer, load_config, read_metrics"): _setup_train,
    ("docs/verl.md", "from critic_audit.integrations.verl import trainer as ca   # registers trainer_mode critic_audit_sync"):
        _setup_verl_trainer,
}

#: blocks compiled but not run, and why
PY_SKIP = {
    ("docs/critics.md", "from critic_audit.critic import CriticSpec, score_values_distributed"):
        "starts 8 CUDA scoring workers (spawned processes); tests/test_distributed_scoring.py runs the same call on CPU",
}


@pytest.mark.parametrize("page,line,code", [pytest.param(*b, id=f"{b[0]}:{b[1]}") for b in blocks("python")])
def test_python_block_runs(page, line, code, tmp_path, monkeypatch, critic_dir):
    compiled = compile(code, f"{page}:{line}", "exec")  # a syntax / indentation error fails every block
    key = _key(page, code)
    if key in PY_SKIP:
        pytest.skip(PY_SKIP[key])
    monkeypatch.chdir(tmp_path)
    ns = {"__name__": "__doc_block__"}
    setup = PY_SETUP.get(key)
    if setup is not None:
        ns.update(setup(critic_dir))
    exec(compiled, ns)  # noqa: S102 - the documentation's own example


# --------------------------------------------------------------------------------------------- the CLI

#: ``critic-audit`` lines not run (a regular expression searched in the line) and why; every other line
#: of every bash block runs in a working folder holding :func:`_sandbox`
BASH_SKIP = {
    r"^critic-audit train ": "trains for minutes (150 steps x 64 episodes, or SmolLM2 on HotpotQA); "
                             "tests/test_train_cli.py runs train on a tiny config",
    r"^critic-audit analyze runs/": "needs the folder of a training run (the train line before it)",
    r"^critic-audit check rows\.parquet --policy": "needs a causal-LM policy checkpoint and rows with sampler "
                                                   "log-probs; tests/test_check.py runs --policy on a tiny one",
    r"^critic-audit analyze /ckpt/": "a verl run's checkpoint folder on a cluster",
    r" --workers (8|16)\b": "starts 8 or 16 scoring workers (Ray on a cluster for 16); "
                            "tests/test_distributed_scoring.py runs 2 on CPU",
}


def _sandbox(critic_dir: Path) -> None:
    """The files the CLI examples name: rollouts, critics and tokenizers (tiny), a verl dump folder."""
    from critic_audit.io.verl_dump import dump_verl_batch

    for name in ("my_rollouts.jsonl", "rollouts.jsonl"):
        _rollouts(Path(name))
    for where in ("path/to/critic_checkpoint", "ckpt", "ckpt/step_100", "ckpt/step_200", "my_critic", "path/to/policy",
                  "ckpt/policy"):
        _critic(critic_dir, where)
    dump_verl_batch(_setup_dump(critic_dir)["batch"], "verl_dump", step=1)
    Path("sample_data").symlink_to(SAMPLE, target_is_directory=True)  # the README's first command reads it


def _commands(code: str) -> list[str]:
    """The ``critic-audit`` command lines of a bash block (continuations joined, comments dropped)."""
    text = re.sub(r"\\\n\s*", " ", code)
    return [ln.strip() for ln in text.splitlines() if ln.strip().startswith("critic-audit ")]


@pytest.mark.parametrize("page,line,code", [pytest.param(*b, id=f"{b[0]}:{b[1]}") for b in blocks("bash")
                                            if _commands(b[2])])
def test_cli_examples_run(page, line, code, tmp_path, monkeypatch, critic_dir):
    from typer.testing import CliRunner

    from critic_audit.cli import app

    monkeypatch.chdir(tmp_path)
    _sandbox(critic_dir)
    ran = 0
    for cmd in _commands(code):
        args = shlex.split(cmd, comments=True)[1:]
        if any(re.search(k, cmd) for k in BASH_SKIP):
            continue
        stdout_to = None
        if ">" in args:
            i = args.index(">")
            args, stdout_to = args[:i], args[i + 1]
        if args[0] == "analyze" and "--bootstrap" not in args:
            args += ["--bootstrap", "20"]  # the intervals' resamples: the example's default is 2000
        res = CliRunner().invoke(app, args)
        ok = (0, 3) if args[0] == "check" else (0,)  # check: 3 = a fail-level finding on the sample rollouts
        assert res.exit_code in ok, f"{page}:{line}: {cmd}\n{res.output}"
        if stdout_to:
            Path(stdout_to).write_text(res.stdout)
            json.loads(Path(stdout_to).read_text())
        ran += 1
    if not ran:
        pytest.skip("every line of this block is in BASH_SKIP")
