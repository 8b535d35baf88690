"""`to-hf --dtype fp8`: DeepSeek's block quantisation, the release's tensor rules in every layout, the import
back, drop-mtp, and transformers loading the export."""

from __future__ import annotations

import json
import math

import pytest
import torch

from megatron_mtp.checkpoint.finite import recorded_finite
from megatron_mtp.checkpoint.info import read_config
from megatron_mtp.checkpoint.run_dir import resolve_checkpoint
from megatron_mtp.checkpoint.torch_dist_reader import TorchDistReader
from megatron_mtp.convert import serving
from megatron_mtp.convert.drop_mtp import drop_mtp
from megatron_mtp.convert.fp8_export import is_fp8_weight, quantize_blockwise
from megatron_mtp.convert.from_hf import import_from_hf
from megatron_mtp.convert.to_hf import export_to_hf, plan_export
from megatron_mtp.hf_dir.fp8 import dequantize_blockwise
from megatron_mtp.hf_dir.safetensors_io import HFDir
from megatron_mtp.models.tensor_table import EMBEDDING
from tests.convert.helpers import hf_tensors, reference_fp8_quantize, same_tree

pytestmark = pytest.mark.skipif(not hasattr(torch, "float8_e4m3fn"), reason="torch without float8")

# The release's rules, restated: these linears are FP8 with a scale per 128x128 block; the rest is bf16,
# except the expert bias (fp32).
FP8_SUFFIXES = ("q_a_proj.weight", "q_b_proj.weight", "kv_a_proj_with_mqa.weight", "kv_b_proj.weight",
                "o_proj.weight", "gate_proj.weight", "up_proj.weight", "down_proj.weight")
RELEASE_QUANT = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8", "weight_block_size": [128, 128]}


def _half_step(y: torch.Tensor) -> torch.Tensor:
    """Half the spacing of e4m3 values at |y| (normal from 2**-6, subnormal steps of 2**-9 below)."""
    exponent = torch.floor(torch.log2(y.abs().clamp(min=2.0 ** -6)))
    return torch.exp2(exponent - 4)


def _within_block_bound(w: torch.Tensor, q: torch.Tensor, scale: torch.Tensor) -> None:
    back = dequantize_blockwise(q, scale)
    per = scale.repeat_interleave(128, 0)[: w.shape[0]].repeat_interleave(128, 1)[:, : w.shape[1]]
    err = (back - w.float()).abs()
    bound = per * _half_step(w.float() / per) + w.float().abs() * 2.0 ** -22  # + fp32 rounding of x / scale
    assert bool((err <= bound).all()), (err - bound).max()


