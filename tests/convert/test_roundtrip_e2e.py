"""End to end on a checkpoint written by the real trainer: export, import, drop-mtp, logits."""

from __future__ import annotations

import json

import pytest
import torch
import yaml

from megatron_mtp.checkpoint.torch_dist_reader import TorchDistReader
from megatron_mtp.convert.drop_mtp import drop_mtp
from megatron_mtp.convert.from_hf import import_from_hf
from megatron_mtp.convert.to_hf import export_to_hf
from tests.convert.conftest import megatron_forward
from tests.convert.helpers import hf_tensors, same_tree
from tests.convert.mtp_reference import mtp_logits

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.mcore


def _hf_model(path):
    model, info = transformers.DeepseekV3ForCausalLM.from_pretrained(
        path, dtype=torch.float32, attn_implementation="eager", output_loading_info=True)
    return model.eval(), info


def test_main_export_loads_in_transformers_with_equal_logits(export_fp32, megatron_logits, tokens):
    model, info = _hf_model(export_fp32 / "main")
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    assert json.loads((export_fp32 / "main" / "config.json").read_text())["num_nextn_predict_layers"] == 0
    assert (export_fp32 / "main" / "tokenizer.json").is_file()
    from tokenizers import Tokenizer

    cfg = json.loads((export_fp32 / "main" / "config.json").read_text())
    tok = Tokenizer.from_file(str(export_fp32 / "main" / "tokenizer.json"))
    eos = json.loads((export_fp32 / "main" / "tokenizer_config.json").read_text())["eos_token"]
    assert cfg["eos_token_id"] == tok.token_to_id(eos) is not None
    with torch.no_grad():
        logits = model(torch.load(tokens)).logits
    reference = megatron_logits["logits"]
    assert logits.shape == reference.shape
    assert (logits - reference).abs().max().item() < 1e-4


def test_mtp_export_reproduces_megatron_mtp_logits(export_fp32, megatron_logits, tokens):
    mtp_cfg = json.loads((export_fp32 / "mtp" / "config.json").read_text())
    L = mtp_cfg["num_hidden_layers"]
    names = json.loads((export_fp32 / "mtp" / "model.safetensors.index.json").read_text())["weight_map"]
    assert mtp_cfg["num_nextn_predict_layers"] == 1 and all(n.startswith(f"model.layers.{L}.") for n in names)
    assert f"model.layers.{L}.embed_tokens.weight" in names and f"model.layers.{L}.shared_head.head.weight" in names
    ours = mtp_logits(export_fp32 / "main", export_fp32 / "mtp", torch.load(tokens))
    reference = megatron_logits["mtp_logits"]
    assert len(ours) == len(reference) == 1
    assert (ours[0] - reference[0]).abs().max().item() < 1e-4
    # the concat order matters: hidden-first would give different logits
    assert not torch.allclose(ours[0], megatron_logits["logits"], atol=1e-2)


def test_inline_equals_main_plus_mtp(trained_run, export_fp32, tmp_path):
    inline = export_to_hf(trained_run, tmp_path / "inline", mtp="inline", dtype="fp32", max_shard_bytes=1 << 20)
    assert len(list(inline.glob("*.safetensors"))) > 3  # several shards, one index
    a, b = hf_tensors(inline), hf_tensors(export_fp32 / "main", export_fp32 / "mtp")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert json.loads((inline / "config.json").read_text())["num_nextn_predict_layers"] == 1
    model, info = _hf_model(inline)  # transformers ignores the MTP layer of the release layout
    assert not info["missing_keys"]
    # the release layout imports too, and exports back to the separate layout unchanged
    ckpt = import_from_hf(inline, tmp_path / "ckpt")
    same_tree(export_to_hf(ckpt, tmp_path / "again", dtype="fp32"), export_fp32)
    main_only = import_from_hf(inline, tmp_path / "main_only", with_mtp=False)
    assert not any(k.startswith("mtp.") for k in TorchDistReader(main_only).keys())
    same_tree(export_to_hf(main_only, tmp_path / "main_hf", mtp="none", dtype="fp32"), export_fp32 / "main")


