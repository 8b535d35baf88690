"""A model trained (or imported) without MTP gets new MTP modules through checkpoint.load: drawn at
random, or their transformer layer copied from the last decoder layer; the main weights load as saved."""

from __future__ import annotations

import pytest
import torch

from megatron_mtp.checkpoint.torch_dist_reader import TorchDistReader

pytestmark = pytest.mark.dist

FROZEN = ("optimizer.lr=0", "optimizer.min_lr=0")  # one step that changes no weight: the loaded ones are saved


def _latest(run):
    return run / "checkpoints" / (run / "checkpoints" / "latest").read_text().strip()


def test_new_mtp_modules_on_a_model_without_mtp(tmp_path, train):
    base = tmp_path / "base"
    train(base, steps=1, overrides=("mtp.num_layers=0", *FROZEN, "checkpoint.save_interval=1"))
    runs = {}
    for init in ("random", "copy_last_layer"):
        runs[init] = tmp_path / init
        proc = train(runs[init], steps=1, overrides=(
            "mtp.num_layers=1", f"mtp.init={init}", f"checkpoint.load={base}", "checkpoint.load_optimizer=false",
            *FROZEN, "checkpoint.save_interval=1"))
        assert "train/mtp_loss_1" in proc.stdout or "mtp1_loss" in proc.stdout
    with TorchDistReader(_latest(base)) as src, TorchDistReader(_latest(runs["random"])) as rnd, \
            TorchDistReader(_latest(runs["copy_last_layer"])) as cpy:
        # the expert bias moves by its own update rule, not the learning rate
        main_keys = [k for k in src.keys() if not k.startswith("optimizer") and not k.endswith("expert_bias")]
        changed = [k for k in main_keys if not (torch.equal(src.read(k), rnd.read(k))
                                                and torch.equal(src.read(k), cpy.read(k)))]
        assert main_keys and not changed, changed
        last = max(int(k.split(".")[2]) for k in main_keys if k.startswith("decoder.layers."))
        layer = [k for k in cpy.keys() if k.startswith("mtp.layers.0.transformer_layer.")
                 and not k.endswith("expert_bias")]
        assert any("experts" in k for k in layer)  # the MoE layer, routed experts included
        for key in layer:
            twin = key.replace("mtp.layers.0.transformer_layer.", f"decoder.layers.{last}.")
            assert torch.equal(cpy.read(key), src.read(twin)), key
            if "layernorm" not in key and "norm_weight" not in key:
                assert not torch.equal(rnd.read(key), src.read(twin)), key  # random: its own weights
        assert torch.equal(cpy.read("mtp.layers.0.eh_proj.weight"), rnd.read("mtp.layers.0.eh_proj.weight"))
