"""Option and config values: every float of the train config finite and in range, refused as a usage
error (exit 2, one line naming the key and the fix) by every command; a training update that goes
non-finite stops the run and keeps the last good checkpoint; Ctrl-C says what a rerun does."""

from __future__ import annotations

import dataclasses
import json
import math
import typing

import pytest
import torch
from conftest import tiny_train_toml
from typer.testing import CliRunner

from critic_audit.cli import app
from critic_audit.errors import TrainingError, UsageError
from critic_audit.train import Trainer, TrainConfig, describe_resume, load_config

#: fit-critic on a missing input with a missing backbone: an option error must come first.
FIT = ["fit-critic", "missing.jsonl", "--out", "t", "--backbone", "no-such-backbone-folder"]
ROW = '{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}], "reward": 1}\n'


def _float_keys(cls: type = TrainConfig, prefix: str = "") -> list[str]:
    """Every float (or float | None) option of the config tree, as its dotted key."""
    out = []
    for f in dataclasses.fields(cls):
        tp = typing.get_type_hints(cls)[f.name]
        if dataclasses.is_dataclass(tp):
            out += _float_keys(tp, prefix + f.name + ".")
        elif tp is float or float in typing.get_args(tp) and type(None) in typing.get_args(tp):
            out.append(prefix + f.name)
    return out


def test_the_tree_has_the_float_options_this_test_walks():
    assert {"optim.lr", "optim.critic_lr", "optim.eps", "optim.grad_clip", "algo.cliprange_value",
            "algo.success_threshold", "rollout.temperature", "model.tiny_init_std", "sft.lr"} <= set(_float_keys())


@pytest.mark.parametrize("key", _float_keys())
@pytest.mark.parametrize("text", ["nan", "inf", "-inf"])
def test_every_float_option_must_be_finite(key, text):
    """Was: optim.lr=inf trained to all-NaN weights with exit 0; optim.lr=nan 'Invalid learning rate: nan
    (unexpected ValueError)'."""
    with pytest.raises(UsageError) as ei:
        load_config(overrides=[f"{key}={text}"])
    msg = str(ei.value)
    assert msg.startswith(f"{key} = {float(text)!r} must be a finite number") and f"(fix: set {key} " in msg, msg
    assert "\n" not in msg


def test_the_lr_line_names_the_key_and_the_range():
    with pytest.raises(UsageError) as ei:
        load_config(overrides=["optim.lr=inf"])
    assert str(ei.value) == "optim.lr = inf must be a finite number > 0 (fix: set optim.lr to a finite number > 0)"
    with pytest.raises(UsageError) as ei:
        load_config(overrides=["optim.weight_decay=nan"])
    assert str(ei.value) == ("optim.weight_decay = nan must be a finite number >= 0 "
                             "(fix: set optim.weight_decay to a finite number >= 0)")
    assert load_config(overrides=["optim.lr=1e300"]).optim.lr == 1e300  # finite: allowed


