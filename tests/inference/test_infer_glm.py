"""The GLM-4.5 family (Glm4MoeForCausalLM) against transformers 5, fp32: logits, the MTP layer, and
transformers' own MTP speculative decoding (``generate(use_mtp=True)``).

The transformers comparison of whole generations runs on the tiny export below and, when
MEGATRON_MTP_GLM_EXPORT names one, on any GLM export directory (inline, or main/ + mtp/), e.g. a
trained one, where acceptance is not an artefact of constructed weights.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from infer_tiny_model import hf_model_class, make_tiny_export

from megatron_mtp.errors import UserError, is_one_sentence

TOL = 1e-5
PROMPT = "def add(a, b):\n    return"


def _hf_model(main_dir):
    # fp32, as our decoder runs, whatever the export stores (bf16 by default)
    model_class = hf_model_class("glm4_moe")
    return model_class.from_pretrained(main_dir, dtype=torch.float32, attn_implementation="eager").eval()


@pytest.mark.parametrize(
    "variant",
    [{"qk_norm": True, "bias": True}, {"qk_norm": False, "bias": False, "partial_rotary_factor": 0.25, "experts": 16}],
    ids=["qk-norm-bias", "plain-attention-quarter-rotary-16-experts"],
)
def test_target_logits_match_transformers(tmp_path, variant):
    from megatron_mtp.inference.generate import load_generator

    root = make_tiny_export(tmp_path, layout="plain", seed=3, family="glm4_moe", **variant)
    gen = load_generator(root)
    hf = _hf_model(root)
    assert hf.config.rope_parameters["partial_rotary_factor"] == variant.get("partial_rotary_factor", 0.5)
    ids = list(range(5, 40, 2))
    with torch.no_grad():
        ref = hf(torch.tensor([ids])).logits[0]
    gen.target.reset_cache()
    full, _ = gen.target.forward(ids)
    assert (full - ref).abs().max() < TOL
    gen.target.reset_cache()  # incremental: prefill, a single step, a rejected chunk rolled back, the rest
    parts = [gen.target.forward(ids[:7])[0], gen.target.forward(ids[7:8])[0]]
    gen.target.forward([3, 4, 5])
    gen.target.truncate_cache(8)
    parts += [gen.target.forward(ids[8:12])[0], gen.target.forward(ids[12:])[0]]
    assert (torch.cat(parts) - ref).abs().max() < TOL


def _hf_with_mtp(root: Path):
    """transformers' model of an export, set up so that ``generate(use_mtp=True)`` finds its MTP layers: they
    sit at layer num_hidden_layers, which GLM's class-level pattern (layers 46 and 92 only) does not name;
    for main/ + mtp/ the MTP part is read from mtp/ (convert/README.md, "Serving")."""
    separate = (root / "main" / "config.json").is_file()
    hf = _hf_model(root / "main" if separate else root)
    hf.generation_config.eos_token_id = None  # as ignore_eos: the comparison runs a fixed number of tokens
    layers = hf.config.num_hidden_layers
    if separate:
        depth = json.loads((root / "mtp" / "config.json").read_text())["num_nextn_predict_layers"]
        hf.config.num_mtp_layers = depth
        hf.config.name_or_path = str(root / "mtp")
    depth = hf.config.num_mtp_layers
    hf._keys_to_ignore_on_load_unexpected = [rf"model\.layers\.{layers + d}\..*" for d in range(depth)]
    return hf


def test_mtp_layer_matches_transformers_mtp_model(export_glm, gen_glm):
    """Our MTP module on h_0 and the next tokens == transformers' MtpModel layer (as its MTP generation
    calls it: positions shifted by one, which RoPE's relative form makes the same) and its head."""
    from transformers.modeling_layers import MtpModel

    hf = _hf_with_mtp(export_glm)
    mtp = MtpModel.from_pretrained(hf).eval()
    ids = list(range(10, 60, 3))
    with torch.no_grad():
        h0 = hf.model(torch.tensor([ids])).last_hidden_state
        ref_post = mtp.forward_layer(0, h0[:, :-1], torch.arange(1, len(ids))[None], None,
                                     input_ids=torch.tensor([ids[1:]]))[0]
        ref_logits = mtp._project_to_logits(ref_post[-1])
    gen_glm.target.reset_cache()
    _, hidden = gen_glm.target.forward(ids)
    assert (hidden - h0[0]).abs().max() < TOL
    module = gen_glm.drafter.modules[0]
    module.reset_cache()
    post, _, logits = module.step(hidden[:-1], ids[1:], 0)
    assert (post - ref_post).abs().max() < TOL
    assert (logits - ref_logits).abs().max() < TOL
    module.reset_cache()  # incrementally, as drafting runs it
    steps = [module.step(hidden[:5], ids[1:6], 0)[0], module.step(hidden[5:6], ids[6:7], 5)[0],
             module.step(hidden[6:-1], ids[7:], 6)[0]]
    assert (torch.cat(steps) - ref_post).abs().max() < TOL


