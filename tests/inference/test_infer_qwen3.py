"""The Qwen3-MoE family (Qwen3MoeForCausalLM) against transformers 5, fp32: the decoder's logits (softmax
routing with and without renormalisation, no shared experts, q/k norms, full RoPE), incremental decoding
with a rolled-back chunk, and both MTP modules of an export under Qwen3's MTP names against the reference
MTP forward on transformers' decoder layers (tests/convert/mtp_reference.py)."""

from __future__ import annotations

import pytest
import torch
from infer_tiny_model import hf_model_class, make_tiny_export

from tests.convert.mtp_reference import mtp_logits

TOL = 1e-5


@pytest.mark.parametrize("norm_topk_prob", [True, False], ids=["renormalised", "softmax-weights"])
def test_target_logits_match_transformers(tmp_path, norm_topk_prob):
    from megatron_mtp.inference.generate import load_generator

    root = make_tiny_export(tmp_path, layout="plain", seed=3, family="qwen3_moe", norm_topk_prob=norm_topk_prob)
    gen = load_generator(root)
    hf = hf_model_class("qwen3_moe").from_pretrained(root, dtype=torch.float32, attn_implementation="eager").eval()
    assert hf.config.norm_topk_prob is norm_topk_prob
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


def test_both_mtp_modules_match_the_reference_forward(export_qwen3, gen_qwen3):
    ids = list(range(10, 60, 3))
    s = len(ids)
    reference = mtp_logits(export_qwen3 / "main", export_qwen3 / "mtp", torch.tensor([ids]))
    assert len(reference) == len(gen_qwen3.drafter.modules) == 2
    gen_qwen3.target.reset_cache()
    _, hidden = gen_qwen3.target.forward(ids)
    for d, module in enumerate(gen_qwen3.drafter.modules):
        module.reset_cache()
        hidden, _, logits = module.step(hidden[:-1], ids[d + 1:], 0)
        assert (logits - reference[d][0, s - 2 - d]).abs().max() < TOL, d