def test_cli_to_hf_and_drop_mtp(trained_run, export_fp32, tmp_path):
    from tests.convert.helpers import megatron_cli

    megatron_cli("convert", "to-hf", str(trained_run), str(tmp_path / "hf"), "--mtp", "none", "--dtype", "fp32")
    same_tree(tmp_path / "hf", export_fp32 / "main")
    megatron_cli("drop-mtp", str(export_fp32), str(tmp_path / "dropped"))
    same_tree(tmp_path / "dropped", export_fp32 / "main")
    # the written config takes train's dotted overrides; the older --ep is an alias that says so
    proc = megatron_cli("convert", "from-hf", str(export_fp32), str(tmp_path / "ckpt"), "parallel.tensor=2",
                        "--ep", "2", "optimizer.lr=1.5e-4")
    assert "note: --ep 2 is parallel.expert=2" in proc.stderr
    cfg = yaml.safe_load((tmp_path / "ckpt" / "config.yaml").read_text())
    assert (cfg["parallel"]["tensor"], cfg["parallel"]["expert"], cfg["optimizer"]["lr"]) == (2, 2, 1.5e-4)
    refused = megatron_cli("convert", "from-hf", str(export_fp32), str(tmp_path / "bad"), "model.num_layers=2",
                           check=False)
    assert refused.returncode == 2 and "model.num_layers comes from the Hugging Face config.json" in refused.stderr
    assert not (tmp_path / "bad").exists()


def test_nextn_layout_and_import_back(trained_run, export_fp32, tmp_path):
    out = export_to_hf(trained_run, tmp_path / "nextn", mtp="separate", mtp_layout="nextn", dtype="fp32")
    cfg = json.loads((out / "mtp" / "config.json").read_text())
    names = json.loads((out / "mtp" / "model.safetensors.index.json").read_text())["weight_map"]
    assert cfg["architectures"] == ["DeepseekV3ForCausalLMNextN"]
    assert all(n.startswith("model.layers.0.") for n in names)
    assert not any("embed_tokens" in n or "shared_head.head" in n for n in names)
    ckpt = import_from_hf(out / "main", tmp_path / "ckpt", mtp_dir=out / "mtp")
    same_tree(export_to_hf(ckpt, tmp_path / "again", dtype="fp32") / "mtp", export_fp32 / "mtp")


def test_hf_mcore_hf_is_bitwise(trained_run, tmp_path):
    first = export_to_hf(trained_run, tmp_path / "first", dtype="bf16")
    ckpt = import_from_hf(first, tmp_path / "ckpt", dtype="bf16")
    state = json.loads((ckpt / "train_state.json").read_text())
    assert state["has_optimizer"] is False and (ckpt / "tokenizer" / "tokenizer.json").is_file()
    second = export_to_hf(ckpt, tmp_path / "second", dtype="bf16")
    same_tree(first, second)
    # the expert bias stays fp32 even in a bf16 export
    from safetensors import safe_open

    with safe_open(str(next((first / "main").glob("*.safetensors"))), "pt") as h:
        assert h.get_tensor("model.layers.1.mlp.gate.e_score_correction_bias").dtype == torch.float32
        assert h.get_tensor("model.layers.1.mlp.gate.weight").dtype == torch.bfloat16


def test_mcore_hf_mcore_gives_identical_logits(export_fp32, megatron_logits, tokens, tmp_path):
    ckpt = import_from_hf(export_fp32, tmp_path / "ckpt")
    again = megatron_forward(ckpt, tokens, tmp_path / "out.pt")
    assert torch.equal(again["logits"], megatron_logits["logits"])
    assert torch.equal(again["mtp_logits"][0], megatron_logits["mtp_logits"][0])


def test_drop_mtp_megatron_checkpoint(trained_run, export_fp32, megatron_logits, tokens, tmp_path):
    dropped = drop_mtp(trained_run, tmp_path / "dropped")
    reader = TorchDistReader(dropped)
    assert not any(k.startswith("mtp.") for k in reader.keys())
    assert not any(k.startswith("optimizer.") for k in reader.keys())
    assert "num_layers: 0" in (dropped / "config.yaml").read_text().split("mtp:")[1].split("\n")[1]
    main = export_to_hf(dropped, tmp_path / "hf", mtp="none", dtype="fp32")
    same_tree(main, export_fp32 / "main")
    out = megatron_forward(dropped, tokens, tmp_path / "out.pt")  # loads and runs without MTP
    assert out["mtp_logits"] == [] and torch.equal(out["logits"], megatron_logits["logits"])


def test_drop_mtp_hf_inline_and_separate(trained_run, export_fp32, tmp_path):
    inline = export_to_hf(trained_run, tmp_path / "inline", mtp="inline", dtype="fp32")
    dropped = drop_mtp(inline, tmp_path / "dropped")
    cfg = json.loads((dropped / "config.json").read_text())
    index = json.loads((dropped / "model.safetensors.index.json").read_text())["weight_map"]
    assert cfg["num_nextn_predict_layers"] == 0
    assert not any(n.startswith(f"model.layers.{cfg['num_hidden_layers']}.") for n in index)
    model, info = _hf_model(dropped)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    assert (dropped / "tokenizer.json").is_file()
    assert (inline / "SERVING.md").is_file() and not (dropped / "SERVING.md").exists()  # its MTP commands are gone
    same_tree(drop_mtp(export_fp32, tmp_path / "from_separate"), export_fp32 / "main")


