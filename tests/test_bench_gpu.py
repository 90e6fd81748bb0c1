"""benchmarks/bench_gpu.py end to end on CPU in its tiny mode (the code path of the GPU benchmark; no
GPU figures: tokens/s of a 2-layer random model on CPU mean nothing)."""

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import bench_gpu  # noqa: E402


def test_bench_gpu_tiny_on_cpu(tmp_path, monkeypatch, capsys, one_torch_thread):
    out = tmp_path / "rows.json"
    monkeypatch.setattr(sys, "argv", ["bench_gpu.py", "--device", "cpu", "--tiny", "--n", "6", "--workers=",
                                      "--out", str(out)])
    assert bench_gpu.main() == 0
    text = capsys.readouterr().out
    rows = json.loads(out.read_text())
    labels = [r["row"] for r in rows]
    assert labels == ["varied / padded / sdpa", "varied / packed / sdpa", "groups / padded / sdpa",
                      "groups / shared / sdpa"]
    assert all(r["tokens_per_s"] > 0 and r["tokens"] > 0 for r in rows)
    packed = rows[1]
    assert packed["padding_efficiency"] >= rows[0]["padding_efficiency"]  # padding-free rows
    assert rows[3]["fed_per_scored"] < rows[2]["fed_per_scored"]  # the group prompts fed once
    assert "packed vs padded:" in text and "not on a GPU" in text and text.rstrip().splitlines()[-1].startswith("best:")
