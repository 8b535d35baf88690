"""`megatron-mtp plan` for DeepSeek Sparse Attention (the DSA families), by hand on configs/glm_moe_dsa_tiny_cpu.yaml:
fp32 (4 bytes), micro-batches of 8 × 128 tokens, h 128, q_lora 64, kv_lora 32, rope 16, a 4 × 32 indexer learning
from its KL loss; layers 0 and 2 run their indexer, layer 1 reuses layer 0's top-k, the MTP layer runs its own.
What megatron-core 0.19's DSAttention hands to collectives (plan/dsa_comm.py) and what the decoder caches
(models/dsa/decoder.py ``cache_dims``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from megatron_mtp.config import load_config
from megatron_mtp.models.family import get_family
from megatron_mtp.plan import activations as act
from megatron_mtp.plan import comm, dsa_comm
from megatron_mtp.plan.memory import make_plan
from megatron_mtp.plan.speculative import ServeLayout, draft_step_bytes, main_forward_bytes
from megatron_mtp.platform import megatron_core
from megatron_mtp.platform.gpus import parse_gpu

ROOT = Path(__file__).resolve().parents[2]
GLM5 = str(ROOT / "configs" / "glm_moe_dsa_tiny_cpu.yaml")
VOCAB = ["model.vocab_size=4096"]
PLANS = pytest.mark.skipif(not megatron_core.is_019(), reason="plan builds DSA on megatron-core 0.19 alone")


def _step(overrides: list[str], nproc: int):
    cfg = load_config(GLM5, VOCAB + overrides)
    plan = make_plan(cfg, nproc, parse_gpu("h100"), cpu=True)
    return plan, comm.step_bytes(cfg, plan, 0)


@PLANS
def test_dsa_context_parallelism_all_gathers_the_keys_and_the_indexer_keys_instead_of_a_ring():
    """CP2: a rank's 8 × 64 tokens. Each layer all-gathers its absorbed key (latent 32 + rotary 16) over CP, 2 × 512
    rows, and reduce-scatters its gradient; a layer with its own indexer (0, 2, MTP) gathers the indexer's key (32)
    too, backward as well since the indexer learns; layer 1 gathers none. No ring of up-projected keys and values."""
    plan, out = _step(["parallel.context=2"], 2)
    gathered = 2 * 8 * 64 * 4  # bytes per element of width: both CP ranks' rows, fp32
    key, index_key = 2 * gathered * (32 + 16), 2 * gathered * 32
    assert plan.num_micro == 2
    assert out["cp"] == plan.num_micro * (3 * (key + index_key) + key) == 4718592
    # the indexer's key is counted: without its indexer's CP gathers the step is 3 × 2 × 262,144 smaller
    assert out["cp"] - plan.num_micro * 4 * key == 3 * 2 * index_key
    # frozen layers (forward only) gather once and compute no indexer loss
    own = act.layer_dims(plan.cfg, act.dims_of(plan.cfg, 4096), 0)
    assert dsa_comm.cp_bytes(own, True) == gathered * (48 + 32)


@PLANS
def test_dsa_indexer_gathers_its_inputs_over_tp_and_all_reduces_its_kl_target():
    """TP2 (sequence parallel): a layer with its own indexer gathers the hidden states (128) and the query latent (64)
    of all 1,024 tokens, forward only, and all-reduces the KL target [8, 128, 128] fp32 in the loss's forward and
    backward; a layer without one does neither. Running the indexer in layer 1 too (index_topk_freq 1) adds one
    layer's gathers and all-reduces per micro-batch and its indexer's 12,864 weight gradients (fp32) to the TP
    all-reduce; a zero indexer_loss_coeff takes the three layers' KL all-reduces away."""
    t = 8 * 128
    gathers, kl = t * (128 + 64) * 4, 2 * 8 * 128 * 128 * 4
    cfg = load_config(GLM5, VOCAB + ["parallel.tensor=2"])
    d = act.dims_of(cfg, 4096)
    assert [dsa_comm.indexer_tp_bytes(act.layer_dims(cfg, d, i), False) for i in (0, 1, 2, None)] == \
        [gathers + kl, 0, gathers + kl, gathers + kl]
    plan, shared = _step(["parallel.tensor=2"], 2)
    _, every = _step(["parallel.tensor=2", "model.index_topk_freq=1"], 2)
    indexer_params = 64 * 4 * 32 + 128 * 32 + 2 * 32 + 128 * 4  # wq_b, wk, k_norm (weight, bias), weights_proj
    assert indexer_params == 12864
    assert every["tp"] - shared["tp"] == plan.num_micro * (gathers + kl) + indexer_params * 4
    _, silent = _step(["parallel.tensor=2", "model.indexer_loss_coeff=0"], 2)
    assert shared["tp"] - silent["tp"] == plan.num_micro * 3 * kl
    # absorbed MLA gathers the kv latent itself (forward, its reduce-scatter backward): no column-parallel
    # up-projection re-gathering it for a weight gradient. The local spec's attention, elements:
    h, q, kv, r = 128, 64, 32, 16
    gather = 2 * t * h + 2 * t * q + 2 * t * q + 2 * t * h + t * (kv + r) + t * kv + t * kv + t * h
    scatter = t * h + t * q + t * h + t * kv + t * h
    assert comm._attention_tp(cfg, d, False, 0) == (gather, scatter)


def test_dsa_kv_cache_holds_the_indexer_keys_of_the_layers_that_run_one():
    """Per token: MLA's latent and rotary key (48) in each of the 3 layers, the indexer's key (32) in layers 0 and 2:
    208 elements, what the decoder's layers cache; the drafting MTP layer runs its own indexer: 80."""
    cfg = load_config(GLM5, VOCAB)
    family = get_family(cfg.model.family)
    assert 3 * 48 + 2 * 32 == 208 and family.kv_cache_elements_per_token(cfg) * 3 == pytest.approx(208, rel=1e-12)
    serve = ServeLayout(context=100, kv_bytes=2.0)
    assert main_forward_bytes(cfg, 4096, 2, 2, serve).kv == pytest.approx(2 * 100 * 208 * 2, rel=1e-12)
    assert draft_step_bytes(cfg, 4096, 2, serve).kv == 2 * 100 * 80 * 2
    every = load_config(GLM5, VOCAB + ["model.index_topk_freq=1"])  # DeepSeek-V3.2's way: an indexer in each layer
    assert main_forward_bytes(every, 4096, 2, 2, serve).kv == 2 * 100 * 3 * 80 * 2
    # what the decoder caches (models/dsa/decoder.py cache_dims), layer by layer, the MTP layer's last
    config = family.to_hf_config(cfg.model, cfg.mtp, vocab_size=4096, num_nextn_predict_layers=1)
    layer = family.decoder_layer()
    dims = [sum(layer(config, i).self_attn.cache_dims().values()) for i in range(4)]
    assert dims == [80, 48, 80, 80]