def _varied(shape, seed):
    """Random weights whose 128x128 blocks differ in magnitude by up to 1e6, one block all zero."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(shape, generator=g)
    rb, cb = math.ceil(shape[0] / 128), math.ceil(shape[1] / 128)
    mags = torch.exp(torch.empty(rb, cb).uniform_(-12, 2, generator=g))
    w *= mags.repeat_interleave(128, 0)[: shape[0]].repeat_interleave(128, 1)[:, : shape[1]]
    w[:128, :128] = 0
    return w


@pytest.mark.parametrize("shape", [(300, 200), (128, 384), (5, 3), (576, 260)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_quantisation_is_deepseeks_rule_within_the_bound_of_each_block(shape, dtype):
    w = _varied(shape, sum(shape)).to(dtype)
    q, scale = quantize_blockwise(w)
    ref_q, ref_scale = reference_fp8_quantize(w)
    assert q.dtype == torch.float8_e4m3fn and scale.dtype == torch.float32
    assert scale.shape == (math.ceil(shape[0] / 128), math.ceil(shape[1] / 128))
    assert torch.equal(scale, ref_scale)
    assert torch.equal(q.view(torch.uint8), ref_q.view(torch.uint8))
    _within_block_bound(w, q, scale)
    if shape[0] > 128 and shape[1] > 128:
        assert scale[0, 0] == 1 and not q[:128, :128].float().any()  # the zero block
    # each non-zero block's largest value lands on ±448
    assert (q.float().abs() == 448).sum() >= (scale != 1).sum()


def test_requantising_the_dequantised_values_is_bitwise():
    for seed in range(4):
        w = _varied((640, 512), seed)
        q, scale = quantize_blockwise(w)
        back = dequantize_blockwise(q, scale)  # what an import stores
        assert not torch.equal(back, w)
        q2, scale2 = quantize_blockwise(back)
        assert torch.equal(scale2, scale) and torch.equal(q2.view(torch.uint8), q.view(torch.uint8))


def test_the_dsa_indexer_keeps_weights_proj_in_bf16_as_the_engines_read_it():
    """vLLM fuses weights_proj unquantised with wk (dequantising an FP8 wk), SGLang builds it in bf16."""
    indexer = "model.layers.0.self_attn.indexer."
    assert is_fp8_weight(indexer + "wq_b.weight") and is_fp8_weight(indexer + "wk.weight")
    assert not is_fp8_weight(indexer + "weights_proj.weight")


def test_sglang_runs_an_fp8_draft_and_still_refuses_fp32():
    base = serving.Export(out=__import__("pathlib").Path("/o"), layout="nextn", dtype="fp8", num_layers=61, depth=1,
                          hidden_size=7168, moe=True, tied=False, mla_head_size=576)
    assert serving.problems("sglang", base) == []
    assert [p.fact for p in serving.problems("sglang", __import__("dataclasses").replace(base, dtype="fp32"))] == [
        "dtype"]


@pytest.fixture(scope="module")
def export_fp8(trained_run, tmp_path_factory):
    return export_to_hf(trained_run, tmp_path_factory.mktemp("fp8") / "fp8", mtp="separate", dtype="fp8")




def test_fp8_export_follows_the_release_rules(export_fp8, export_fp32):
    got = hf_tensors(export_fp8 / "main", export_fp8 / "mtp")
    full = hf_tensors(export_fp32 / "main", export_fp32 / "mtp")
    assert set(got) == set(full) | {n + "_scale_inv" for n in full if n.endswith(FP8_SUFFIXES)}
    for name, ref in full.items():
        t = got[name]
        if name.endswith(FP8_SUFFIXES):
            scale = got[name + "_scale_inv"]
            assert t.dtype == torch.float8_e4m3fn and t.shape == ref.shape, name
            assert scale.dtype == torch.float32, name
            assert scale.shape == (math.ceil(ref.shape[0] / 128), math.ceil(ref.shape[1] / 128)), name
            _within_block_bound(ref, t, scale)
        elif name.endswith("e_score_correction_bias"):
            assert t.dtype == torch.float32 and torch.equal(t, ref), name
        else:  # embeddings, heads, norms, router gate, eh_proj, enorm/hnorm, shared_head
            assert t.dtype == torch.bfloat16 and torch.equal(t, ref.to(torch.bfloat16)), name
    mtp_layer = json.loads((export_fp8 / "main" / "config.json").read_text())["num_hidden_layers"]
    for own in ("eh_proj.weight", "enorm.weight", "hnorm.weight", "shared_head.norm.weight", "shared_head.head.weight",
                "embed_tokens.weight", "mlp.gate.weight"):
        assert got[f"model.layers.{mtp_layer}.{own}"].dtype == torch.bfloat16
    assert got[f"model.layers.{mtp_layer}.self_attn.q_b_proj.weight"].dtype == torch.float8_e4m3fn
    for part in ("main", "mtp"):
        cfg = json.loads((export_fp8 / part / "config.json").read_text())
        assert cfg["quantization_config"] == RELEASE_QUANT and cfg["torch_dtype"] == "bfloat16"


def test_a_partial_block_that_transformers_would_misread_on_a_cpu_is_a_warning(trained_run, tmp_path):
    from megatron_mtp.convert.fp8_export import cpu_dequant_note

    warnings = []
    export_to_hf(trained_run, tmp_path / "fp8", mtp="none", dtype="fp8", warn=warnings.append)
    assert [w for w in warnings if "scale grid" in w] == [
        "transformers dequantises FP8 blocks on a CPU with a block size derived from the scale grid, which is "
        "wrong for 'model.layers.0.self_attn.q_b_proj.weight' (192 is not a multiple of 128); load this export in "
        "transformers on a GPU, or export it with --dtype bf16 for a CPU"]
    step = resolve_checkpoint(trained_run).path
    aligned = __import__("dataclasses").replace(read_config(step), model=__import__("dataclasses").replace(
        read_config(step).model, qk_pos_emb_head_dim=32))
    plans = plan_export(aligned, 4096, "separate", "hf", "fp8")
    assert cpu_dequant_note([t for plan in plans.values() for t in plan]) is None


def test_every_layout_plans_the_fp8_tensors_of_the_separate_export(trained_run, export_fp8):
    step = resolve_checkpoint(trained_run).path
    cfg = read_config(step)
    vocab = TorchDistReader(step).entry(EMBEDDING).shape[0]
    written = {}
    for part in ("main", "mtp"):
        hf = HFDir(export_fp8 / part)
        written[part] = {n: (hf.shape(n), hf.dtype(n)) for n in hf.weight_map}

    def planned(mode, layout="hf"):
        return {d: {p.name: (p.shape, p.dtype) for p in plan} for d, plan in
                plan_export(cfg, vocab, mode, layout, "fp8").items()}

    assert planned("separate") == written
    assert planned("inline") == {"main": {**written["main"], **written["mtp"]}}
    assert planned("none") == {"main": written["main"]}
    nextn = planned("separate", "nextn")["mtp"]
    layers = cfg.model.num_layers
    renamed = {n.replace(f"model.layers.{layers}.", "model.layers.0."): v for n, v in written["mtp"].items()
               if "embed_tokens" not in n and "shared_head.head" not in n}
    assert nextn == renamed and any(n.endswith("_scale_inv") for n in nextn)


def test_fp8_import_is_the_dequantised_values_and_reexport_is_bitwise(export_fp8, tmp_path):
    ckpt = import_from_hf(export_fp8, tmp_path / "ckpt")
    reader, main, mtp = TorchDistReader(ckpt), HFDir(export_fp8 / "main"), HFDir(export_fp8 / "mtp")
    layers = main.config["num_hidden_layers"]
    expert = reader.read("decoder.layers.1.mlp.experts.experts.linear_fc1.weight", (5, 6))[0]
    assert torch.equal(expert, torch.cat([main.get("model.layers.1.mlp.experts.5.gate_proj.weight"),
                                          main.get("model.layers.1.mlp.experts.5.up_proj.weight")]))
    assert torch.equal(reader.read("decoder.layers.0.self_attention.linear_q_up_proj.weight"),
                       main.get("model.layers.0.self_attn.q_b_proj.weight"))
    assert torch.equal(reader.read("mtp.layers.0.transformer_layer.self_attention.linear_proj.weight"),
                       mtp.get(f"model.layers.{layers}.self_attn.o_proj.weight"))
    assert torch.equal(reader.read("mtp.layers.0.eh_proj.weight"),
                       mtp.get(f"model.layers.{layers}.eh_proj.weight").float())
    same_tree(export_to_hf(ckpt, tmp_path / "again", dtype="fp8"), export_fp8)


def test_inline_for_vllm_and_drop_mtp_keep_the_fp8_format(trained_run, export_fp8, tmp_path):
    inline = export_to_hf(trained_run, tmp_path / "inline", dtype="fp8", serve_for="vllm")
    got = hf_tensors(inline)
    separate = hf_tensors(export_fp8 / "main", export_fp8 / "mtp")
    assert got.keys() == separate.keys()
    assert all(torch.equal(got[k].view(torch.uint8), separate[k].view(torch.uint8)) for k in got)
    assert json.loads((inline / "config.json").read_text())["quantization_config"] == RELEASE_QUANT
    dropped = drop_mtp(inline, tmp_path / "dropped")
    main = hf_tensors(export_fp8 / "main")
    after = hf_tensors(dropped)
    assert after.keys() == main.keys()
    assert all(torch.equal(after[k].view(torch.uint8), main[k].view(torch.uint8)) for k in main)
    cfg = json.loads((dropped / "config.json").read_text())
    assert cfg["quantization_config"] == RELEASE_QUANT and cfg["num_nextn_predict_layers"] == 0


def test_the_trainers_finite_record_is_what_spares_the_scan(trained_run, tmp_path):
    step = resolve_checkpoint(trained_run).path
    assert recorded_finite(step)
    (tmp_path / "train_state.json").write_text(json.dumps({"step": 1, "weights_finite": False}))
    assert not recorded_finite(tmp_path)
    (tmp_path / "train_state.json").write_text("{")
    assert not recorded_finite(tmp_path) and not recorded_finite(tmp_path / "absent")


@pytest.fixture(scope="module")
def aligned_checkpoint(trained_run, tmp_path_factory):
    """The default model with a rotary head dim of 32, so that every FP8 weight's dimensions are multiples of
    128 or fit one block (transformers' CPU dequantisation derives the block from the scale grid); random
    weights, the trained run's tokenizer and train_state.json."""
    import dataclasses
    import shutil

    from megatron_mtp.checkpoint.info import read_train_state, write_checkpoint_info
    from megatron_mtp.checkpoint.torch_dist_writer import TorchDistWriter
    from megatron_mtp.convert.shapes import expected_shape
    from megatron_mtp.models.deepseek_v3.hf_mapping import param_table
    from megatron_mtp.models.tensor_table import extra_state_keys

    step = resolve_checkpoint(trained_run).path
    cfg = read_config(step)
    cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, qk_pos_emb_head_dim=32))
    vocab = TorchDistReader(step).entry(EMBEDDING).shape[0]
    out = tmp_path_factory.mktemp("aligned") / "ckpt"
    out.mkdir()
    g = torch.Generator().manual_seed(7)
    writer = TorchDistWriter(out)
    for p in param_table(cfg.model, cfg.mtp.num_layers, spec="te", mtp_copies=False):
        shape = expected_shape(p.mcore, cfg.model, vocab)
        if p.mcore.endswith(("norm.weight", "layer_norm_weight")):
            tensor = 1 + 0.1 * torch.randn(shape, generator=g)
        elif p.mcore.endswith("expert_bias"):
            tensor = 0.01 * torch.randn(shape, generator=g)
        else:
            tensor = 0.05 * torch.randn(shape, generator=g)
        writer.write_tensor(p.mcore, tensor)
        for key in extra_state_keys(p):
            writer.write_object(key, [None])
    writer.finish({})
    shutil.copytree(step / "tokenizer", out / "tokenizer")
    write_checkpoint_info(out, cfg, read_train_state(step))
    return out