@pytest.mark.parametrize("args, want", [
    (["train", "--out", "t", "--steps", "0"], "error: steps = 0 must be > 0 (fix: set steps > 0)"),
    (["train", "--out", "t", "--set", "optim.lr=abc"],
     "error: optim.lr = 'abc' must be a number (fix: write a number, e.g. --set optim.lr=0.5)"),
    (["train", "--out", "t", "--set", "optim.lr=-1"], "error: optim.lr = -1.0 must be > 0 (fix: set optim.lr > 0)"),
    (["train", "--out", "t", "--set", "optim.lr=nan"],
     "error: optim.lr = nan must be a finite number > 0 (fix: set optim.lr to a finite number > 0)"),
    (["train", "--out", "t", "--set", "optim.lr=inf"],
     "error: optim.lr = inf must be a finite number > 0 (fix: set optim.lr to a finite number > 0)"),
    (["train", "--out", "t", "--set", "optim.bogus=1"],
     "error: unknown option optim.bogus (fix: known in this section: betas, critic_lr, eps, grad_clip, lr, "
     "micro_batch_size, num_minibatches, ppo_epochs, schedule, value_warmup_steps, warmup_steps, weight_decay)"),
    (["train", "--out", "t", "--verl", "x=1"], "error: --verl and --dry-run belong to --engine verl (fix: add --engine verl)"),
    # fit-critic: refused before any backbone load or read (the backbone and the input do not even exist)
    ([*FIT, "--ridge", "-1"], "error: --ridge must be a finite number >= 0, got -1.0 (fix: use e.g. --ridge 0.001 (0: no penalty))"),
    ([*FIT, "--ridge", "nan"], "error: --ridge must be a finite number >= 0, got nan (fix: use e.g. --ridge 0.001 (0: no penalty))"),
    ([*FIT, "--held-out", "0"], "error: --held-out must be in (0, 1), got 0.0 (fix: use e.g. --held-out 0.2)"),
    ([*FIT, "--held-out", "nan"], "error: --held-out must be in (0, 1), got nan (fix: use e.g. --held-out 0.2)"),
    ([*FIT, "--train-layers", "0"], "error: --train-layers must be a whole number >= 1, got 0 (fix: use e.g. --train-layers 2)"),
    ([*FIT, "--method", "layers", "--train-layers", "0"],
     "error: --train-layers must be a whole number >= 1, got 0 (fix: use e.g. --train-layers 2)"),
    ([*FIT, "--cache-limit-gb", "-1"],
     "error: --cache-limit-gb must be a finite number > 0, got -1.0 (fix: use e.g. --cache-limit-gb 4)"),
    ([*FIT, "--lr", "inf"], "error: --lr must be a finite number > 0, got inf (fix: use e.g. --lr 0.0001)"),
    ([*FIT, "--epochs", "-1"], "error: --epochs must be a whole number >= 0, got -1 (fix: use e.g. --epochs 6)"),
    ([*FIT, "--patience", "0"], "error: --patience must be a whole number >= 1, got 0 (fix: use e.g. --patience 2)"),
    ([*FIT, "--lora-rank", "0"], "error: --lora-rank must be a whole number >= 1, got 0 (fix: use e.g. --lora-rank 16)"),
    ([*FIT, "--batch-tokens", "0"],
     "error: --batch-tokens must be a whole number >= 1, got 0 (fix: use e.g. --batch-tokens 4096)"),
    # analyze's scoring options are checked with or without a critic (--workers 0 without one was exit 1)
    (["analyze", "r.jsonl", "--out", "t", "--workers", "0"],
     "error: --workers must be at least 1, got 0 (fix: use e.g. --workers 2)"),
    (["analyze", "r.jsonl", "--out", "t", "--threads", "0"],
     "error: --threads must be at least 1, got 0 (fix: use e.g. --threads 1)"),
    (["analyze", "r.jsonl", "--out", "t", "--token-budget", "0"],
     "error: --token-budget must be at least 1, got 0 (fix: use e.g. --token-budget 16384)"),
    (["analyze", "r.jsonl", "--out", "t", "--ray-address", "auto"],
     "error: --ray-address is for the ray backend (fix: add --backend ray)"),
])
def test_bad_option_values_exit_2_with_one_line(tmp_path, monkeypatch, args, want):
    """Was exit 1 (README: exit 2 in every command)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "r.jsonl").write_text(ROW)
    res = CliRunner().invoke(app, args)
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert res.exit_code == 2 and lines == [want], res.output
    assert not (tmp_path / "t").exists()


def _trainer(tmp_path, steps: int = 2) -> Trainer:
    cfg = tmp_path / "tiny.toml"
    cfg.write_text(tiny_train_toml(steps=steps, tail="[log]\nsave_every = 1\naudit_every = 0\n"))
    return Trainer(load_config(cfg), tmp_path / "run")


def test_a_non_finite_update_stops_and_keeps_the_last_good_checkpoint(tmp_path):
    """Was: NaN weights saved as the run's checkpoint, exit 0."""
    tr = _trainer(tmp_path)
    try:
        tr.step()
        with torch.no_grad():  # a critic gone non-finite (what an exploding lr does): its values are NaN
            next(tr.critic.parameters()).fill_(math.nan)
        with pytest.raises(TrainingError) as ei:
            tr.step()
    finally:
        tr.close()
    run = tmp_path / "run"
    assert str(ei.value) == (
        f"{run}: step 2: the update made the policy gradient norm (nan) and the policy and the critic non-finite "
        f"(NaN/inf); training stopped and nothing of step 2 was saved; train --resume --out {run} continues from "
        "checkpoints/step_1 (step 1) (fix: lower optim.lr (or optim.critic_lr) or set optim.grad_clip, in a new "
        "--out or after the last good checkpoint)")
    assert (run / "checkpoints" / "latest").read_text().strip() == "step_1"
    assert sorted(p.name for p in (run / "checkpoints").glob("step_*")) == ["step_1"]
    assert [json.loads(ln)["step"] for ln in (run / "metrics.jsonl").read_text().splitlines()] == [1]


