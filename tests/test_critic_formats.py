"""Critic checkpoint formats: one tiny model saved in every layout gives the same values.

The reference is a random tiny Llama token-classification critic (score weight + bias 0.25). Every
layout is written by hand from its weights (no network, no framework installed besides peft/gguf).
"""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from critic_audit.critic import load_critic, save_head, score_values
from critic_audit.errors import CheckpointError

VOCAB, HIDDEN, MAX_POS, HEADS, KV = 64, 32, 128, 4, 2
BIAS = 0.25
HAS_PEFT = importlib.util.find_spec("peft") is not None
HAS_GGUF = importlib.util.find_spec("gguf") is not None


def _tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {t: i for i, t in enumerate(["<pad>", "<unk>", "<|im_start|>", "<|im_end|>"] + [f"w{i}" for i in range(VOCAB - 4)])}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", pad_token="<pad>", eos_token="<|im_end|>")


def _config(arch: str):
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=64, num_hidden_layers=2,
                       num_attention_heads=HEADS, num_key_value_heads=KV, max_position_embeddings=MAX_POS,
                       pad_token_id=0, num_labels=1, architectures=[arch], tie_word_embeddings=False)


def _save(state: dict, f: Path) -> None:
    from safetensors.torch import save_file

    save_file({k: v.detach().contiguous().clone() for k, v in state.items()}, str(f), metadata={"format": "pt"})


def _hf_folder(d: Path, arch: str, state: dict, **cfg_extra) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    cfg = _config(arch).to_dict()
    cfg.update(cfg_extra)
    (d / "config.json").write_text(json.dumps(cfg))
    _save(state, d / "model.safetensors")
    _tokenizer().save_pretrained(d)
    return d


@pytest.fixture(scope="module")
def ref(tmp_path_factory):
    """(reference folder, backbone state dict with ``model.`` keys, head weight [1, H], head bias)."""
    from transformers import LlamaForTokenClassification

    torch.manual_seed(0)
    model = LlamaForTokenClassification(_config("LlamaForTokenClassification")).eval()
    with torch.no_grad():
        model.score.weight.normal_(0, 1.0)
        model.score.bias.fill_(BIAS)
    d = tmp_path_factory.mktemp("ref")
    model.save_pretrained(d)
    _tokenizer().save_pretrained(d)
    sd = {k: v.detach().clone() for k, v in model.state_dict().items()}
    backbone = {k: v for k, v in sd.items() if k.startswith("model.")}
    return d, backbone, sd["score.weight"].clone(), sd["score.bias"].clone()


@pytest.fixture(scope="module")
def seqs():
    rng = np.random.default_rng(0)
    return [rng.integers(4, VOCAB, size=n).astype(np.int64) for n in (23, 9, 40, 2)]


@pytest.fixture(scope="module")
def ref_values(ref, seqs):
    return score_values(load_critic(ref[0], device="cpu", dtype="float32"), seqs, token_budget=64)


def _check(path, seqs, expected, *, fmt: str, shift: float = 0.0, **kw):
    c = load_critic(path, device="cpu", dtype="float32", **kw)
    assert c.format == fmt
    got = score_values(c, seqs, token_budget=64)
    for a, b in zip(got, expected, strict=True):
        np.testing.assert_allclose(a, b - shift, atol=1e-5, equal_nan=True)
    return c


def test_hf_and_verl_export(ref, seqs, ref_values, tmp_path):
    _check(ref[0], seqs, ref_values, fmt="hf-token-classification")
    d = tmp_path / "verl_export"
    shutil.copytree(ref[0], d)
    cfg = json.loads((d / "config.json").read_text())
    cfg["architectures"] = ["LlamaForCausalLM"]
    (d / "config.json").write_text(json.dumps(cfg))
    _check(d, seqs, ref_values, fmt="verl-causal-config")


