"""Parallel MTP heads through conversion: OUT/mtp in their own documented format, the refusals (one
sentence each), import back bitwise, drop-mtp, and decoding from the export reproduces megatron-core's
head logits and plain greedy output."""

from __future__ import annotations

import json

import pytest
import torch

from megatron_mtp.checkpoint.torch_dist_reader import TorchDistReader
from megatron_mtp.convert.drop_mtp import drop_mtp
from megatron_mtp.convert.from_hf import import_from_hf
from megatron_mtp.convert.to_hf import export_to_hf
from megatron_mtp.errors import UserError
from tests.convert.conftest import TRAIN_OVERRIDES, megatron_forward
from tests.convert.helpers import megatron_cli, same_tree

HEADS = 2


@pytest.fixture(scope="module")
def heads_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("heads_run") / "run"
    megatron_cli("train", "configs/tiny_cpu.yaml", "--run-dir", str(run_dir), "--max-steps", "2", *TRAIN_OVERRIDES,
                 "mtp.style=parallel", f"mtp.num_layers={HEADS}")
    return run_dir


@pytest.fixture(scope="module")
def heads_export(heads_run, tmp_path_factory):
    return export_to_hf(heads_run, tmp_path_factory.mktemp("heads_export") / "fp32", dtype="fp32")


def test_heads_directory_has_its_own_documented_config(heads_export):
    main_cfg = json.loads((heads_export / "main" / "config.json").read_text())
    cfg = json.loads((heads_export / "mtp" / "config.json").read_text())
    assert main_cfg["num_nextn_predict_layers"] == 0
    assert cfg["architectures"] == ["DeepseekV3ParallelMTPHeads"]
    assert cfg["model_type"] == "deepseek_v3_parallel_mtp_heads" and cfg["num_heads"] == HEADS
    assert (cfg["head_input"], cfg["head_layer"], cfg["head_output"]) == (
        "main_final_norm", "moe", "own_norm_then_main_lm_head")
    assert cfg["main_config"]["hidden_size"] == main_cfg["hidden_size"]
    names = json.loads((heads_export / "mtp" / "model.safetensors.index.json").read_text())["weight_map"]
    assert all(n.startswith(("heads.0.", "heads.1.")) for n in names)
    assert {"heads.0.norm.weight", "heads.1.self_attn.kv_a_proj_with_mqa.weight",
            "heads.1.mlp.experts.7.down_proj.weight", "heads.0.mlp.gate.e_score_correction_bias"} <= set(names)
    assert not any("embed_tokens" in n or "lm_head" in n for n in names)
    serving = (heads_export / "SERVING.md").read_text()
    assert "2 parallel MTP heads in mtp/" in serving and "--speculative-config" not in serving


@pytest.mark.parametrize("kwargs,words", [
    ({"mtp": "inline"}, "--mtp inline needs sequential MTP modules"),
    ({"mtp_layout": "nextn"}, "--mtp-layout nextn is SGLang's layout for one sequential MTP module"),
    ({"serve_for": "vllm"}, "vLLM drafts only with DeepSeek-V3's sequential MTP modules"),
    ({"serve_for": "sglang"}, "SGLang drafts only with"),
    ({"serve_for": "transformers"}, "transformers drafts only with"),
])
def test_refusals_are_one_sentence_and_write_nothing(heads_run, tmp_path, kwargs, words):
    with pytest.raises(UserError) as info:
        export_to_hf(heads_run, tmp_path / "out", **kwargs)
    text = str(info.value)
    assert words in text and "parallel MTP heads" in text and text.count(". ") == 0
    assert not (tmp_path / "out").exists()


def test_main_only_export_is_allowed_for_every_engine(heads_run, heads_export, tmp_path):
    out = export_to_hf(heads_run, tmp_path / "vllm", serve_for="vllm", mtp="none", dtype="fp32")
    assert (out / "model.safetensors.index.json").is_file() or any(out.glob("*.safetensors"))


def test_import_back_is_bitwise(heads_run, heads_export, tmp_path):
    ckpt = import_from_hf(heads_export, tmp_path / "ckpt")
    cfg = (ckpt / "config.yaml").read_text()
    assert "style: parallel" in cfg and f"num_layers: {HEADS}" in cfg.split("mtp:")[1]
    keys = set(TorchDistReader(ckpt).keys())
    trained = TorchDistReader(next((heads_run / "checkpoints").glob("step_*")))
    heads_keys = {k for k in trained.keys() if k.startswith("mtp_heads.")}
    assert heads_keys and heads_keys <= keys
    for key in sorted(heads_keys):
        assert torch.equal(TorchDistReader(ckpt).read(key), trained.read(key)), key
    same_tree(export_to_hf(ckpt, tmp_path / "again", dtype="fp32"), heads_export)
    # --no-mtp leaves the heads out
    main_only = import_from_hf(heads_export, tmp_path / "main_only", with_mtp=False)
    assert not any(k.startswith("mtp_heads.") for k in TorchDistReader(main_only).keys())


