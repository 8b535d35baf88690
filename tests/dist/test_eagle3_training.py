"""An EAGLE-3 drafter (mtp.style eagle3) trains on a frozen DeepSeek-V3-style target in one process: its K steps'
losses (the KL to the target over the draft vocabulary, held out too) fall to well under half and its
acceptance rises in a few steps, while the target's weights (router expert biases included) are saved
bitwise as loaded; a new drafter's draft vocabulary is the corpus' most frequent tokens and its output head the
target's output rows of them (frozen, as speculators keeps it; trained under bf16, its first step starts from
them). `convert to-hf` of the trained checkpoint writes
the target and a speculators directory that speculators' Eagle3DraftModel loads with no missing or unexpected key,
naming the target export as its verifier: speculators' own verifier head over t2d's rows is our head, so the
tables and the head agree through the export; `convert from-hf --mtp-dir` of it gives the drafter back bitwise;
`generate OUT --speculative 3` drafts with it (OUT/mtp beside OUT/main): greedy, the same tokens as plain decoding,
some of its drafts accepted. A random drafter built by speculators' own Eagle3DraftModel for that target export
imports with `from-hf --mtp-dir` and trains two steps from the checkpoint: the target bitwise as imported, the
drafter's weights moved from the imported ones by at most two optimizer steps, its frozen head and its draft
vocabulary kept as imported (not re-picked from the corpus). At TP2×EP2 (sequence parallel) the drafter trains
as in one process, and its step-1 checkpoint resumes at EP2 with the one-process run's step 2."""

from __future__ import annotations

import json

import pytest
import torch

from megatron_mtp.checkpoint.info import read_config
from megatron_mtp.checkpoint.torch_dist_reader import TorchDistReader
from megatron_mtp.errors import UserError
from megatron_mtp.models.family import family_of_hf_config
from tests.dist.conftest import run_as_of

pytestmark = [pytest.mark.dist, pytest.mark.mcore]

K = 2
EAGLE3 = ("mtp.style=eagle3", f"mtp.num_layers={K}", "mtp.eagle3.aux_layers=[0,1,2]",
          "mtp.eagle3.draft_vocab_size=256")


def _latest(run):
    return run / "checkpoints" / (run / "checkpoints" / "latest").read_text().strip()


@pytest.fixture(scope="module")
def runs(tmp_path_factory, train):
    """(the target: 10 steps without MTP, the drafter run: 8 steps on it)."""
    root = tmp_path_factory.mktemp("eagle3")
    train(root / "target", steps=10, overrides=("mtp.num_layers=0", "checkpoint.save_interval=10"))
    train(root / "draft", steps=8, overrides=(*EAGLE3, f"checkpoint.load={root / 'target'}",
                                              "checkpoint.save_interval=8", "logging.eval_interval=8",
                                              "logging.eval_steps=1"))
    return root / "target", root / "draft"


def test_the_drafter_learns_and_the_target_stays_bitwise(runs, metrics):
    from megatron_mtp.mtp_styles.eagle3.vocab import draft_vocabulary, train_counts

    target, draft = runs
    rows = [r for r in metrics(draft) if "train/mtp_loss_1" in r]
    for k in range(1, K + 1):
        first, last = rows[0][f"train/mtp_loss_{k}"], rows[-1][f"train/mtp_loss_{k}"]
        accepted = rows[0][f"train/mtp_acceptance_{k}"], rows[-1][f"train/mtp_acceptance_{k}"]
        print(f"eagle3 step {k}: KL {first:.4f} -> {last:.4f}, acceptance {accepted[0]:.3f} -> {accepted[1]:.3f} in "
              f"{len(rows)} steps")
        assert last < 0.5 * first, (k, first, last)
        assert accepted[1] > accepted[0] + 0.05, accepted  # its argmax, mapped to target ids, meets the target's
    valid = next(r for r in metrics(draft) if "valid/mtp_loss_1" in r)
    assert 0 < valid["valid/mtp_loss_1"] < 2 * rows[-1]["train/mtp_loss_1"]  # the same KL, held out
    with TorchDistReader(_latest(target)) as src, TorchDistReader(_latest(draft)) as out:
        main = [k for k in src.keys() if not k.startswith("optimizer")]
        changed = [k for k in main if not torch.equal(src.read(k), out.read(k))]
        assert main and not changed, changed
        cfg = read_config(_latest(draft))
        d2t, t2d = draft_vocabulary(train_counts(cfg, cfg.model.vocab_size), 256)
        assert torch.equal(out.read("mtp_eagle3.d2t"), d2t) and torch.equal(out.read("mtp_eagle3.t2d"), t2d)
        ids = torch.arange(256) + d2t
        assert torch.equal(out.read("mtp_eagle3.lm_head.weight"), src.read("output_layer.weight")[ids])