def test_trl_sequence_classification(ref, seqs, ref_values, tmp_path):
    _, backbone, w, _ = ref
    d = _hf_folder(tmp_path / "seqcls", "LlamaForSequenceClassification", {**backbone, "score.weight": w})
    _check(d, seqs, ref_values, fmt="trl-sequence-classification", shift=BIAS)  # no bias


def test_trl_value_head(ref, seqs, ref_values, tmp_path):
    _, backbone, w, b = ref
    lm_head = torch.randn(VOCAB, HIDDEN)
    vh = {"v_head.summary.weight": w, "v_head.summary.bias": b}
    d = _hf_folder(tmp_path / "trl", "LlamaForCausalLM", {**backbone, "lm_head.weight": lm_head, **vh})
    _check(d, seqs, ref_values, fmt="trl-value-head")
    # the value head in a separate file
    d2 = _hf_folder(tmp_path / "trl_side", "LlamaForCausalLM", {**backbone, "lm_head.weight": lm_head})
    _save(vh, d2 / "value_head.safetensors")
    c = _check(d2, seqs, ref_values, fmt="trl-value-head")
    assert d2 / "value_head.safetensors" in c.files
    # ... or in a pickle: only with the flag
    d3 = _hf_folder(tmp_path / "trl_bin", "LlamaForCausalLM", {**backbone, "lm_head.weight": lm_head})
    torch.save(vh, d3 / "value_head.bin")
    with pytest.raises(CheckpointError, match="pickle"):
        load_critic(d3, device="cpu")
    _check(d3, seqs, ref_values, fmt="trl-value-head", allow_pickle=True)


def test_openrlhf(ref, seqs, ref_values, tmp_path):
    _, backbone, w, _ = ref
    # no bias; normalize_reward: value = (raw - mean) / std, so raw = w*std.h and mean = -BIAS*std
    std = 2.0
    d = _hf_folder(tmp_path / "orlhf", "LlamaForCausalLM", {**backbone, "value_head.weight": w * std},
                   normalize_reward=True, mean=-BIAS * std, std=std)
    c = _check(d, seqs, ref_values, fmt="openrlhf")
    assert c.details["normalize_reward"] and c.details["std"] == std
    # normalize_reward off: mean/std ignored; a custom value_head_prefix
    d2 = _hf_folder(tmp_path / "orlhf2", "LlamaForCausalLM", {**backbone, "critic_head.weight": w},
                    value_head_prefix="critic_head", normalize_reward=False, mean=5.0, std=3.0)
    _check(d2, seqs, ref_values, fmt="openrlhf", shift=BIAS)


def _verl_fsdp(d: Path, ref, world: int) -> Path:
    _, backbone, w, b = ref
    state = {**backbone, "score.weight": w, "score.bias": b}
    d.mkdir()
    for r in range(world):
        torch.save({k: torch.tensor_split(v, world, dim=0)[r].clone() for k, v in state.items()},
                   d / f"model_world_size_{world}_rank_{r}.pt")
    hf = d / "huggingface"
    hf.mkdir()
    (hf / "config.json").write_text(json.dumps(_config("LlamaForTokenClassification").to_dict()))
    _tokenizer().save_pretrained(hf)
    return d


def test_verl_fsdp_sharded(ref, seqs, ref_values, tmp_path):
    d = _verl_fsdp(tmp_path / "actor", ref, 2)
    with pytest.raises(CheckpointError, match="pickle") as exc:
        load_critic(d, device="cpu")
    assert "verl FSDP" in str(exc.value) and "--allow-pickle" in str(exc.value)
    c = _check(d, seqs, ref_values, fmt="verl-fsdp", allow_pickle=True)
    assert c.details["world_size"] == 2
    from critic_audit.critic import CriticSpec, ScoringConfig

    spec = CriticSpec.from_scoring(ScoringConfig(str(d), device="cpu", allow_pickle=True))  # the CLI's --allow-pickle
    assert spec.allow_pickle and spec.inspect().format == "verl-fsdp"
    (d / "model_world_size_2_rank_1.pt").unlink()
    with pytest.raises(CheckpointError, match=r"lacks rank file\(s\) \[1\]"):
        load_critic(d, device="cpu", allow_pickle=True)


