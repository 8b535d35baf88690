"""Decoding with an EAGLE-3 drafter (mtp_styles/eagle3/draft.py) beside its target. The target: a tiny random
Qwen3-MoE (8 tokens, 3 layers) saved by transformers in main/; the drafter: a random speculators-built
``Eagle3DraftModel`` (two layers, a draft vocabulary of 6 tokens, norm_before_residual) saved by speculators in mtp/,
as ``convert to-hf`` lays out an EAGLE-3 export. Checked: the aux states the target hands (``hand_layers``) are
transformers' hidden states of those layers; our draft logits equal speculators' for the same aux states and
tokens over three steps, before and after a rollback, with and without norm_output (fp32); speculative greedy
(K = 1..3, two prompts of different lengths and budgets in one batch; the drafter as an --assistant directory too)
equals plain greedy; sampled speculatively (K = 2, sixteen sequences per batch) the first three tokens follow the
target's exact joint distribution (chi-square); a drafter that does not fit its target is one sentence."""

from __future__ import annotations

import pytest
import torch
from target_joint import batched_sampling_pvalue

speculators_eagle3 = pytest.importorskip("speculators.models.eagle3")
transformers = pytest.importorskip("transformers")

V, N, H, K = 8, 6, 64, 3
AUX = (0, 2, 3)  # the embeddings, a middle layer's output and the last layer's (before the final norm)
DRAFT_IDS = [0, 2, 3, 4, 5, 7]
PARAMS = {"temperature": 1.3, "top_k": 3}
SAMPLES = 900
PROMPT = [2, 5, 3, 1, 6]


def _target(root):
    from infer_tiny_model import tiny_qwen3_config

    torch.manual_seed(0)
    model = transformers.Qwen3MoeForCausalLM(tiny_qwen3_config(vocab=V, layers=3, init_std=0.15)).eval()
    model.save_pretrained(root / "main")
    return model


def _drafter(target, norm_output: bool, seed: int):
    """A random speculators Eagle3DraftModel for ``target`` (its embedding table, its layers AUX)."""
    from speculators.config import SpeculatorsConfig, VerifierConfig
    from speculators.proposals.greedy import GreedyTokenProposalConfig

    layer = transformers.LlamaConfig(vocab_size=V, hidden_size=H, intermediate_size=48, num_hidden_layers=2,
                                     num_attention_heads=4, num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-6,
                                     max_position_embeddings=512, rope_theta=5000.0)
    layer._attn_implementation = "eager"  # the dense mask on CPU
    config = speculators_eagle3.Eagle3SpeculatorConfig(
        transformer_layer_config=layer, draft_vocab_size=N, norm_before_residual=True, norm_output=norm_output,
        eagle_aux_hidden_state_layer_ids=list(AUX),
        speculators_config=SpeculatorsConfig(
            algorithm="eagle3", proposal_methods=[GreedyTokenProposalConfig(speculative_tokens=K)],
            default_proposal_method="greedy",
            verifier=VerifierConfig(name_or_path=None, architectures=["Qwen3MoeForCausalLM"])))
    torch.manual_seed(seed)
    model = speculators_eagle3.Eagle3DraftModel(config)
    g = torch.Generator().manual_seed(seed)
    ids = torch.tensor(DRAFT_IDS)
    t2d = torch.zeros(V, dtype=torch.bool)
    t2d[ids] = True
    model.load_vocab_mappings(t2d, ids - torch.arange(N))
    with torch.no_grad():
        for name, param in model.named_parameters():
            param.copy_(torch.randn(param.shape, generator=g) * (0.2 if "norm" in name else 0.15)
                        + (1.0 if "norm" in name else 0.0))
        model.embed_tokens.weight.copy_(target.model.embed_tokens.weight)
    return model.eval()


@pytest.fixture(scope="module")
def export(tmp_path_factory):
    root = tmp_path_factory.mktemp("eagle3_decode")
    target = _target(root)
    _drafter(target, norm_output=True, seed=1).save_pretrained(root / "mtp")
    return root, target