def test_drop_mtp_removes_the_heads(heads_run, heads_export, tmp_path):
    dropped = drop_mtp(heads_run, tmp_path / "dropped")
    assert not any(k.startswith("mtp_heads.") for k in TorchDistReader(dropped).keys())
    assert "num_layers: 0" in (dropped / "config.yaml").read_text().split("mtp:")[1].split("\n")[1]
    same_tree(export_to_hf(dropped, tmp_path / "hf", mtp="none", dtype="fp32"), heads_export / "main")
    same_tree(drop_mtp(heads_export, tmp_path / "hf_dropped"), heads_export / "main")


def test_decoder_heads_reproduce_megatron_head_logits(heads_run, heads_export, tmp_path):
    from megatron_mtp.inference.generate import load_generator

    tokens = torch.randint(0, 4000, (2, 12), generator=torch.Generator().manual_seed(3))
    torch.save(tokens, tmp_path / "tokens.pt")
    reference = megatron_forward(heads_run, tmp_path / "tokens.pt", tmp_path / "out.pt")
    assert len(reference["mtp_logits"]) == HEADS
    gen = load_generator(heads_export)
    for b in range(tokens.shape[0]):
        gen.target.reset_cache()
        logits, hidden = gen.target.forward(tokens[b].tolist())
        assert (logits - reference["logits"][b]).abs().max() < 1e-4
        for k, head in enumerate(gen.drafter.heads):
            head.reset_cache()
            with torch.inference_mode():
                ours = gen.drafter.logits(head, head.step(hidden, 0))
            assert (ours - reference["mtp_logits"][k][b]).abs().max() < 1e-4, k


def test_greedy_speculative_from_the_trained_export_equals_plain(heads_export):
    from megatron_mtp.inference.generate import load_generator

    gen = load_generator(heads_export)
    plain = gen.generate("def add(a, b):\n    return", max_new_tokens=30, ignore_eos=True)
    for k in (1, 2):
        spec = gen.generate("def add(a, b):\n    return", max_new_tokens=30, ignore_eos=True, speculative_k=k)
        assert spec.tokens == plain.tokens


def test_fp8_heads_import_back_and_export_the_same_bytes(heads_run, tmp_path):
    out = export_to_hf(heads_run, tmp_path / "fp8", dtype="fp8")
    names = json.loads((out / "mtp" / "model.safetensors.index.json").read_text())["weight_map"]
    assert "heads.1.self_attn.q_b_proj.weight_scale_inv" in names and "heads.1.norm.weight_scale_inv" not in names
    ckpt = import_from_hf(out, tmp_path / "ckpt")
    assert TorchDistReader(ckpt).entry("mtp_heads.layers.1.final_layernorm.weight").shape[0] > 0
    same_tree(export_to_hf(ckpt, tmp_path / "again", dtype="fp8"), out)


def test_gemma4_heads_decode_as_training_and_import_back(tmp_path):
    """Gemma 4 builds the same heads, each a layer of its MTP kind (full attention, the MoE block beside the
    dense MLP, its layer scalar), read through the soft-capped output layer: the export decodes with
    megatron-core's head logits, speculative greedy equals plain, and it imports back bitwise."""
    from megatron_mtp.inference.generate import load_generator

    run = tmp_path / "run"
    megatron_cli("train", "configs/gemma4_tiny_cpu.yaml", "--run-dir", str(run), "--max-steps", "1",
                 *TRAIN_OVERRIDES[1:], "model.sliding_window=5", "mtp.style=parallel", f"mtp.num_layers={HEADS}")
    export = export_to_hf(run, tmp_path / "hf", dtype="fp32")
    assert json.loads((export / "mtp" / "config.json").read_text())["architectures"] == ["Gemma4ParallelMTPHeads"]
    tokens = torch.randint(0, 4000, (1, 12), generator=torch.Generator().manual_seed(3))
    torch.save(tokens, tmp_path / "tokens.pt")
    reference = megatron_forward(run, tmp_path / "tokens.pt", tmp_path / "out.pt")
    gen = load_generator(export)
    gen.target.reset_cache()
    _, hidden = gen.target.forward(tokens[0].tolist())  # 12 tokens: windows of 5 slide
    for k, head in enumerate(gen.drafter.heads):
        head.reset_cache()
        with torch.inference_mode():
            ours = gen.drafter.logits(head, head.step(hidden, 0))
        assert (ours - reference["mtp_logits"][k][0]).abs().max() < 1e-4, k
    plain = gen.generate("def add(a, b):\n    return", max_new_tokens=16, ignore_eos=True)
    spec = gen.generate("def add(a, b):\n    return", max_new_tokens=16, ignore_eos=True, speculative_k=HEADS)
    assert spec.tokens == plain.tokens
    same_tree(export_to_hf(import_from_hf(export, tmp_path / "ckpt"), tmp_path / "again", dtype="fp32"), export)