def test_backbone_plus_head_file(ref, seqs, ref_values, tmp_path):
    _, backbone, w, b = ref
    d = _hf_folder(tmp_path / "lm", "LlamaForCausalLM", {**backbone, "lm_head.weight": torch.randn(VOCAB, HIDDEN)})
    with pytest.raises(CheckpointError, match="lm_head.weight but no score.weight"):
        load_critic(d, device="cpu")
    head = save_head(w.numpy(), float(b), tmp_path / "elsewhere" / "head.safetensors")
    _check(d, seqs, ref_values, fmt="backbone+head", head=head)
    shutil.copy(head, d / "critic_head.safetensors")  # beside the backbone: found by itself
    _check(d, seqs, ref_values, fmt="backbone+head")


@pytest.mark.skipif(not HAS_PEFT, reason="peft not installed")
@pytest.mark.filterwarnings("ignore::FutureWarning")
@pytest.mark.parametrize("head_in", ["modules_to_save", "side_file"])
def test_peft_lora(ref, seqs, ref_values, tmp_path, head_in):
    from peft import LoraConfig, get_peft_model
    from peft.tuners.lora import LoraLayer
    from transformers import LlamaForTokenClassification

    ref_dir, backbone, w, b = ref
    torch.manual_seed(3)
    model = LlamaForTokenClassification.from_pretrained(ref_dir, num_labels=1).eval()
    lcfg = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                      modules_to_save=["score"] if head_in == "modules_to_save" else None)
    pm = get_peft_model(model, lcfg)
    deltas = {}
    with torch.no_grad():
        for name, mod in pm.named_modules():
            if isinstance(mod, LoraLayer):
                mod.lora_A["default"].weight.normal_(0, 0.3)
                mod.lora_B["default"].weight.normal_(0, 0.3)
                deltas[name.removeprefix("base_model.model.") + ".weight"] = mod.get_delta_weight("default").clone()
    assert deltas
    adapter = tmp_path / "adapter"
    pm.save_pretrained(adapter)
    # the base: reference weights minus the LoRA deltas, saved as a causal LM without a value head
    base_state = {k: (v - deltas[k] if k in deltas else v) for k, v in backbone.items()}
    base = _hf_folder(tmp_path / "base", "LlamaForCausalLM", {**base_state, "lm_head.weight": torch.randn(VOCAB, HIDDEN)})
    acfg = json.loads((adapter / "adapter_config.json").read_text())
    acfg["base_model_name_or_path"] = str(base)
    (adapter / "adapter_config.json").write_text(json.dumps(acfg))
    if head_in == "side_file":
        save_head(w.numpy(), float(b), adapter / "value_head.safetensors")
    c = _check(adapter, seqs, ref_values, fmt="peft-lora")
    assert c.details["base_model"] == str(base)
    # the base alone differs (the deltas matter)
    acfg["base_model_name_or_path"] = str(tmp_path / "nowhere")
    (adapter / "adapter_config.json").write_text(json.dumps(acfg))
    with pytest.raises(CheckpointError, match="not a local folder"):
        load_critic(adapter, device="cpu")