def test_transformers_loads_the_fp8_export_and_its_loss_is_our_eval(aligned_checkpoint, tmp_path):
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")  # transformers' FP8 loader needs it
    import torch.nn.functional as F
    from tokenizers import Tokenizer

    from tests.convert.helpers import run

    out = export_to_hf(aligned_checkpoint, tmp_path / "fp8", mtp="separate", dtype="fp8")
    model, info = transformers.DeepseekV3ForCausalLM.from_pretrained(
        out / "main", dtype=torch.float32, attn_implementation="eager", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    ours = HFDir(out / "main")
    params = dict(model.named_parameters())
    assert all(torch.equal(params[n], ours.get(n).float()) for n in ours.names() if n in params)  # dequantised
    text = "".join(f"def f{i}(x):\n    return x * {i} + {i % 7}\n\n" for i in range(40))
    (tmp_path / "text.py").write_text(text)
    proc = run(["-m", "megatron_mtp.cli", "eval", str(out), "training.seq_length=32", "--text-file",
                str(tmp_path / "text.py"), "--json"], MEGATRON_MTP_CACHE=str(tmp_path / "cache"))
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    ids = Tokenizer.from_file(str(out / "main" / "tokenizer.json")).encode(text).ids
    n = len(ids) // 32
    windows = torch.tensor(ids[: n * 32]).view(n, 32)
    with torch.no_grad():
        logits = model(windows).logits
    loss = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), windows[:, 1:].reshape(-1))
    assert result["tokens"] == n * 31 and len(result["mtp_loss"]) == 1
    imported = __import__("pathlib").Path(result["checkpoint"])  # the cached import names its own tokenizer
    assert imported.parent == tmp_path / "cache" / "hf_imports"
    assert __import__("pathlib").Path(read_config(imported).data.tokenizer) == imported / "tokenizer"
    assert abs(result["lm_loss"] - loss.item()) < 1e-4