def test_a_trained_head_under_bf16_starts_as_the_targets_rows(runs, train, metrics, tmp_path):
    """mtp.eagle3.train_lm_head under bf16: the optimizer's fp32 copy of the head is made when it is built, before a
    new drafter's head is set from the target's output rows (prepare_after_load); the reload after it
    (training/session.py) carries them over, so a step at lr 0 leaves the head as those rows, where a stale
    copy would put its all-zero start back."""
    target, _ = runs
    run = tmp_path / "bf16"
    train(run, steps=1, overrides=(*EAGLE3, f"checkpoint.load={target}", "mtp.eagle3.train_lm_head=true",
                                   "training.precision=bf16", "optimizer.lr=0", "optimizer.min_lr=0",
                                   "checkpoint.save_interval=1"))
    assert [r["train/mtp_loss_1"] > 0 for r in metrics(run) if "train/mtp_loss_1" in r] == [True]
    with TorchDistReader(_latest(run)) as out:
        head, ids = out.read("mtp_eagle3.lm_head.weight"), torch.arange(256) + out.read("mtp_eagle3.d2t")
        rows = out.read("output_layer.weight")[ids]
        assert head.dtype == rows.dtype and bool(head.abs().sum() > 0)
        assert torch.equal(head, rows), (head - rows).abs().max()


@pytest.fixture(scope="module")
def exported(runs, tmp_path_factory):
    """`convert to-hf` of the drafter run (fp32): OUT/main the target, OUT/mtp the drafter."""
    pytest.importorskip("speculators.models.eagle3")
    from megatron_mtp.convert.to_hf import export_to_hf

    return export_to_hf(runs[1], tmp_path_factory.mktemp("eagle3_hf") / "hf", dtype="fp32")