def _permute(w: np.ndarray, n_head: int, n_kv: int) -> np.ndarray:
    """llama.cpp's q/k row permutation (the inverse of transformers' GGUF reader)."""
    n = n_kv if n_kv != n_head else n_head
    return w.reshape(n, 2, w.shape[0] // n // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _write_gguf(f: Path, backbone: dict) -> None:
    import gguf

    w = gguf.GGUFWriter(str(f), "llama")
    w.add_name("tiny")
    w.add_context_length(MAX_POS)
    w.add_embedding_length(HIDDEN)
    w.add_feed_forward_length(64)
    w.add_block_count(2)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV)
    w.add_layer_norm_rms_eps(_config("x").rms_norm_eps)
    w.add_rope_freq_base(10000.0)
    w.add_vocab_size(VOCAB)
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, 2)
    for k, v in backbone.items():
        a = v.float().numpy()
        if ".q_proj." in k:
            a = _permute(a, HEADS, HEADS)
        elif ".k_proj." in k:
            a = _permute(a, HEADS, KV)
        w.add_tensor(names.get_name(k, try_suffixes=(".weight", ".bias")), np.ascontiguousarray(a))
    w.add_tensor("output.weight", np.zeros((VOCAB, HIDDEN), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.mark.skipif(not HAS_GGUF, reason="gguf not installed")
def test_gguf_backbone_with_head(ref, seqs, ref_values, tmp_path):
    _, backbone, w, b = ref
    d = tmp_path / "gguf"
    d.mkdir()
    _write_gguf(d / "tiny.gguf", backbone)
    _tokenizer().save_pretrained(d)  # tokenizer files beside the .gguf are preferred
    with pytest.raises(CheckpointError, match="without a value head file"):
        load_critic(d, device="cpu")
    head = save_head(w.numpy(), float(b), tmp_path / "head.safetensors")
    _check(d / "tiny.gguf", seqs, ref_values, fmt="gguf", head=head)  # file + head argument
    shutil.copy(head, d / "head.safetensors")
    c = _check(d, seqs, ref_values, fmt="gguf")  # folder
    assert c.max_length == MAX_POS


def test_no_format_matches_names_what_was_found(tmp_path):
    d = tmp_path / "junk"
    d.mkdir()
    (d / "notes.txt").write_text("x")
    (d / "optimizer.pt").write_bytes(b"")
    with pytest.raises(CheckpointError) as exc:
        load_critic(d, device="cpu")
    msg = str(exc.value)
    assert "no critic format matches" in msg and "notes.txt" in msg and "optimizer.pt" in msg and str(d) in msg
    # a config with weights but no value head of any kind
    e = _hf_folder(tmp_path / "nohead", "LlamaModel", {"embed_tokens.weight": torch.zeros(VOCAB, HIDDEN)})
    with pytest.raises(CheckpointError, match=r"no value head \(none of score.weight, v_head.summary.weight, value_head.weight"):
        load_critic(e, device="cpu")


def test_missing_backbone_weights_are_an_error(ref, tmp_path):
    _, backbone, w, b = ref
    partial = {k: v for k, v in backbone.items() if ".layers.1." not in k}
    d = _hf_folder(tmp_path / "partial", "LlamaForCausalLM", {**partial, "v_head.summary.weight": w, "v_head.summary.bias": b})
    with pytest.raises(CheckpointError, match="missing"):
        load_critic(d, device="cpu")


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vllm installed")
def test_vllm_backend_is_guarded(ref):
    from critic_audit.critic.vllm_backend import make_vllm_critic, vllm_available
    from critic_audit.errors import ConfigError

    assert not vllm_available()
    with pytest.raises(ConfigError, match="vllm"):
        make_vllm_critic(ref[0])


def test_token_classification_folder_missing_backbone_weights_is_an_error(tmp_path):
    """A Hugging Face token-classification critic whose file lacks a layer is refused, never loaded
    with that layer randomly initialised (its score head present)."""
    from safetensors.torch import load_file, save_file

    from conftest import make_critic_dir

    d = make_critic_dir(tmp_path / "critic")
    full = load_file(d / "model.safetensors")
    assert any(".layers.1." in k for k in full) and "score.weight" in full
    load_critic(d, device="cpu")  # the complete folder loads
    save_file({k: v for k, v in full.items() if ".layers.1." not in k}, d / "model.safetensors",
              metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match=r"backbone weight\(s\) missing .*layers\.1\..*randomly initialised"):
        load_critic(d, device="cpu")