@pytest.fixture(scope="module")
def gen(export):
    from megatron_mtp.inference.generate import load_generator

    return load_generator(export[0])


def _their_logits(model, aux: torch.Tensor, ext: list[int], anchor: int) -> list[torch.Tensor]:
    """speculators' K steps at ``anchor`` (its draft-vocabulary logits): the aux states of anchors 0..anchor+K-1
    beside the tokens ext[1..] (step k at the anchor reads ext[anchor+1+k], teacher forced)."""
    seen = []
    hook = model.lm_head.register_forward_hook(lambda m, i, o: seen.append(o.detach()[0, anchor]))
    length = anchor + K
    try:
        with torch.no_grad():
            model(hidden_states=aux[None, :length], input_ids=torch.tensor(ext[1:length + 1])[None],
                  document_ids=torch.zeros(1, length, dtype=torch.long), ttt_steps=K)
    finally:
        hook.remove()
    return seen


def _recording_pick(store: list):
    def pick(logits):
        store.append(logits.clone())
        return int(torch.argmax(logits)), None
    return pick


@pytest.mark.parametrize("norm_output", [False, True])
def test_our_draft_logits_equal_speculators_before_and_after_a_rollback(export, tmp_path, norm_output):
    from megatron_mtp.inference.generate import load_generator
    from megatron_mtp.mtp_styles.eagle3.draft import load_eagle3

    root, hf_target = export
    theirs = _drafter(hf_target, norm_output, seed=3)
    theirs.save_pretrained(tmp_path / "mtp")
    target = load_generator(root / "main").target
    drafter = load_eagle3(tmp_path / "mtp", target, torch.float32)
    assert drafter.target_layers == AUX
    target.reset_cache(1)
    target.hand_layers(drafter.target_layers)
    drafter.reset(1)
    seq = [3, 1, 4, 1, 5, 2, 6]
    logits, aux = target.forward_rows([0], [seq[:-1]])  # the prefill: positions 0..N-2, seq[-1] pending
    with torch.no_grad():
        hf_states = hf_target(torch.tensor([seq[:-1]]), output_hidden_states=True).hidden_states
    for j, i in enumerate(AUX[:-1]):  # transformers' last entry is after the final norm; ours (and training's) not
        assert (aux[:, j * H:(j + 1) * H] - hf_states[i][0]).abs().max() < 1e-5, i
    drafter.observe_rows([0], [aux], [0])
    draft_ids = torch.tensor(DRAFT_IDS)
    worst = 0.0
    for round_ in range(2):
        seen: list[torch.Tensor] = []
        drafts, _ = drafter.propose_rows([0], [seq], [K], [_recording_pick(seen)])
        assert all(torch.isinf(x[[1, 6]]).all() for x in seen), "a token outside the draft vocabulary was scored"
        target.truncate_cache(0)
        _, all_aux = target.forward_rows([0], [seq[:-1] + drafts[0]])  # the aux states from scratch, every anchor
        reference = _their_logits(theirs, all_aux, seq + drafts[0][:-1], anchor=len(seq) - 2)
        for ours, ref in zip(seen, reference):
            worst = max(worst, float((ours[draft_ids] - ref).abs().max()))
        if round_ == 0:  # verify: the first draft accepted, the second rejected; the target's cache cut, aux kept
            target.truncate_cache(len(seq) - 1)
            _, new_aux = target.forward_rows([0], [[seq[-1]] + drafts[0]])
            target.truncate_cache(len(seq) + 1)
            drafter.observe_rows([0], [new_aux[:2]], [len(seq) - 1])
            seq = seq + [drafts[0][0], (drafts[0][1] + 1) % V]
            drafter.rollback_rows([0], [len(seq)])
            assert drafter.cache_lengths() == [len(seq) - 3] * 2  # the context: anchors 0..N-2 of the last round
    assert worst < 1e-4, worst
    print(f"eagle3 drafter vs speculators (norm_output={norm_output}): max |logit diff| over 2 rounds of "
          f"{K} steps = {worst:.2e}")