def _transformers_generation(hf, ids: list[int], new: int) -> tuple[list[int], list[int], int]:
    """(plain greedy tokens, use_mtp greedy tokens, main-model forwards of the use_mtp run)."""
    forwards = [0]
    handle = hf.model.register_forward_hook(lambda *_: forwards.__setitem__(0, forwards[0] + 1))
    x = torch.tensor([ids])
    try:
        plain = hf.generate(x, max_new_tokens=new, do_sample=False)[0, len(ids):].tolist()
        forwards[0] = 0
        mtp = hf.generate(x, max_new_tokens=new, do_sample=False, use_mtp=True)[0, len(ids):].tolist()
    finally:
        handle.remove()
    return plain, mtp, forwards[0]


def _glm_exports() -> list:
    extra = os.environ.get("MEGATRON_MTP_GLM_EXPORT")
    tiny = [("inline", 1), ("separate", 1), ("inline", 2)]
    return [pytest.param(t, id=f"{t[0]}-d{t[1]}") for t in tiny] + (
        [pytest.param(extra, id="MEGATRON_MTP_GLM_EXPORT")] if extra else [])


@pytest.mark.parametrize("export", _glm_exports())
def test_speculative_decoding_matches_transformers_use_mtp(tmp_path, export):
    """Greedy: transformers' use_mtp output == its plain output == ours (K = D drafts per round, as transformers
    drafts), and the tokens per verification round (new tokens after the prefill per target forward after
    the prefill) agree within 5%.
    The tiny model is built so that drafts are partly accepted (near_bigram; random MTP weights give
    acceptance near 0, where the comparison would prove little)."""
    from megatron_mtp.inference.generate import load_generator

    tiny = isinstance(export, tuple)  # (layout, MTP depth) of the tiny model, else an export directory
    if tiny:
        root = make_tiny_export(tmp_path, layout=export[0], mtp_depth=export[1], seed=0, mtp_std=0.01,
                                family="glm4_moe", near_bigram=0.1)
    else:
        root = Path(export)
    gen = load_generator(root)
    assert gen.drafter is not None and gen.drafter.depth >= 1
    hf = _hf_with_mtp(root)
    ids = gen.encode(PROMPT) if gen.tokenizer is not None else [5, 17, 33, 2, 9]
    new = 48
    plain, with_mtp, forwards = _transformers_generation(hf, ids, new)
    ours = gen.generate(ids, max_new_tokens=new, ignore_eos=True, speculative_k=gen.drafter.depth)
    assert with_mtp == plain
    assert ours.tokens == plain
    theirs_per_round = (new - 1) / (forwards - 1)
    ours_per_round = (new - 1) / (ours.stats.target_forwards - 1)
    print(f"tokens per verification round: transformers {theirs_per_round:.3f}, ours {ours_per_round:.3f}, "
          f"our acceptance {ours.stats.acceptance_rate:.3f}")
    assert abs(ours_per_round - theirs_per_round) <= 0.05 * theirs_per_round
    if tiny:  # the construction works: drafts are neither all rejected nor all accepted
        assert 0.2 < ours.stats.acceptance_rate < 0.8


def _write_config(tmp_path, **changes) -> Path:
    root = make_tiny_export(tmp_path / "m", layout="plain", seed=7, family="glm4_moe")
    config = json.loads((root / "config.json").read_text())
    for key, value in changes.items():
        if value is None:
            config.pop(key, None)
        else:
            config[key] = value
    (root / "config.json").write_text(json.dumps(config))
    return root


@pytest.mark.parametrize(
    "changes, words",
    [
        ({"model_type": "llama", "architectures": ["LlamaForCausalLM"]}, "not a family megatron-mtp generate decodes"),
        ({"rope_parameters": {"rope_type": "yarn", "factor": 2.0, "rope_theta": 1e4}}, "rope type 'yarn'"),
        ({"num_key_value_heads": 3}, "multiple of num_key_value_heads"),
        ({"partial_rotary_factor": 0.01, "rope_parameters": None}, "rotated dimensions"),
        ({"hidden_size": None}, "has no 'hidden_size'"),
        ({"head_dim": "wide"}, "malformed value"),
        ({"n_group": 0}, "1 <= topk_group <= n_group"),
    ],
    ids=["other-family", "yarn", "kv-heads", "rotary-dims", "no-hidden", "bad-head-dim", "no-groups"],
)
def test_unsupported_glm_configs_are_one_sentence(tmp_path, changes, words):
    from megatron_mtp.inference.generate import load_generator

    root = _write_config(tmp_path, **changes)
    with pytest.raises(UserError) as info:
        load_generator(root)
    message = str(info.value)
    assert words in message and is_one_sentence(message), message


