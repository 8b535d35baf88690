"""DeepSeek Sparse Attention's training stages (model.dsa_stage, models/dsa/stages.py) as configs: what each gives
megatron-core (a dense warm-up's top-k, the sparse stage's loss over the selected tokens), the one-sentence refusals,
which checkpoints a run may start from or resume (a DeepSeek-V3 checkpoint grows a DeepSeek-V3.2 model of its shape;
the stage may change on a load, not on a resume) and under which keys a DSA model reads a dense MLA checkpoint.
The run of the recipe itself: tests/convert/test_deepseek_v32_convert.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from megatron_mtp.checkpoint.resume_rules import refuse_load_changes, refuse_meaning_changes
from megatron_mtp.config import load_config
from megatron_mtp.config.validate import validate
from megatron_mtp.errors import UserError
from megatron_mtp.models.dsa.stages import dense_checkpoint_key, is_indexer, stage_transformer_kwargs
from megatron_mtp.platform.megatron_core import is_019

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
V3 = str(CONFIGS / "tiny_cpu.yaml")
V32 = ["model.family=deepseek_v32", "model.index_n_heads=4", "model.index_head_dim=32", "model.index_topk=16",
       "model.indexer_loss_coeff=0.01"]
SRC = Path("/runs/v3/checkpoints/step_0000002")


def test_each_stage_gives_megatron_core_its_top_k_and_loss():
    warmup = load_config(V3, [*V32, "model.dsa_stage=warmup", "training.seq_length=64"])
    # dense: megatron-core selects min(top-k, keys) tokens, so a top-k of the sequence length selects every one
    assert stage_transformer_kwargs(warmup) == dict(dsa_indexer_topk=64, dsa_indexer_use_sparse_loss=False)
    assert warmup.model.index_topk == 16  # the model's own (its checkpoint and export) stays
    sparse = load_config(V3, [*V32, "model.dsa_stage=sparse"])
    assert stage_transformer_kwargs(sparse) == dict(dsa_indexer_use_sparse_loss=True)
    assert stage_transformer_kwargs(load_config(V3, V32)) == {}  # megatron-core's defaults


@pytest.mark.skipif(not is_019(), reason="the DSA families need megatron-core 0.19's DSA modules")
@pytest.mark.parametrize("overrides, message", [
    (["model.dsa_stage=warmup", "model.indexer_loss_coeff=0"],
     r"model.dsa_stage=warmup trains the indexers with their KL loss, but model.indexer_loss_coeff is 0; set it"),
    (["model.dsa_stage=sparse", "model.indexer_loss_coeff=0"], r"model.dsa_stage=sparse trains the indexers"),
    (["model.dsa_stage=warmup", "mtp.freeze_base=true"],
     r"model.dsa_stage=warmup trains the indexers alone, and mtp.freeze_base the MTP part alone; drop"),
])
def test_a_stage_the_run_cannot_take_is_one_sentence(overrides, message):
    with pytest.raises(UserError, match=message) as err:
        validate(load_config(V3, [*V32, *overrides]), world_size=1)
    assert str(err.value).count(". ") == 0


def test_an_unknown_stage_is_refused():
    with pytest.raises(UserError, match=r"model.dsa_stage is 'dense'; it must be one of 'warmup', 'sparse'"):
        load_config(V3, [*V32, "model.dsa_stage=dense"])


def test_a_deepseek_v3_checkpoint_starts_a_deepseek_v32_run_of_its_shape_without_its_optimizer():
    v3, v32 = load_config(V3), load_config(V3, [*V32, "model.dsa_stage=warmup"])
    notes = refuse_load_changes(v3, v32, SRC, load_optimizer=False)
    assert notes and "is a deepseek_v3 model; this deepseek_v32 model takes every tensor of it" in notes[0]
    with pytest.raises(UserError, match=r"adds tensors its optimizer state has none for; set "
                                        r"checkpoint.load_optimizer=false"):
        refuse_load_changes(v3, v32, SRC, load_optimizer=True)
    other = load_config(V3, [*V32, "model.num_layers=3"])  # the shape both families have must be the checkpoint's
    with pytest.raises(UserError, match=r"model.num_layers is 4 in the checkpoint and 3 now"):
        refuse_load_changes(v3, other, SRC, load_optimizer=False)
    rope = load_config(V3, [*V32, "model.qk_pos_emb_head_dim=8"])  # MLA's own fields too
    with pytest.raises(UserError, match=r"model.qk_pos_emb_head_dim is 16 in the checkpoint and 8 now"):
        refuse_load_changes(v3, rope, SRC, load_optimizer=False)
    for saved, now in ((v32, v3), (v3, load_config(V3, ["model.family=glm_moe_dsa"]))):  # no other direction
        with pytest.raises(UserError, match=r"model.family is '\w+' in the checkpoint and '\w+' now"):
            refuse_load_changes(saved, now, SRC, load_optimizer=False)


def test_the_stage_changes_on_a_load_and_not_on_a_resume(tmp_path):
    warmup = load_config(V3, [*V32, "model.dsa_stage=warmup"])
    sparse = load_config(V3, [*V32, "model.dsa_stage=sparse", "model.indexer_loss_coeff=0.001"])
    assert refuse_load_changes(warmup, sparse, SRC, load_optimizer=False) == []
    with pytest.raises(UserError, match=r"model.dsa_stage is warmup in the checkpoint and sparse now, which trains "
                                        r"other parameters than its optimizer state holds"):
        refuse_meaning_changes(warmup, sparse, tmp_path / "step_0000004", tmp_path)
    coeff = load_config(V3, [*V32, "model.dsa_stage=warmup", "model.indexer_loss_coeff=0.001"])
    refuse_meaning_changes(warmup, coeff, tmp_path / "step_0000004", tmp_path)  # a loss weight may change
    with pytest.raises(UserError, match=r"model.family is 'deepseek_v3' in the checkpoint and 'deepseek_v32' now"):
        refuse_meaning_changes(load_config(V3), warmup, tmp_path / "step_0000004", tmp_path)  # a resume never grows


def test_a_dsa_model_reads_mla_latent_norms_under_the_dense_checkpoints_keys():
    layer = "decoder.layers.2.self_attention."
    assert dense_checkpoint_key(layer + "q_layernorm.weight") == layer + "linear_q_up_proj.layer_norm_weight"
    assert (dense_checkpoint_key("mtp.layers.0.transformer_layer.self_attention.kv_layernorm.weight")
            == "mtp.layers.0.transformer_layer.self_attention.linear_kv_up_proj.layer_norm_weight")
    assert dense_checkpoint_key(layer + "linear_q_down_proj.weight") == layer + "linear_q_down_proj.weight"
    assert is_indexer(layer + "core_attention.indexer.linear_wq_b.weight")
    assert not is_indexer(layer + "linear_proj.weight")


def test_the_warmup_trains_the_indexers_alone_in_the_plan_too():
    """``plan`` counts gradients and optimizer state for what the model trains (the model's freeze reads the same
    ``ModelConfig.trains``)."""
    from megatron_mtp.plan.params import Param, trains

    indexer = Param("mtp.layers.0.transformer_layer.self_attention.core_attention.indexer.linear_wk.weight", 1)
    names = [indexer, Param("decoder.layers.0.self_attention.linear_proj.weight", 1), Param("output_layer.weight", 1)]
    for stage, trained in (("warmup", [True, False, False]), ("sparse", [True, True, True])):
        cfg = load_config(V3, [*V32, f"model.dsa_stage={stage}"])
        assert [trains(cfg, p) for p in names] == trained


@pytest.mark.skipif(not is_019(), reason="the DSA families need megatron-core 0.19's DSA modules")
def test_the_warmups_memory_plan_holds_gradients_and_optimizer_state_for_the_indexers_alone():
    from megatron_mtp.plan.memory import make_plan
    from megatron_mtp.platform.gpus import parse_gpu

    state = {stage: make_plan(load_config(V3, [*V32, f"model.dsa_stage={stage}"]), 1, parse_gpu("h100")).worst.state
             for stage in ("sparse", "warmup")}
    m = load_config(V3, V32).model  # an indexer: wq_b, wk, k_norm (weight and bias), weights_proj; 4 layers and MTP's
    heads, width = m.index_n_heads, m.index_head_dim
    indexers = 5 * (heads * width * m.q_lora_rank + width * m.hidden_size + 2 * width + heads * m.hidden_size)
    # every parameter is still held (the frozen ones outside DDP's 64-element-padded buffers)
    assert state["warmup"].params == pytest.approx(state["sparse"].params, rel=1e-3)
    assert state["warmup"].grads < 4 * indexers * 1.1 < state["sparse"].grads  # (DDP's padding: 64-element blocks)
    assert 0 < state["warmup"].optimizer < state["sparse"].optimizer / 10