def test_speculative_greedy_with_an_eagle3_drafter_equals_plain_greedy(gen):
    prompts = [PROMPT, [4, 4, 2, 7, 1, 5, 6, 2, 3, 3, 5]]
    budgets = [10, 7]  # the rows near their ends draft different Ks in one round
    plain = [gen.generate(p, max_new_tokens=n, ignore_eos=True).tokens for p, n in zip(prompts, budgets)]
    accepted = []
    for k in (1, 2, 3):
        batch = gen.generate_batch(prompts, batch_size=2, max_new_tokens=budgets, speculative_k=k, ignore_eos=True)
        assert [r.tokens for r in batch.results] == plain, k
        assert batch.stats.verify_forwards > 0
        accepted.append(batch.stats.acceptance_rate)
    assert max(accepted) > 0, accepted  # some drafts accepted: the rollback of a partly accepted round is exercised
    from megatron_mtp.inference.generate import load_generator

    beside = load_generator(gen.source / "main", assistant=gen.source / "mtp")  # `generate MAIN --assistant MTP`
    again = beside.generate_batch(prompts, batch_size=2, max_new_tokens=budgets, speculative_k=3, ignore_eos=True)
    assert [r.tokens for r in again.results] == plain and again.stats.acceptance_rate == accepted[-1]
    print(f"eagle3 greedy K=1..3: acceptance {accepted}")


def test_speculative_sampling_with_an_eagle3_drafter_keeps_the_target_distribution(gen):
    batch, pvalue = batched_sampling_pvalue(gen, PROMPT, PARAMS, SAMPLES)
    assert 0.05 < batch.stats.acceptance_rate < 0.95 and batch.stats.verify_forwards >= SAMPLES // 16
    print(f"eagle3 sampling: acceptance {batch.stats.acceptance_rate:.3f}, chi-square p {pvalue:.3f}")
    assert pvalue > 1e-3, f"chi-square p-value {pvalue}"


def test_a_drafter_that_does_not_fit_its_target_is_one_sentence(export, tmp_path):
    import copy

    from megatron_mtp.errors import UserError
    from megatron_mtp.inference.generate import load_generator
    from megatron_mtp.mtp_styles.eagle3 import hf
    from megatron_mtp.mtp_styles.eagle3.draft import load_eagle3

    root, _ = export
    target = load_generator(root / "main").target
    config, tensors = hf.read_dir(root / "mtp")
    far = copy.deepcopy(config)
    far["eagle_aux_hidden_state_layer_ids"] = [0, 2, 4]
    cases = {
        "far": (far, tensors, r"aux layers \[0, 2, 4\], which does not fit the target beside it .* 3 layers\); pair"),
        "embedding": (config, {**tensors, "embed_tokens.weight": tensors["embed_tokens.weight"] + 1},
                      "its embed_tokens.weight is not the target's embedding table"),
        "missing": (config, {k: v for k, v in tensors.items() if k != "layers.1.mlp.down_proj.weight"},
                    "lacks the tensor layers.1.mlp.down_proj.weight an EAGLE-3 drafter of its config.json needs"),
        "shape": (config, {**tensors, "fc.weight": tensors["fc.weight"][:, :H]},
                  r"fc.weight has shape \[64, 64\], its config.json implies \[64, 192\]; re-export"),
        "tables": (config, {k: v for k, v in tensors.items() if k != "d2t"},
                   "a draft vocabulary of 6 tokens needs its d2t and t2d tables"),
        "fc_norm": ({**config, "fc_norm": True}, tensors, "has fc_norm, which mtp.style=eagle3 does not build yet"),
    }
    for name, (cfg, weights, says) in cases.items():
        path = hf.write_dir(tmp_path / name, cfg, weights, torch.float32)
        with pytest.raises(UserError, match=says):
            load_eagle3(path, target, torch.float32)
    with pytest.raises(UserError, match=r"asks for the target's layers \[0, 4\], but the target has layers 0..3"):
        target.hand_layers([0, 4])
