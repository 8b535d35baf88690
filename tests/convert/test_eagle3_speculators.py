"""The EAGLE-3 drafter (mtp.style eagle3) against speculators 0.9.0's own model code: our drafter exported to the
speculators format loads in ``Eagle3DraftModel`` with no missing or unexpected key and its draft logits for the same
aux hidden states and tokens equal ours at every step (fp32); a random speculators-built drafter (two layers, a draft
vocabulary, norm_before_residual) imports and exports back bitwise, and its logits equal ours too; the converters'
rows (convert to-hf/from-hf) name what that export writes, and what they refuse is one sentence. Skipped where
speculators is not installed (tests/README: it installs without its transformers pin)."""

from __future__ import annotations

import socket

import pytest
import torch

from megatron_mtp.errors import UserError
from megatron_mtp.mtp_styles.eagle3 import hf
from megatron_mtp.mtp_styles.eagle3.shape import DrafterShape
from tests.speculators_eagle3 import random_vocabulary, speculators_built

speculators_eagle3 = pytest.importorskip("speculators.models.eagle3")
pytestmark = pytest.mark.mcore

H, V, N, K, S = 32, 100, 40, 3, 12
AUX = (1, 2, 4)
SHAPE = DrafterShape(hidden=H, target_layers=4, aux_layers=AUX, num_layers=1, heads=4, groups=2, head_dim=8, ffn=64,
                     vocab=V, draft_vocab=N, eps=1e-6, rope_theta=10000.0, norm_before_residual=False,
                     norm_output=False, step_loss_decay=1.0, train_lm_head=False)


@pytest.fixture(scope="module")
def mcore():
    """One gloo rank with megatron-core's parallel state (TP = PP = 1), for the drafter's linears."""
    import torch.distributed as dist
    from megatron.core import parallel_state

    started = not dist.is_initialized()
    if started:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    made = not parallel_state.model_parallel_is_initialized()
    if made:
        parallel_state.initialize_model_parallel(1, 1)
    yield
    if made:
        parallel_state.destroy_model_parallel()
    if started:
        dist.destroy_process_group()


def _target_config():
    from megatron.core.transformer.transformer_config import TransformerConfig

    return TransformerConfig(num_layers=4, hidden_size=H, num_attention_heads=4, use_cpu_initialization=True,
                             layernorm_epsilon=1e-6, init_method_std=0.05, params_dtype=torch.float32)


def _verifier(out, embedding, generator):
    """A target directory as speculators reads its verifier: config.json, and model.safetensors with the tensors
    it loads (the embedding, output head and final norm)."""
    import json

    from safetensors.torch import save_file

    out.mkdir(parents=True)
    (out / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": H, "num_hidden_layers": 4,
        "num_attention_heads": 4, "intermediate_size": 64, "vocab_size": V}))
    save_file({"model.embed_tokens.weight": embedding.contiguous(),
               "lm_head.weight": torch.randn(V, H, generator=generator), "model.norm.weight": torch.ones(H)},
              str(out / "model.safetensors"))
    return str(out)


def _ours(shape: DrafterShape, tensors: dict):
    from megatron_mtp.mtp_styles.eagle3.drafter import Eagle3Drafter

    model = Eagle3Drafter(shape, _target_config())
    missing, unexpected = model.load_state_dict(tensors, strict=False)
    assert not unexpected and all(k.endswith("_extra_state") for k in missing), (missing, unexpected)
    return model.eval()


def _inputs(generator, batch: int = 2):
    aux = torch.randn(S, batch, len(AUX) * H, generator=generator)
    tokens = torch.randint(0, V, (batch, S), generator=generator)
    return aux, tokens


def _our_logits(model, aux, tokens, embedding) -> list[torch.Tensor]:
    """[K] of [s, b, N]: step k reads the tokens shifted k left (0 after the end), as training rolls them."""
    embeddings = []
    for k in range(K):
        shifted = torch.cat([tokens[:, k:], tokens.new_zeros(tokens.shape[0], k)], dim=1)
        embeddings.append(torch.nn.functional.embedding(shifted, embedding).transpose(0, 1))
    positions = 1 + torch.arange(S).expand(tokens.shape[0], S)
    with torch.no_grad():
        return [model.logits(x) for x in model(aux, embeddings, positions)]


def _their_logits(model, aux, tokens, row: int) -> list[torch.Tensor]:
    """speculators' K steps on one sequence (its batch is one packed row): the lm_head's output of each step."""
    seen = []
    hook = model.lm_head.register_forward_hook(lambda m, i, o: seen.append(o.detach()))
    try:
        with torch.no_grad():
            model(hidden_states=aux[:, row][None], input_ids=tokens[row][None],
                  document_ids=torch.zeros(1, S, dtype=torch.long), ttt_steps=K)
    finally:
        hook.remove()
    return [x[0] for x in seen]