def test_eval_loss_equals_loss_from_transformers_logits(trained_run, export_fp32, tmp_path):
    import torch.nn.functional as F
    from tokenizers import Tokenizer

    from tests.convert.helpers import megatron_cli

    text = "".join(f"def f{i}(x):\n    return x * {i} + {i % 7}\n\n" for i in range(40))
    text_file = tmp_path / "text.py"
    text_file.write_text(text)
    proc = megatron_cli("eval", str(trained_run), "--text-file", str(text_file), "--json")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    seq = int(__import__("yaml").safe_load((next((trained_run / "checkpoints").glob("step_*")) / "config.yaml")
                                            .read_text())["training"]["seq_length"])
    ids = Tokenizer.from_file(str(export_fp32 / "main" / "tokenizer.json")).encode(text).ids
    n = len(ids) // seq
    windows = torch.tensor(ids[: n * seq]).view(n, seq)
    model, _ = _hf_model(export_fp32 / "main")
    with torch.no_grad():
        logits = model(windows).logits
    loss = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), windows[:, 1:].reshape(-1))
    assert result["tokens"] == n * (seq - 1)
    assert result["data"].startswith(f"--text-file {text_file}: {n} windows of training.seq_length={seq} tokens, "
                                     f"{seq - 1} predictions each")
    assert abs(result["lm_loss"] - loss.item()) < 1e-4


def test_eval_compare_scores_a_run_and_its_export_on_the_same_tokens(trained_run, export_fp32):
    """An HF export is evaluated without --text-file, and either side of --compare may be one: both
    sides get one token stream at one batch shape (the first side's data, or for an export the default
    corpus's held-out text in its own tokenizer), so the same weights give the same losses."""
    from tests.convert.helpers import megatron_cli

    for first, second in ((trained_run, export_fp32), (export_fp32, trained_run)):
        proc = megatron_cli("eval", str(first), "--compare", str(second), "--steps", "1", "--json")
        run_side, export_side = json.loads(proc.stdout.strip().splitlines()[-1])["checkpoints"][::(
            1 if first == trained_run else -1)]
        assert run_side["tokens"] == export_side["tokens"] > 0, (first, run_side, export_side)
        assert run_side["data"] == export_side["data"]  # one description of the one token stream
        assert abs(run_side["lm_loss"] - export_side["lm_loss"]) < 1e-5
        assert all(abs(a - b) < 1e-5 for a, b in zip(run_side["mtp_loss"], export_side["mtp_loss"], strict=True))


def test_eval_compare_of_two_tokenizers_on_one_text_is_one_sentence(trained_run, export_fp32, tmp_path):
    import shutil

    from tests.convert.helpers import run

    other = tmp_path / "other"
    shutil.copytree(export_fp32, other)
    tokenizer = json.loads((other / "main" / "tokenizer.json").read_text())
    vocab = tokenizer["model"]["vocab"]
    a, b = sorted(vocab, key=vocab.get)[300:302]
    vocab[a], vocab[b] = vocab[b], vocab[a]  # the same size, other ids
    (other / "main" / "tokenizer.json").write_text(json.dumps(tokenizer))
    proc = run(["-m", "megatron_mtp", "eval", str(other), "--compare", str(trained_run), "--steps", "1"],
               timeout=600, check=False)
    assert proc.returncode == 2 and "have different ones, so the two sides would see different tokens" \
        in proc.stderr, proc.stderr[-2000:]


def test_v2_style_softmax_model_without_expert_bias(export_fp32, tmp_path):
    from safetensors.torch import load_file, save_file

    src, v2 = export_fp32 / "main", tmp_path / "v2"
    v2.mkdir()
    tensors = {}
    for f in src.glob("*.safetensors"):
        tensors.update({k: v for k, v in load_file(str(f)).items() if "e_score_correction_bias" not in k})
    save_file(tensors, str(v2 / "model.safetensors"))
    cfg = json.loads((src / "config.json").read_text())
    cfg.update(architectures=["DeepseekV2ForCausalLM"], model_type="deepseek_v2", scoring_func="softmax",
               topk_method="greedy", n_group=1, topk_group=1)
    (v2 / "config.json").write_text(json.dumps(cfg))
    ckpt = import_from_hf(v2, tmp_path / "ckpt")
    assert "router_score_function: softmax" in (ckpt / "config.yaml").read_text()
    assert not any(k.endswith("expert_bias") for k in TorchDistReader(ckpt).keys())
    back = export_to_hf(ckpt, tmp_path / "back", mtp="none", dtype="fp32")
    out_cfg = json.loads((back / "config.json").read_text())
    assert (out_cfg["scoring_func"], out_cfg["topk_method"]) == ("softmax", "greedy")
    got = load_file(str(next(back.glob("*.safetensors"))))
    assert got.keys() == tensors.keys() and all(torch.equal(got[k], tensors[k]) for k in got)
