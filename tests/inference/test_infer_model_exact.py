"""Our compact DeepSeek-V3 (target and MTP module) against transformers' implementation, fp32."""

from __future__ import annotations

import pytest
import torch
from infer_tiny_model import make_tiny_export

TOL = 1e-5


def _hf_model(main_dir):
    from transformers import DeepseekV3ForCausalLM

    return DeepseekV3ForCausalLM.from_pretrained(main_dir, attn_implementation="eager").eval()


@pytest.mark.parametrize(
    "variant",
    [
        {"rope": "yarn", "interleave": True, "q_lora": 32},
        {"rope": "default", "interleave": False, "q_lora": None},
        {"rope": "yarn", "interleave": True, "q_lora": 32, "experts": 16},  # single tokens take the expert loop
    ],
    ids=["yarn-interleave-qlora", "default-rope-no-qlora", "16-experts"],
)
def test_target_logits_match_transformers(tmp_path, variant):
    from megatron_mtp.inference.generate import load_generator

    root = make_tiny_export(tmp_path, layout="plain", seed=3, **variant)
    gen = load_generator(root)
    hf = _hf_model(root)
    ids = list(range(5, 40, 2))
    with torch.no_grad():
        ref = hf(torch.tensor([ids])).logits[0]
    gen.target.reset_cache()
    full, _ = gen.target.forward(ids)
    assert (full - ref).abs().max() < TOL
    gen.target.reset_cache()  # incremental: prefill, single steps, a chunk, after a rollback
    parts = [gen.target.forward(ids[:7])[0], gen.target.forward(ids[7:8])[0]]
    gen.target.forward([3, 4, 5])
    gen.target.truncate_cache(8)
    parts += [gen.target.forward(ids[8:12])[0], gen.target.forward(ids[12:])[0]]
    assert (torch.cat(parts) - ref).abs().max() < TOL


def _hf_decoder_layer(config, layer_index, state, prefix):
    """transformers' decoder layer loaded with one exported MTP layer (experts fused its way)."""
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3DecoderLayer

    layer = DeepseekV3DecoderLayer(config, layer_index).eval()
    own = {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}
    sd = {}
    for name in layer.state_dict():
        if name == "mlp.experts.gate_up_proj":
            sd[name] = torch.stack([torch.cat([own[f"mlp.experts.{e}.gate_proj.weight"],
                                               own[f"mlp.experts.{e}.up_proj.weight"]])
                                    for e in range(config.n_routed_experts)])
        elif name == "mlp.experts.down_proj":
            sd[name] = torch.stack([own[f"mlp.experts.{e}.down_proj.weight"] for e in range(config.n_routed_experts)])
        else:
            sd[name] = own[name]
    layer.load_state_dict(sd)
    return layer


def test_mtp_module_matches_megatron_recipe_on_transformers_layers(export_d1, gen_d1):
    """h_1(t) = norm(layer(eh_proj([enorm(emb(x_{t+1})), hnorm(h_0(t))]))) with h_0 after the final norm."""
    from safetensors.torch import load_file

    hf = _hf_model(export_d1 / "main")
    config = hf.config
    L = config.num_hidden_layers
    prefix = f"model.layers.{L}."
    state = load_file(str(export_d1 / "mtp" / "model.safetensors"))
    layer = _hf_decoder_layer(config, L, state, prefix)

    def rms(x, w):
        return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + config.rms_norm_eps))

    ids = list(range(10, 60, 3))
    with torch.no_grad():
        h0 = hf.model(torch.tensor([ids])).last_hidden_state[0]
        emb = state[prefix + "embed_tokens.weight"][torch.tensor(ids[1:])]
        x = torch.cat([rms(emb, state[prefix + "enorm.weight"]), rms(h0[:-1], state[prefix + "hnorm.weight"])], -1)
        x = (x @ state[prefix + "eh_proj.weight"].T)[None]
        t = x.shape[1]
        pos = hf.model.rotary_emb(x, torch.arange(t)[None])
        mask = torch.full((t, t), float("-inf")).triu(1)[None, None]
        out = layer(x, attention_mask=mask, position_embeddings=pos)[0]
        ref_post = rms(out, state[prefix + "shared_head.norm.weight"])
        ref_logits = ref_post[-1] @ state[prefix + "shared_head.head.weight"].T

    gen_d1.target.reset_cache()
    _, hidden = gen_d1.target.forward(ids)
    assert (hidden - h0).abs().max() < TOL
    module = gen_d1.drafter.modules[0]
    module.reset_cache()
    post, _, logits = module.step(hidden[:-1], ids[1:], 0)
    assert (post - ref_post).abs().max() < TOL
    assert (logits - ref_logits).abs().max() < TOL
