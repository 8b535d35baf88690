"""`to-hf --mtp only`: the MTP directory of the separate layout alone (a new draft to ship beside an
unchanged base release), and `from-hf BASE --mtp-dir` pairing them again, its draft winning over one
the base holds inline."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from megatron_mtp.checkpoint.torch_dist_reader import TorchDistReader
from megatron_mtp.convert.from_hf import import_from_hf
from megatron_mtp.convert.to_hf import export_to_hf
from megatron_mtp.errors import UserError
from tests.convert.helpers import hf_tensors, megatron_cli, run, same_tree


def test_mtp_only_is_the_separate_layouts_mtp_directory(trained_run, export_fp32, tmp_path):
    megatron_cli("convert", "to-hf", str(trained_run), str(tmp_path / "draft"), "--mtp", "only", "--dtype", "fp32")
    same_tree(tmp_path / "draft", export_fp32 / "mtp")  # tensors, index and config.json, nothing else
    assert json.loads((tmp_path / "draft" / "config.json").read_text())["num_nextn_predict_layers"] == 1
    assert not (tmp_path / "draft" / "tokenizer.json").exists()


def test_mtp_dir_pairs_a_new_draft_with_a_release_that_has_its_own(trained_run, export_fp32, tmp_path, capfd):
    release = export_to_hf(trained_run, tmp_path / "release", mtp="inline", dtype="fp32")
    draft = export_to_hf(trained_run, tmp_path / "draft", mtp="only", dtype="fp32")
    changed = None
    for f in draft.glob("*.safetensors"):  # a retrained draft: one of its tensors differs from the release's
        tensors = load_file(str(f))
        name = next(n for n in tensors if n.endswith("eh_proj.weight"))
        tensors[name] = tensors[name] * 2
        save_file(tensors, str(f), metadata={"format": "pt"})
        changed = name
    assert changed is not None
    capfd.readouterr()
    ckpt = import_from_hf(release, tmp_path / "ckpt", mtp_dir=draft)
    said = [line for line in capfd.readouterr().err.splitlines() if line.startswith("note:")]
    assert said == [f"note: '{release}' holds MTP weights inline (model.layers.4); the MTP directory '{draft}' "
                    "replaces them"], said
    with TorchDistReader(ckpt) as got, TorchDistReader(trained_run / "checkpoints" /
                                                       (trained_run / "checkpoints" / "latest").read_text().strip()
                                                       ) as src:
        eh = "mtp.layers.0.eh_proj.weight"
        assert torch.equal(got.read(eh), 2 * src.read(eh))  # the draft's, not the release's inline one
        main = [k for k in src.keys() if k.startswith(("decoder.", "embedding.", "output_layer."))]
        assert main and all(torch.equal(got.read(k), src.read(k)) for k in main)
    back = hf_tensors(export_to_hf(ckpt, tmp_path / "again", mtp="only", dtype="fp32"))
    assert torch.equal(back[changed], 2 * hf_tensors(export_fp32 / "mtp")[changed])


def test_mtp_only_refusals_are_one_sentence(trained_run, tmp_path):
    proc = run(["-m", "megatron_mtp", "convert", "to-hf", str(trained_run), str(tmp_path / "o"), "--mtp", "only",
                "--for", "vllm"], timeout=300, check=False)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "--mtp only" in proc.stderr and not (tmp_path / "o").exists()


def test_mtp_dir_of_another_model_is_one_sentence(trained_run, tmp_path):
    release = export_to_hf(trained_run, tmp_path / "release", mtp="none", dtype="fp32")
    draft = export_to_hf(trained_run, tmp_path / "draft", mtp="only", dtype="fp32")
    config = json.loads((draft / "config.json").read_text())
    config["hidden_size"] *= 2  # the draft of a wider model
    (draft / "config.json").write_text(json.dumps(config))
    with pytest.raises(UserError, match="has hidden_size .* pass the MTP directory of this model") as info:
        import_from_hf(release, tmp_path / "ckpt", mtp_dir=draft)
    assert "\n" not in str(info.value) and not (tmp_path / "ckpt").exists()