def test_config_view_reads_old_and_new_rope_spellings():
    from megatron_mtp.models.glm4_moe.hf_view import parse_hf_config

    base = {"vocab_size": 8, "hidden_size": 64, "intermediate_size": 8, "num_hidden_layers": 1,
            "num_attention_heads": 4, "num_key_value_heads": 2, "num_mtp_layers": 1}
    old = parse_hf_config({**base, "partial_rotary_factor": 0.25, "rope_theta": 500.0})
    rope = {"rope_type": "default", "rope_theta": 500.0, "partial_rotary_factor": 0.75}
    new = parse_hf_config({**base, "partial_rotary_factor": 0.25, "rope_parameters": rope})  # as transformers: 0.75
    default = parse_hf_config(base)
    assert (old.rotary_dim, old.rope_theta, old.head_dim) == (4, 500.0, 16)
    assert (new.rotary_dim, new.rope_theta) == (12, 500.0)
    assert (default.rotary_dim, default.rope_theta, default.num_nextn_predict_layers) == (8, 10000.0, 1)


def test_cli_decodes_a_glm_export(export_glm, gen_glm):
    """`megatron-mtp generate` on a GLM export: JSON output, tokens as the library's, MTP drafts used."""
    from tests.workers.pool import POOL

    proc = POOL.run(["-m", "megatron_mtp", "generate", str(export_glm), "--prompt", PROMPT, "--max-new-tokens", "10",
                     "--speculative", "2", "--ignore-eos", "--json", "--stats"], timeout=300)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["tokens"] == gen_glm.generate(PROMPT, max_new_tokens=10, ignore_eos=True).tokens
    assert len(out["stats"]["acceptance_per_position"]) == 2 and out["stats"]["rounds"] > 0
    assert "mean accept length" in proc.stderr


_GLM45 = {  # GLM-4.5's published config.json fields (355B); the Air model changes the ones in _AIR
    "architectures": ["Glm4MoeForCausalLM"], "model_type": "glm4_moe", "attention_bias": True, "head_dim": 128,
    "hidden_act": "silu", "hidden_size": 5120, "partial_rotary_factor": 0.5, "intermediate_size": 12288,
    "max_position_embeddings": 131072, "moe_intermediate_size": 1536, "norm_topk_prob": True,
    "num_attention_heads": 96, "n_group": 1, "topk_group": 1, "n_routed_experts": 160, "n_shared_experts": 1,
    "routed_scaling_factor": 2.5, "num_experts_per_tok": 8, "first_k_dense_replace": 3, "num_hidden_layers": 92,
    "num_key_value_heads": 8, "rms_norm_eps": 1e-05, "rope_scaling": None, "rope_theta": 1000000,
    "num_nextn_predict_layers": 1, "tie_word_embeddings": False, "use_qk_norm": True, "vocab_size": 151552,
    "eos_token_id": [151329, 151336, 151338], "pad_token_id": 151329,
}
_AIR = {"hidden_size": 4096, "intermediate_size": 10944, "moe_intermediate_size": 1408, "n_routed_experts": 128,
        "routed_scaling_factor": 1.0, "first_k_dense_replace": 1, "num_hidden_layers": 46, "use_qk_norm": False}


@pytest.mark.parametrize("release", [_GLM45, {**_GLM45, **_AIR}], ids=["GLM-4.5", "GLM-4.5-Air"])
def test_release_configs_read_as_transformers_reads_them(release):
    """Our model of a release config.json has transformers' tensors and shapes (on the meta device) and its
    rotary frequencies. The layer count is cut to the dense layers + 2 to keep it cheap; the MTP layer
    index num_hidden_layers is MoE."""
    from transformers import Glm4MoeConfig
    from transformers.models.glm4_moe.modeling_glm4_moe import Glm4MoeRotaryEmbedding

    from megatron_mtp.inference.model_dir import decodable_config
    from megatron_mtp.inference.target import TargetModel

    raw = {**release, "num_hidden_layers": release["first_k_dense_replace"] + 2}
    config = decodable_config(raw, Path("config.json"))
    assert config.rotary_dim == 64 and config.eos_token_ids == (151329, 151336, 151338)
    assert config.is_moe_layer(config.num_hidden_layers) and not config.is_moe_layer(0)
    hf_config = Glm4MoeConfig.from_dict(raw)
    with torch.device("meta"):
        theirs = hf_model_class("glm4_moe")(hf_config)
        ours = TargetModel(config)
    assert {k: v.shape for k, v in ours.state_dict().items()} == {k: v.shape for k, v in theirs.state_dict().items()}
    assert torch.equal(ours.rotary.inv_freq, Glm4MoeRotaryEmbedding(hf_config).inv_freq)