def test_generate_drafts_from_an_fp8_export_and_refuses_other_quantisations(export_fp8, tmp_path):
    import shutil

    from megatron_mtp.errors import UserError
    from megatron_mtp.inference.generate import load_generator

    gen = load_generator(str(export_fp8))
    assert gen.has_mtp
    plain = gen.generate("def add(a, b):", max_new_tokens=8, ignore_eos=True)
    drafted = gen.generate("def add(a, b):", max_new_tokens=8, ignore_eos=True, speculative_k=2)
    assert drafted.tokens == plain.tokens and drafted.stats.rounds > 0
    other = tmp_path / "awq"
    shutil.copytree(export_fp8, other)
    cfg = json.loads((other / "main" / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "awq", "bits": 4}
    (other / "main" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(UserError, match="is not DeepSeek's FP8 block format"):
        load_generator(str(other))


def test_cli_to_hf_dtype_fp8_writes_what_the_api_writes(trained_run, tmp_path):
    from tests.convert.helpers import megatron_cli

    proc = megatron_cli("convert", "to-hf", str(trained_run), str(tmp_path / "cli"), "--mtp", "none", "--dtype", "fp8")
    assert "scale grid" in proc.stderr  # the default model has partial blocks (warning above)
    same_tree(tmp_path / "cli", export_to_hf(trained_run, tmp_path / "api", mtp="none", dtype="fp8"))


def test_bf16_to_fp8_to_import_to_fp8_is_bitwise(trained_run, tmp_path):
    bf16 = import_from_hf(export_to_hf(trained_run, tmp_path / "bf16", dtype="bf16"), tmp_path / "ckpt_bf16",
                          dtype="bf16")
    assert TorchDistReader(bf16).entry("decoder.layers.0.self_attention.linear_proj.weight").dtype == torch.bfloat16
    first = export_to_hf(bf16, tmp_path / "fp8", dtype="fp8")
    again = export_to_hf(import_from_hf(first, tmp_path / "ckpt_fp8"), tmp_path / "fp8_again", dtype="fp8")
    same_tree(again, first)