def test_the_trained_drafter_goes_through_to_hf_and_back(runs, exported, tmp_path, capsys):
    """`convert to-hf` writes the target in OUT/main and the drafter in OUT/mtp (speculators' format, the target
    export its verifier); `convert from-hf OUT/main --mtp-dir OUT/mtp` gives back the drafter's tensors bitwise;
    `generate OUT --speculative 3` (greedy) drafts with it and gives plain decoding's tokens."""
    speculators_eagle3 = pytest.importorskip("speculators.models.eagle3")
    from megatron_mtp.convert.from_hf import import_from_hf
    from megatron_mtp.convert.to_hf import export_to_hf
    from megatron_mtp.mtp_styles.eagle3 import hf

    _, draft = runs
    with pytest.raises(UserError, match="^--mtp inline puts MTP layers among the target's, and this checkpoint's "
                                        "EAGLE-3 drafter"):
        export_to_hf(draft, tmp_path / "refused", mtp="inline", dtype="fp32")
    out = exported
    target, drafter = (out / "main").absolute(), out / "mtp"
    assert json.loads((target / "config.json").read_text())["num_nextn_predict_layers"] == 0
    config, saved = hf.read_dir(drafter)
    assert config["speculators_config"]["verifier"] == {"name_or_path": str(target),
                                                         "architectures": ["DeepseekV3ForCausalLM"]}
    assert config["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == K
    loaded = speculators_eagle3.Eagle3SpeculatorConfig.from_pretrained(drafter)
    loaded.transformer_layer_config._attn_implementation = "eager"
    missing, unexpected = speculators_eagle3.Eagle3DraftModel(loaded).load_state_dict(saved, strict=False)
    assert not unexpected and set(missing) == {"verifier_lm_head.weight", "verifier_norm.weight"}, (missing, unexpected)
    model = speculators_eagle3.Eagle3DraftModel.from_pretrained(drafter, config=loaded)  # reads the verifier's weights
    assert torch.equal(model.verifier_lm_head.weight, saved["lm_head.weight"])
    assert model.config.eagle_aux_hidden_state_layer_ids == [0, 1, 2]
    serving = (out / "SERVING.md").read_text()
    assert '"method": "eagle3"' in serving and "EAGLE3" in serving and "transformers has no EAGLE-3" in serving
    _generates_with_the_drafter(out, capsys)

    back = import_from_hf(target, tmp_path / "back", mtp_dir=drafter)
    cfg = read_config(back)
    assert (cfg.mtp.style, cfg.mtp.num_layers, cfg.mtp.freeze_base) == ("eagle3", K, True)
    assert (cfg.mtp.eagle3.aux_layers, cfg.mtp.eagle3.draft_vocab_size) == ([0, 1, 2], 256)
    with TorchDistReader(_latest(draft)) as src, TorchDistReader(back) as dst:
        keys = [k for k in src.keys() if k.startswith("mtp_eagle3.")]
        assert "mtp_eagle3.d2t" in keys and sorted(keys) == sorted(k for k in dst.keys() if k.startswith("mtp_eagle3."))
        changed = []
        for key in [*keys, "embedding.word_embeddings.weight"]:
            a, b = src.read(key), dst.read(key)
            if not (torch.equal(b.to(a.dtype), a) and (a.is_floating_point() or a.dtype == b.dtype)):
                changed.append(key)
        assert not changed, changed


def test_a_speculators_built_drafter_imports_and_trains_on_the_frozen_target(exported, train, metrics, tmp_path):
    """A random drafter built by speculators' own Eagle3DraftModel for the exported target (two layers, two
    key/value heads, norm_before_residual, a random draft vocabulary, the target's embedding; save_pretrained with
    OUT/main as its verifier) goes through `convert from-hf OUT/main CKPT --mtp-dir THEIRS`, and two steps from
    checkpoint.load=CKPT train it: the target's tensors are saved bitwise as imported, each trained tensor of the
    drafter moved from its imported value, by no more than its two Adam steps allow (lr each; a drafter that
    started from fresh weights would be 0.1 or more away), its frozen head and its draft vocabulary are the
    imported ones bitwise (never re-picked from the corpus, nor the head reset to the target's rows), and the
    draft steps' losses are finite."""
    import math

    from megatron_mtp.convert.from_hf import import_from_hf
    from megatron_mtp.hf_dir.safetensors_io import HFDir
    from megatron_mtp.mtp_styles.eagle3 import hf
    from tests.speculators_eagle3 import speculators_built

    target = (exported / "main").absolute()
    config = json.loads((target / "config.json").read_text())
    m, _, vocab = family_of_hf_config(config, "config.json").from_hf_config(config, "config.json")
    embedding = HFDir(target).raw("model.embed_tokens.weight")
    assert tuple(embedding.shape) == (vocab, m.hidden_size)
    theirs = speculators_built(tmp_path / "theirs", embedding, torch.Generator().manual_seed(3), verifier=str(target),
                               architectures=config["architectures"], aux_layers=[0, 1, 2], draft_vocab=256, steps=K,
                               heads=m.num_attention_heads, kv_heads=2, ffn=96, eps=m.norm_epsilon,
                               rope_theta=float(m.rope_theta))
    spec, tensors = hf.read_dir(theirs)
    ckpt = import_from_hf(target, tmp_path / "ckpt", mtp_dir=theirs)
    fields = hf.shape_fields(spec, str(theirs))  # the drafter's shape as the run's config says it
    assert (fields["mtp.eagle3.num_layers"], fields["mtp.eagle3.num_query_groups"]) == (2, 2)
    shape = [f"{k}={json.dumps(v, separators=(',', ':'))}" for k, v in fields.items()]
    run = tmp_path / "from_speculators"
    train(run, steps=2, overrides=("mtp.style=eagle3", *shape, f"checkpoint.load={ckpt}",
                                   "checkpoint.save_interval=2"))
    rows = [r for r in metrics(run) if "train/mtp_loss_1" in r]
    assert len(rows) == 2 and all(math.isfinite(r[f"train/mtp_loss_{k}"]) for r in rows for k in range(1, K + 1))
    lr = read_config(_latest(run)).optimizer.lr
    with TorchDistReader(ckpt) as src, TorchDistReader(_latest(run)) as out:
        weights = [k for k in src.keys() if not k.startswith("optimizer")]
        main = [k for k in weights if not k.startswith("mtp_eagle3.")]
        assert main and not [k for k in main if not torch.equal(src.read(k), out.read(k))]  # the target, frozen
        kept = ["mtp_eagle3.d2t", "mtp_eagle3.t2d", "mtp_eagle3.lm_head.weight"]
        assert not [k for k in kept if not torch.equal(src.read(k), out.read(k))], kept
        assert torch.equal(out.read("mtp_eagle3.d2t"), tensors["d2t"]) and torch.equal(out.read("mtp_eagle3.t2d"),
                                                                                       tensors["t2d"])
        trained = [k for k in weights if k.startswith("mtp_eagle3.") and k not in kept and "_extra_state" not in k]
        moved = {k: float((out.read(k) - src.read(k)).abs().max()) for k in trained}
        print(f"eagle3 from a speculators-built drafter, 2 steps at lr {lr}: the drafter's tensors moved by "
              f"{min(moved.values()):.2e} to {max(moved.values()):.2e}, step losses "
              f"{[round(r['train/mtp_loss_1'], 4) for r in rows]}")
        assert len(trained) > 10 and all(0 < d <= 3 * lr for d in moved.values()), moved  # Adam: <= lr a step


def _generates_with_the_drafter(out, capsys):
    """`megatron-mtp generate OUT --speculative 3 --json` (greedy) against `--speculative 0`: the same tokens, and a
    K of 3 (one step beyond the K=2 it trained) accepts some drafts."""
    import time

    from megatron_mtp.cli import main

    start, results = time.perf_counter(), []
    for k in ("0", "3"):
        assert main(["generate", str(out), "--prompt", "def main():", "--max-new-tokens", "24", "--speculative", k,
                     "--ignore-eos", "--json"]) == 0
        results.append(json.loads(capsys.readouterr().out.strip().splitlines()[-1]))
    plain, spec = results
    stats = spec["stats"]
    with capsys.disabled():
        print(f"eagle3 generate --speculative 3: acceptance per position {stats['acceptance_per_position']}, "
              f"mean accept length {stats['mean_accept_length']:.2f}, {len(set(plain['tokens']))} distinct of "
              f"{len(plain['tokens'])} tokens; both runs {time.perf_counter() - start:.1f} s")
    assert spec["tokens"] == plain["tokens"] and len(plain["tokens"]) == 24
    assert len(stats["acceptance_per_position"]) == 3 and stats["acceptance_rate"] > 0, stats


def test_tp2_ep2_trains_the_drafter_as_one_process_does(runs, train, metrics, tmp_path):
    """TP2×EP2 on two ranks (sequence parallel: the aux states sequence-sharded, the target's logits
    vocab-sharded, the drafter's linears split over TP; shards.py) gives the one-process run's first two steps: each
    draft step's KL and acceptance, and the gradient norm (a gradient summed over the wrong ranks, or not at all,
    moves it by a factor; the drafter's norms' gradients left unsummed over TP move it by 8e-5 relative at step 1);
    step 2 after an update of the split drafter, its acceptance near 1 (step 1's is 0). Reduction order moves them
    by 1e-6 relative at most (measured). Its saved draft vocabulary and frozen head (the target's vocab-sharded
    output rows at it, summed over TP) are the one-process run's, bitwise. Its step-1 checkpoint (reshardable
    optimizer state) resumes at EP2 alone (TP1; EP stays, as megatron-core splits the optimizer differently at EP1)
    and gives the one-process run's step 2 the same way, the target still bitwise: the drafter's weights, its Adam
    moments and its draft vocabulary carried across the layout change."""
    target, draft = runs
    run = tmp_path / "tp2_ep2"
    train(run, nproc=2, steps=2, overrides=(*EAGLE3, f"checkpoint.load={target}", "parallel.tensor=2",
                                            "parallel.expert=2", "parallel.expert_tensor=1",
                                            "checkpoint.save_interval=1", "checkpoint.optimizer_format=reshardable"))
    single = [r for r in metrics(draft) if "train/mtp_loss_1" in r][:2]
    rows = [r for r in metrics(run) if "train/mtp_loss_1" in r]
    keys = [*(f"train/mtp_{m}_{k}" for m in ("loss", "acceptance") for k in range(1, K + 1)), "train/grad_norm",
            "train/lm_loss"]
    assert len(rows) == 2 and single[1]["train/mtp_acceptance_1"] > 0.5, single
    for step, (row, one) in enumerate(zip(rows, single), 1):
        print(f"eagle3 TP2xEP2 step {step}: " + ", ".join(f"{k[6:]} {row[k]:.6f} ({one[k]:.6f})" for k in keys))
        assert all(row[k] == pytest.approx(one[k], rel=1e-5) for k in keys), [(k, row[k], one[k]) for k in keys]
    with TorchDistReader(_latest(draft)) as src, TorchDistReader(_latest(run)) as out:  # the frozen head, split
        for key in ("mtp_eagle3.lm_head.weight", "mtp_eagle3.d2t", "mtp_eagle3.t2d"):
            assert torch.equal(out.read(key), src.read(key)), key
    _resumes_at_ep2(run, target, single[1], keys, train, metrics, tmp_path)


def _resumes_at_ep2(run, target, one, keys, train, metrics, tmp_path):
    import time

    start, resumed = time.perf_counter(), run_as_of(run, tmp_path / "resumed", 1)
    second = train(resumed, nproc=2, steps=2, overrides=(*EAGLE3, f"checkpoint.load={target}", "parallel.expert=2",
                                                          "checkpoint.save_interval=2"))
    assert "resumed from" in second.stdout and "at step 1" in second.stdout, second.stdout[-2000:]
    rows = [r for r in metrics(resumed) if "train/mtp_loss_1" in r]
    assert [r["step"] for r in rows] == [1, 2], rows
    print(f"eagle3 TP2xEP2 step 1 resumed at EP2 ({time.perf_counter() - start:.1f} s), step 2: "
          + ", ".join(f"{k[6:]} {rows[1][k]:.6f} ({one[k]:.6f})" for k in keys))
    assert all(rows[1][k] == pytest.approx(one[k], rel=1e-5) for k in keys), [(k, rows[1][k], one[k]) for k in keys]
    with TorchDistReader(_latest(target)) as src, TorchDistReader(_latest(resumed)) as out:
        main = [k for k in src.keys() if not k.startswith("optimizer")]
        changed = [k for k in main if not torch.equal(src.read(k), out.read(k))]
        assert main and not changed, changed
    # step 2's update read step 1's Adam moments (its metrics come before it): the drafter it saves is the
    # uninterrupted TP2×EP2 run's to reduction order (4e-8 seen; one without them moves by 4e-3)
    with TorchDistReader(_latest(resumed)) as out, TorchDistReader(_latest(run)) as tp:
        drafter = [k for k in out.keys() if k.startswith("mtp_eagle3.") and out.read(k).is_floating_point()]
        moved = [(k, float((out.read(k) - tp.read(k)).abs().max())) for k in drafter]
        assert len(drafter) > 5 and all(d < 1e-6 for _, d in moved), moved