def _speculators_model(path):
    config = speculators_eagle3.Eagle3SpeculatorConfig.from_pretrained(path)
    config.transformer_layer_config._attn_implementation = "eager"  # the dense mask on CPU
    return speculators_eagle3.Eagle3DraftModel.from_pretrained(path, config=config).eval()


def _assert_same_logits(ours_model, theirs_model, embedding, generator):
    aux, tokens = _inputs(generator)
    ours = _our_logits(ours_model, aux, tokens, embedding)
    worst = 0.0
    for row in range(tokens.shape[0]):
        theirs = _their_logits(theirs_model, aux, tokens, row)
        assert len(theirs) == K
        for k in range(K):
            worst = max(worst, float((ours[k][:, row] - theirs[k]).abs().max()))
    assert worst < 1e-4, worst
    return worst


def test_our_export_loads_in_speculators_and_drafts_the_same_logits(mcore, tmp_path):
    from megatron_mtp.mtp_styles.eagle3.drafter import Eagle3Drafter

    g = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    model = Eagle3Drafter(SHAPE, _target_config()).eval()
    d2t, t2d = random_vocabulary(V, N, g)
    with torch.no_grad():
        model.d2t.copy_(d2t)
        model.t2d.copy_(t2d)
        for name, param in model.named_parameters():
            if "norm" in name:  # norms of 1 would hide a swapped norm
                param.add_(torch.randn(param.shape, generator=g) * 0.2)
    embedding = torch.randn(V + 28, H, generator=g)  # the target's table, padded as megatron-core pads it
    ours = {k: v.detach() for k, v in model.state_dict().items() if not k.endswith("_extra_state")}
    verifier = _verifier(tmp_path / "target", embedding[:V], g)
    config = hf.speculators_config(SHAPE, K, "float32", 128, verifier, ["LlamaForCausalLM"])
    out = hf.write_dir(tmp_path / "eagle3", config, hf.to_speculators(ours, embedding, SHAPE), torch.float32)

    config_obj = speculators_eagle3.Eagle3SpeculatorConfig.from_pretrained(out)
    config_obj.transformer_layer_config._attn_implementation = "eager"
    fresh = speculators_eagle3.Eagle3DraftModel(config_obj)
    _, saved = hf.read_dir(out)
    missing, unexpected = fresh.load_state_dict(saved, strict=False)
    assert not unexpected, unexpected
    assert set(missing) == {"verifier_lm_head.weight", "verifier_norm.weight"}, missing  # the verifier's, never saved
    theirs = _speculators_model(out)
    assert torch.equal(theirs.d2t, d2t) and torch.equal(theirs.t2d, t2d)
    worst = _assert_same_logits(model, theirs, embedding[:V], g)
    print(f"eagle3 export -> speculators: max |logit diff| over {K} steps = {worst:.2e}")


def test_a_speculators_drafter_imports_and_exports_back_bitwise(mcore, tmp_path):
    g = torch.Generator().manual_seed(2)
    embedding = torch.randn(V, H, generator=g)
    verifier = _verifier(tmp_path / "target", embedding, g)
    source = speculators_built(tmp_path / "theirs", embedding, g, verifier=verifier, architectures=["LlamaForCausalLM"],
                               aux_layers=list(AUX), draft_vocab=N, steps=K, heads=4, kv_heads=1, ffn=48)
    config, tensors = hf.read_dir(source)
    shape = hf.shape_of(config)
    assert (shape.num_layers, shape.groups, shape.ffn, shape.norm_before_residual, shape.eps) == (2, 1, 48, True, 1e-5)
    ours = hf.from_speculators(tensors, shape, embedding, where=str(source))
    back = hf.to_speculators(ours, embedding, shape)
    assert sorted(back) == sorted(tensors)
    changed = [k for k in tensors if not (back[k].dtype == tensors[k].dtype and torch.equal(back[k], tensors[k]))]
    assert not changed, changed
    again = hf.write_dir(tmp_path / "back", hf.speculators_config(shape, K, "float32", 64, verifier, ["X"]), back,
                         torch.float32)
    assert hf.shape_of(hf.read_dir(again)[0]) == shape
    worst = _assert_same_logits(_ours(shape, ours), _speculators_model(source), embedding, g)
    print(f"speculators -> eagle3 import: max |logit diff| over {K} steps = {worst:.2e}")
    hf.from_speculators({**tensors, hf.EMBEDDING: embedding.bfloat16()}, shape, embedding)  # a bf16 export: same
    with pytest.raises(UserError, match="embed_tokens.weight is not the target's embedding"):
        hf.from_speculators(tensors, shape, embedding + 1, where="theirs")


