"""Every bad input gives one clear error and leaves no output; FP8 release weights import exactly."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
import yaml
from safetensors.torch import load_file, save_file

from megatron_mtp.checkpoint.torch_dist_reader import TorchDistReader
from megatron_mtp.convert.drop_mtp import drop_mtp
from megatron_mtp.convert.from_hf import import_from_hf
from megatron_mtp.convert.to_hf import export_to_hf
from megatron_mtp.errors import UserError
from megatron_mtp.hf_dir.fp8 import dequantize_blockwise
from tests.convert.helpers import reference_fp8_quantize, run


def _no_output(parent, name) -> None:
    assert not (parent / name).exists()
    assert not [p for p in parent.iterdir() if p.name.startswith(f".{name}.tmp")]


def _step_copy(trained_run, tmp_path):
    step = next((trained_run / "checkpoints").glob("step_*"))
    copy = tmp_path / "step"
    shutil.copytree(step, copy)
    return copy


def test_to_hf_bad_inputs(trained_run, tmp_path):
    with pytest.raises(UserError, match="does not exist"):
        export_to_hf(tmp_path / "nowhere", tmp_path / "out")
    with pytest.raises(UserError, match="holds no checkpoint"):
        export_to_hf(tmp_path, tmp_path / "out")
    (tmp_path / "taken").mkdir()
    with pytest.raises(UserError, match="already exists"):
        export_to_hf(trained_run, tmp_path / "taken")
    with pytest.raises(UserError, match="--mtp-layout nextn"):
        export_to_hf(trained_run, tmp_path / "out", mtp="inline", mtp_layout="nextn")

    step = _step_copy(trained_run, tmp_path)
    cfg = yaml.safe_load((step / "config.yaml").read_text())
    cfg["model"]["num_layers"] -= 1
    (step / "config.yaml").write_text(yaml.safe_dump(cfg))
    with pytest.raises(UserError, match="config/weights mismatch"):
        export_to_hf(step, tmp_path / "out")
    cfg["model"]["num_layers"] += 2
    (step / "config.yaml").write_text(yaml.safe_dump(cfg))
    with pytest.raises(UserError, match="describes a different model"):
        export_to_hf(step, tmp_path / "out")
    cfg["model"]["num_layers"] -= 1
    cfg["model"]["ffn_hidden_size"] += 8
    (step / "config.yaml").write_text(yaml.safe_dump(cfg))
    with pytest.raises(UserError, match="linear_fc1.weight' in checkpoint .*config/weights mismatch"):
        export_to_hf(step, tmp_path / "out")
    _no_output(tmp_path, "out")


def test_truncated_or_missing_shard_leaves_no_output(trained_run, tmp_path):
    step = _step_copy(trained_run, tmp_path)
    data = max(step.glob("*.distcp"), key=lambda p: p.stat().st_size)
    with open(data, "r+b") as fh:
        fh.truncate(fh.seek(0, 2) - 100)
    with pytest.raises(UserError, match="truncated|ends inside"):
        export_to_hf(step, tmp_path / "out")
    _no_output(tmp_path, "out")
    data.unlink()
    with pytest.raises(UserError, match="missing"):
        export_to_hf(step, tmp_path / "out")
    _no_output(tmp_path, "out")


def test_mtp_requested_from_checkpoint_without_it(trained_run, tmp_path):
    dropped = drop_mtp(trained_run, tmp_path / "dropped")
    with pytest.raises(UserError, match="no MTP layers; export it with --mtp none"):
        export_to_hf(dropped, tmp_path / "out", mtp="separate")
    with pytest.raises(UserError, match="nothing to drop"):
        drop_mtp(dropped, tmp_path / "again")
    _no_output(tmp_path, "out")


def test_from_hf_bad_inputs(export_fp32, tmp_path):
    hf = tmp_path / "hf"
    shutil.copytree(export_fp32, hf)
    main = hf / "main"
    cfg = json.loads((main / "config.json").read_text())
    (main / "config.json").write_text(json.dumps(dict(cfg, num_hidden_layers=cfg["num_hidden_layers"] + 1)))
    with pytest.raises(UserError, match="is missing from"):
        import_from_hf(hf, tmp_path / "out")
    (main / "config.json").write_text(json.dumps(dict(cfg, moe_intermediate_size=cfg["moe_intermediate_size"] * 2)))
    with pytest.raises(UserError, match="config/weights mismatch"):
        import_from_hf(hf, tmp_path / "out")
    (main / "config.json").write_text(json.dumps(dict(cfg, unknown_knob=1)))
    with pytest.raises(UserError, match="unknown_knob"):
        import_from_hf(hf, tmp_path / "out")
    (main / "config.json").write_text(json.dumps(cfg))
    shard = next(main.glob("*.safetensors"))
    with open(shard, "r+b") as fh:
        fh.truncate(fh.seek(0, 2) // 2)
    with pytest.raises(UserError, match="truncated"):
        import_from_hf(hf, tmp_path / "out")
    with pytest.raises(UserError, match="no config.json"):
        import_from_hf(tmp_path, tmp_path / "out")
    _no_output(tmp_path, "out")


def test_cli_prints_one_line_error(tmp_path):
    proc = run(["-m", "megatron_mtp.cli", "convert", "to-hf", str(tmp_path / "none"), str(tmp_path / "out")],
               timeout=120, check=False)
    assert proc.returncode == 2
    assert proc.stderr.strip().startswith("megatron-mtp convert: error:") and "Traceback" not in proc.stderr


@pytest.mark.skipif(not hasattr(torch, "float8_e4m3fn"), reason="torch without float8")
def test_fp8_release_format_imports_dequantised(export_fp32, tmp_path):
    src = export_fp32 / "main"
    fp8 = tmp_path / "fp8"
    fp8.mkdir()
    tensors, expected = {}, {}
    for file in sorted(src.glob("*.safetensors")):
        for name, t in load_file(str(file)).items():
            if name.endswith("proj.weight") and t.dim() == 2 and "eh_proj" not in name:
                q, s = reference_fp8_quantize(t)
                tensors[name], tensors[name + "_scale_inv"] = q, s
                expected[name] = dequantize_blockwise(q, s)
            else:
                tensors[name] = t.to(torch.bfloat16) if "e_score_correction_bias" not in name else t
    save_file(tensors, str(fp8 / "model.safetensors"))
    cfg = json.loads((src / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                  "weight_block_size": [128, 128]}
    (fp8 / "config.json").write_text(json.dumps(cfg))
    ckpt = import_from_hf(fp8, tmp_path / "ckpt")
    reader = TorchDistReader(ckpt)
    got = reader.read("decoder.layers.1.mlp.experts.experts.linear_fc1.weight", (3, 4))[0]
    ref = torch.cat([expected["model.layers.1.mlp.experts.3.gate_proj.weight"],
                     expected["model.layers.1.mlp.experts.3.up_proj.weight"]])
    assert torch.equal(got, ref)
    assert torch.equal(reader.read("decoder.layers.0.self_attention.linear_q_up_proj.weight"),
                       expected["model.layers.0.self_attn.q_b_proj.weight"])
    assert not any(k.endswith("_scale_inv") for k in reader.keys())
    # a damaged scale (0 or below) is one sentence for the importer and the decoder, not silent zeros
    name = "model.layers.0.self_attn.q_b_proj.weight_scale_inv"
    tensors[name] = tensors[name].clone()
    tensors[name][0, 0] = 0.0
    save_file(tensors, str(fp8 / "model.safetensors"))
    with pytest.raises(UserError, match=r"'model.layers.0.self_attn.q_b_proj.weight_scale_inv' holds 0.0 for block "
                                        r"\(0, 0\) and FP8 block scales must be finite and above 0"):
        import_from_hf(fp8, tmp_path / "ckpt2")
    assert not (tmp_path / "ckpt2").exists()
    from megatron_mtp.inference.generate import load_generator

    with pytest.raises(UserError, match="must be finite and above 0"):
        load_generator(fp8)


@pytest.mark.parametrize("layout", ["separate", "inline"])
def test_drop_mtp_refuses_non_finite_weights_like_every_export(trained_run, export_fp32, tmp_path, layout):
    src = tmp_path / "src"
    if layout == "separate":  # main/ is copied as it is: its bytes are checked all the same
        shutil.copytree(export_fp32, src)
        main = src / "main"
    else:
        main = export_to_hf(trained_run, src, mtp="inline", dtype="fp32")
    shard = sorted(main.glob("*.safetensors"))[0]
    tensors = load_file(shard)
    name = sorted(tensors)[0]
    tensors[name] = torch.full_like(tensors[name], float("nan"))
    save_file(tensors, shard, metadata={"format": "pt"})
    with pytest.raises(UserError, match=f"non-finite values \\(NaN or Inf\\) in '{name}'"):
        drop_mtp(src, tmp_path / "dropped")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]  # nothing written, no temporary left
