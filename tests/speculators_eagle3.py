"""Random EAGLE-3 drafters built by speculators 0.9.0's own model code (``Eagle3DraftModel``), for the tests that
import one (tests/convert/test_eagle3_speculators.py against a made-up verifier, tests/dist/test_eagle3_training.py
against a trained target's export): a random valid draft vocabulary, random weights, the target's embedding."""

from __future__ import annotations

from pathlib import Path

import torch


def random_vocabulary(vocab: int, size: int, generator) -> tuple[torch.Tensor, torch.Tensor]:
    """(d2t [size] int64, t2d [vocab] bool) of ``size`` ids drawn at random: speculators' tables (target id of draft
    index i = i + d2t[i], the ids increasing)."""
    ids = torch.randperm(vocab, generator=generator)[:size].sort().values
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[ids] = True
    return ids - torch.arange(size), t2d


def speculators_built(out: Path, embedding: torch.Tensor, generator, *, verifier: str, architectures: list[str],
                      aux_layers: list[int], draft_vocab: int, steps: int, heads: int, kv_heads: int, ffn: int,
                      layers: int = 2, eps: float = 1e-5, rope_theta: float = 5000.0) -> Path:
    """A random ``Eagle3DraftModel`` over ``embedding`` [vocab, hidden] (its embed_tokens), norm_before_residual,
    saved by its ``save_pretrained`` in ``out`` with speculators' config naming ``verifier``. Its weights are drawn
    from ``generator`` (norms about 1), its draft vocabulary too (``random_vocabulary``)."""
    from speculators.config import SpeculatorsConfig, VerifierConfig
    from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig
    from speculators.proposals.greedy import GreedyTokenProposalConfig
    from transformers import LlamaConfig

    vocab, hidden = embedding.shape
    layer = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=ffn, num_hidden_layers=layers,
                        num_attention_heads=heads, num_key_value_heads=kv_heads, rms_norm_eps=eps,
                        max_position_embeddings=64, rope_theta=rope_theta)
    layer._attn_implementation = "eager"
    config = Eagle3SpeculatorConfig(
        transformer_layer_config=layer, draft_vocab_size=draft_vocab, norm_before_residual=True,
        eagle_aux_hidden_state_layer_ids=list(aux_layers),
        speculators_config=SpeculatorsConfig(
            algorithm="eagle3", proposal_methods=[GreedyTokenProposalConfig(speculative_tokens=steps)],
            default_proposal_method="greedy",
            verifier=VerifierConfig(name_or_path=verifier, architectures=architectures)))
    torch.manual_seed(1)
    model = Eagle3DraftModel(config)
    d2t, t2d = random_vocabulary(vocab, draft_vocab, generator)
    model.load_vocab_mappings(t2d, d2t)
    with torch.no_grad():
        for name, param in model.named_parameters():
            param.copy_(torch.randn(param.shape, generator=generator) * (0.2 if "norm" in name else 0.1)
                        + (1.0 if "norm" in name else 0.0))
        model.embed_tokens.weight.copy_(embedding)
    model.save_pretrained(out)
    return out