def test_describe_resume_reads_the_latest_checkpoint(tmp_path):
    run = tmp_path / "run"
    assert describe_resume(run) == "no checkpoint was saved yet: rerunning the same command starts the run over from step 0"
    tr = _trainer(tmp_path, steps=1)
    try:
        tr.train()
    finally:
        tr.close()
    assert describe_resume(run) == f"train --resume --out {run} continues from checkpoints/step_1 (step 1)"


def test_ctrl_c_in_train_says_where_resume_continues(tmp_path, monkeypatch):
    """Was: nothing printed, exit 130. The Ctrl-C is raised where the user's would land: in step 2."""
    cfg = tmp_path / "tiny.toml"
    cfg.write_text(tiny_train_toml(steps=3, tail="[log]\nsave_every = 1\naudit_every = 0\n"))
    real = Trainer.step

    def step(self):
        if self.step_count == 1:
            raise KeyboardInterrupt
        return real(self)

    monkeypatch.setattr(Trainer, "step", step)
    run = tmp_path / "run"
    res = CliRunner().invoke(app, ["train", "--config", str(cfg), "--out", str(run), "--quiet"])
    assert res.exit_code == 130, res.output
    assert res.output.strip().splitlines()[-1] == (
        f"interrupted: train --resume --out {run} continues from checkpoints/step_1 (step 1)")


def test_ctrl_c_in_analyze_without_a_critic_says_nothing_was_written(tmp_path, monkeypatch):
    """Was: 'nothing to resume yet: no chunk of critic scores was complete' with no critic at all."""
    import critic_audit.pipeline

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(critic_audit.pipeline, "analyze", interrupted)
    (tmp_path / "r.jsonl").write_text(ROW)
    res = CliRunner().invoke(app, ["analyze", str(tmp_path / "r.jsonl"), "--out", str(tmp_path / "o")])
    assert res.exit_code == 130
    assert res.output.strip().splitlines()[-1] == (
        f"interrupted; nothing was written ({tmp_path / 'o'} is written only when the analysis ends); "
        "re-run the command")


def test_head_fit_options_are_checked_when_built():
    """The library's FitConfig / FitOptions refuse a bad ridge at construction (was: after the backbone load)."""
    from critic_audit.critic.fit import FitConfig
    from critic_audit.pipeline.fit import FitOptions

    for cls in (FitConfig, FitOptions):
        with pytest.raises(UsageError, match=r"^--ridge must be a finite number >= 0, got inf"):
            cls(ridge=math.inf)
        with pytest.raises(UsageError, match=r"^--weighting must be trajectory or token, got 'tokens'"):
            cls(weighting="tokens")
    assert FitConfig(ridge=0.0).ridge == 0.0  # 0: ordinary least squares


@pytest.mark.parametrize("content, want", [
    (b"\x00\x01garbage", "{d}: unreadable safetensors file model.safetensors ({why}): damaged or incomplete "
                         "(fix: download model.safetensors again, or rebuild the critic folder with critic-audit "
                         "build-critic (or fit-critic))"),
    (b"version https://git-lfs.github.com/spec/v1\noid sha256:" + b"0" * 64 + b"\nsize 1234567\n",
     "{d}: model.safetensors is a Git LFS pointer file ({n} bytes), not the weights (fix: fetch the weights: "
     "git lfs pull in the critic's repository (or download the file itself))"),
])
def test_a_bad_safetensors_file_names_the_fix(tmp_path, rollouts, content, want):
    """Was: 'unreadable safetensors file ... (invalid header length)' with no fix; a Git LFS pointer the same."""
    from conftest import make_critic_dir
    from safetensors import SafetensorError, safe_open

    d = tmp_path / "critic"
    make_critic_dir(d)
    (d / "model.safetensors").write_bytes(content)
    try:
        safe_open(str(d / "model.safetensors"), framework="pt")
        why = None
    except SafetensorError as e:
        why = str(e).splitlines()[0]
    res = CliRunner().invoke(app, ["analyze", str(rollouts), "--critic", str(d), "--out", str(tmp_path / "o"),
                                   "--no-plots", "--device", "cpu"])
    lines = [ln for ln in res.output.splitlines() if ln.startswith("error:")]
    assert res.exit_code == 1 and lines == ["error: " + want.format(d=d, why=why, n=len(content))], res.output