def test_what_the_drafter_does_not_build_is_one_sentence(tmp_path):
    config = hf.speculators_config(SHAPE, K, "float32", 64, None, ["X"])
    config["transformer_layer_config"]["model_type"] = "qwen3"
    config["fc_norm"] = True
    with pytest.raises(UserError, match=r"model_type='qwen3' \(llama is built\), fc_norm, which mtp.style=eagle3"):
        hf.shape_fields(config, "d")


def _tiny(*overrides):
    from pathlib import Path

    from megatron_mtp.config import load_config

    tiny = str(Path(__file__).resolve().parents[2] / "configs" / "tiny_cpu.yaml")
    return load_config(tiny, ["mtp.style=eagle3", "mtp.num_layers=3", "checkpoint.load=/somewhere",
                              "model.num_layers=8", "model.vocab_size=1000", *overrides])


@pytest.mark.parametrize("draft_vocab", [256, None])
def test_the_converters_rows_write_what_speculators_names(draft_vocab):
    """convert's table rows (to-hf/from-hf) name exactly the tensors hf.to_speculators writes; over the whole
    vocabulary the d2t/t2d rows write nothing, and embed_tokens keeps the tokenizer's rows of the padded table."""
    from megatron_mtp.convert.drafter_dir import dir_name
    from megatron_mtp.mtp_styles.eagle3 import convert
    from megatron_mtp.mtp_styles.eagle3.shape import PREFIX, drafter_shape, tensor_shapes

    cfg = _tiny(*([f"mtp.eagle3.draft_vocab_size={draft_vocab}"] if draft_vocab else []))
    padded, shape = 1024, drafter_shape(cfg)
    rows = convert.drafter_params(cfg, padded)
    ours = {k[len(PREFIX):]: torch.zeros(s) for k, s in tensor_shapes(cfg, padded).items()}
    written = hf.to_speculators(ours, torch.zeros(padded, shape.hidden), shape)
    assert sorted(dir_name(n) for p in rows for n in p.hf) == sorted(written)
    embed = next(p for p in rows if p.hf and dir_name(p.hf[0]) == hf.EMBEDDING)
    assert embed.transform.part_rows(padded) == [1000]
    assert embed.transform.to_hf(torch.zeros(padded, 2))[0].shape == (1000, 2)


def test_what_the_converters_refuse_is_one_sentence(tmp_path):
    from pathlib import Path
    from types import SimpleNamespace

    from megatron_mtp.mtp_styles.eagle3 import convert
    from megatron_mtp.mtp_styles.eagle3.shape import drafter_shape

    cfg = _tiny("mtp.eagle3.draft_vocab_size=256", "mtp.eagle3.aux_layers=[1,4,8]")

    def imported(config, vocab=1000):
        mtp = SimpleNamespace()
        convert.import_shape(mtp, SimpleNamespace(path=Path("d"), config=config), cfg.model, vocab)
        return mtp

    good = hf.speculators_config(drafter_shape(cfg), 3, "float32", 64, None, ["X"])
    mtp = imported(good)
    e, shape = mtp.eagle3, drafter_shape(cfg)
    assert mtp.freeze_base and (e.aux_layers, e.draft_vocab_size, e.num_layers) == ([1, 4, 8], 256, 1)
    assert (e.num_attention_heads, e.num_query_groups, e.head_dim, e.ffn_hidden_size) == (
        shape.heads, shape.groups, shape.head_dim, shape.ffn)
    for config, vocab, says in [
        (hf.speculators_config(SHAPE, K, "float32", 64, None, ["X"]), 1000, r"hidden_size is 32 and the target's"),
        (good, 1024, "the drafter's vocab_size is 1000 and the target's 1024; pass the drafter of this target$"),
        (hf.speculators_config(drafter_shape(_tiny("mtp.eagle3.aux_layers=[1,4,8]")), 3, "float32", 64, None, ["X"]),
         1000, r"over the target's whole vocabulary \(no d2t/t2d\) is not imported yet"),
    ]:
        with pytest.raises(UserError, match=says):
            imported(config, vocab)
    with pytest.raises(UserError, match="^--mtp-layout nextn puts MTP layers among the target's"):
        convert.check_export(None, "nextn", None, True)
    assert convert.check_export(None, None, None, True) == "separate"
    with pytest.raises(UserError, match="^--dtype fp8 would store the EAGLE-3 drafter's linears in FP8 blocks"):
        convert.mtp_config(cfg, 1024, {}, 3, "fp8", "hf", None)
