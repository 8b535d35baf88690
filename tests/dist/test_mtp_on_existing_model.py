"""A model trained (or imported) without MTP gets new MTP modules through checkpoint.load: drawn at
random, or their transformer layer copied from the last decoder layer; the main weights load as saved.
With mtp.freeze_base only those modules train: the main weights of every checkpoint are bitwise the
loaded ones, at one process and at TP2×PP2×EP2, the optimizer holds the MTP parameters alone, and a
resumed MTP-only run continues exactly."""

from __future__ import annotations

import pytest
import torch

from megatron_mtp.checkpoint.torch_dist_reader import TorchDistReader

pytestmark = [pytest.mark.dist, pytest.mark.mcore]

FROZEN = ("optimizer.lr=0", "optimizer.min_lr=0")  # one step that changes no weight: the loaded ones are saved


def _latest(run):
    return run / "checkpoints" / (run / "checkpoints" / "latest").read_text().strip()


@pytest.fixture(scope="module")
def base(tmp_path_factory, train):
    """A model without MTP (its weights: a new run's; lr 0)."""
    run = tmp_path_factory.mktemp("existing") / "base"
    train(run, steps=1, overrides=("mtp.num_layers=0", *FROZEN, "checkpoint.save_interval=1"))
    return run


def test_new_mtp_modules_on_a_model_without_mtp(tmp_path, base, train):
    runs = {}
    for init, depth in (("random", 1), ("copy_last_layer", 2)):  # two new modules: each copies the last layer
        runs[init] = tmp_path / init
        proc = train(runs[init], steps=1, overrides=(
            f"mtp.num_layers={depth}", f"mtp.init={init}", f"checkpoint.load={base}", "checkpoint.load_optimizer=false",
            *FROZEN, "checkpoint.save_interval=1"))
        assert f"mtp{depth}_loss" in proc.stdout
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
            assert torch.equal(cpy.read(key.replace("mtp.layers.0.", "mtp.layers.1.")), src.read(twin)), key
            if "layernorm" not in key and "norm_weight" not in key:
                assert not torch.equal(rnd.read(key), src.read(twin)), key  # random: its own weights
        assert torch.equal(cpy.read("mtp.layers.0.eh_proj.weight"), rnd.read("mtp.layers.0.eh_proj.weight"))
    # a load that leaves a module out says which
    proc = train(tmp_path / "fewer", steps=1, overrides=(
        "mtp.num_layers=1", f"checkpoint.load={_latest(runs['copy_last_layer'])}", "checkpoint.load_optimizer=false"))
    assert "has 2 sequential MTP modules; this run loads 1 sequential MTP module and leaves out mtp.layers.1" \
        in proc.stdout, proc.stdout[-2000:]


def test_a_weights_only_load_in_bf16_keeps_the_loaded_weights(tmp_path, train):
    """bf16 keeps fp32 main parameters in the optimizer: they take the loaded weights, so a step at lr 0 saves the
    loaded ones bitwise (not the new run's own initial weights, which another seed draws differently)."""
    bf16 = ("training.precision=bf16", *FROZEN, "checkpoint.save_interval=1")
    train(tmp_path / "src", steps=1, overrides=bf16)
    train(tmp_path / "dst", steps=1, overrides=(*bf16, "training.seed=7", f"checkpoint.load={tmp_path / 'src'}",
                                                "checkpoint.load_optimizer=false"))
    with TorchDistReader(_latest(tmp_path / "src")) as src, TorchDistReader(_latest(tmp_path / "dst")) as dst:
        keys = [k for k in src.keys() if not k.startswith("optimizer") and not k.endswith("expert_bias")]
        assert keys and not [k for k in keys if not torch.equal(src.read(k), dst.read(k))]


GLM_TINY = ("model.num_layers=2",)


@pytest.mark.parametrize("change, says", [
    (("model.vocab_size=2048",), "model.vocab_size is 1024 in the checkpoint and 2048 now"),
    (("model.num_layers=3",), "model.num_layers is 2 in the checkpoint and 3 now"),
    (("model.num_layers=1", "model.first_k_dense=0"), "model.num_layers is 2 in the checkpoint and 1 now"),
    (("model.hidden_size=256",), "model.hidden_size is 128 in the checkpoint and 256 now"),
    (("mtp.num_layers=1",), "set checkpoint.load_optimizer=false"),
], ids=["vocab", "more-layers", "fewer-layers", "hidden", "optimizer"])
def test_a_load_that_changes_the_main_model_is_one_sentence_and_leaves_nothing(tmp_path, base, train, change, says):
    run = tmp_path / "run"
    proc = train(run, steps=1, check=False, overrides=(f"checkpoint.load={base}", *change))
    err = proc.stderr.strip().splitlines()
    assert proc.returncode != 0 and says in err[-1] and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert err[-1].startswith(f"megatron-mtp train: error: cannot start this run from checkpoint.load={base}")
    assert not run.exists()  # no lock, no checkpoints/: the next attempt starts as this one did


def test_a_load_of_another_family_is_one_sentence(tmp_path, base, train):
    proc = train(tmp_path / "glm", steps=1, check=False, config="glm4_moe_tiny_cpu",
                 overrides=(f"checkpoint.load={base}",))
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert "model.family is 'deepseek_v3' in the checkpoint and 'glm4_moe' now" in proc.stderr, proc.stderr[-2000:]


MTP_ONLY = ("mtp.num_layers=1", "mtp.freeze_base=true", "checkpoint.load_optimizer=false", "checkpoint.save_interval=1",
            "checkpoint.keep_last=3")
BY_NAME = ("checkpoint.optimizer_format=reshardable",)
"""The reshardable optimizer format keys its state by parameter name, which the optimizer checks read
(the resumed run keeps the default parallel format: it resumes as exactly)."""
TP2_PP2_EP2 = ("parallel.tensor=2", "parallel.pipeline=2", "parallel.expert=2")
HEADS = ("mtp.style=parallel", "mtp.num_layers=2", "mtp.init=copy_last_layer")
TRAINED = {"one": "mtp.", "eight": "mtp.", "heads": "mtp_heads."}
"""The prefix of the parameters each run trains."""


@pytest.fixture(scope="module")
def mtp_only(base, train, metrics):
    """MTP-only training on the model without MTP: 3 steps at one process; the same 2 steps at
    TP2×PP2×EP2; 2 steps then resumed to 3 at one process; and 3 steps of two parallel heads, each copied
    from the last decoder layer."""
    root = base.parent
    runs = {"one": root / "mtp_only_1", "eight": root / "mtp_only_8", "resumed": root / "mtp_only_resumed",
            "heads": root / "mtp_only_heads"}
    load = f"checkpoint.load={base}"
    train(runs["one"], steps=3, overrides=(*MTP_ONLY, *BY_NAME, load))
    train(runs["heads"], steps=3, overrides=(*MTP_ONLY, *BY_NAME, load, *HEADS))
    train(runs["eight"], nproc=8, steps=2, overrides=(*MTP_ONLY, *BY_NAME, load, *TP2_PP2_EP2))
    train(runs["resumed"], steps=2, overrides=(*MTP_ONLY, load))
    train(runs["resumed"], steps=3, overrides=(*MTP_ONLY, load))
    return runs, {name: metrics(run) for name, run in runs.items()}


def _steps(run):
    return sorted((run / "checkpoints").glob("step_*"))


@pytest.mark.parametrize("layout", ["one", "eight", "heads"])
def test_mtp_only_training_keeps_the_base_bitwise(mtp_only, base, layout):
    runs, _ = mtp_only
    steps = _steps(runs[layout])
    trained = TRAINED[layout]
    assert len(steps) == (2 if layout == "eight" else 3)
    with TorchDistReader(_latest(base)) as src:
        main_keys = [k for k in src.keys() if not k.startswith("optimizer")]
        assert any(k.endswith("expert_bias") for k in main_keys)  # router biases too
        for step in steps:
            with TorchDistReader(step) as got:
                changed = [k for k in main_keys if not torch.equal(src.read(k), got.read(k))]
                assert not changed, (step.name, changed[:5])
        with TorchDistReader(steps[0]) as first, TorchDistReader(steps[-1]) as last:
            mtp = [k for k in last.keys() if k.startswith(trained) and "layernorm" not in k]
            assert mtp and any(not torch.equal(first.read(k), last.read(k)) for k in mtp)  # the MTP part learns
            # its routers' expert biases keep their own update (only the base's are held as loaded)
            biases = [k for k in mtp if k.endswith("expert_bias")]
            assert biases and all(not torch.equal(first.read(k), last.read(k)) for k in biases), biases
            # the optimizer holds the MTP parameters alone
            params = {k.split(".", 3)[3] for k in last.keys() if k.startswith("optimizer.state.")}
            assert params and all(p.startswith(trained) for p in params), sorted(params)[:5]


def test_parallel_heads_on_a_frozen_base_start_from_the_last_layer_and_take_gradients(mtp_only, base):
    runs, logs = mtp_only
    lr = 3e-3  # configs/tiny_cpu.yaml, constant: one Adam step moves a weight by about lr
    with TorchDistReader(_latest(base)) as src, TorchDistReader(_steps(runs["heads"])[0]) as first:
        last = max(int(k.split(".")[2]) for k in src.keys() if k.startswith("decoder.layers."))
        for k in range(2):
            layer = [key for key in first.keys() if key.startswith(f"mtp_heads.layers.{k}.transformer_layer.")
                     and not key.endswith("expert_bias")]
            assert any("experts" in key for key in layer)
            for key in layer:
                twin = src.read(key.replace(f"mtp_heads.layers.{k}.transformer_layer.", f"decoder.layers.{last}."))
                assert (first.read(key) - twin).abs().max() <= 2 * lr, key  # drawn at random: ~0.02 apart
    # every step: both heads' losses, and a gradient of the heads alone (with the base's: about 1)
    rows = [r for r in logs["heads"] if "train/mtp_loss_2" in r]
    assert [r["step"] for r in rows] == [1, 2, 3] and all(0 < r["train/grad_norm"] < 0.1 for r in rows), rows


def test_mtp_only_losses_match_across_layouts_and_resume_exactly(mtp_only):
    _, logs = mtp_only
    rows = {name: {r["step"]: r for r in rows if "train/lm_loss" in r} for name, rows in logs.items()}
    for key in ("train/lm_loss", "train/mtp_loss_1"):
        # float32 reduction order before any update; after one, the MTP weights differ by as much
        for step, tolerance in ((1, 1e-5), (2, 1e-4)):
            assert abs(rows["eight"][step][key] - rows["one"][step][key]) < tolerance, (key, step)
        assert [rows["resumed"][s][key] for s in (1, 2, 3)] == [rows["one"][s][key] for s in (1, 2, 3)], key
    assert rows["one"][3]["train/mtp_loss_1"] < rows["one"][1]["train/mtp_loss_1"]


def test_eval_compare_shows_the_loaded_model_beside_the_trained_mtp(mtp_only, base):
    import json

    from tests.workers.pool import POOL

    runs, _ = mtp_only
    proc = POOL.run(["-m", "megatron_mtp", "eval", str(runs["one"]), "--compare", str(base), "--steps", "1",
                     "--json"], nproc=1, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    trained, loaded = json.loads(proc.stdout.strip().splitlines()[-1])["checkpoints"]
    assert trained["tokens"] == loaded["tokens"] > 0
    assert trained["lm_loss"] == loaded["lm_loss"]  # the same main model, bit for bit
    assert len(trained["mtp_acceptance"]) == 1 and loaded["mtp_acceptance"] == []  # the base had no MTP module


@pytest.mark.parametrize("config", ["qwen3_moe_tiny_cpu"])
def test_gqa_model_gets_mtp_trained_alone_on_its_frozen_base(tmp_path, train, metrics, config):
    """The same for the grouped-query families (run for Qwen3-MoE, whose releases ship no MTP; GLM-4.5's
    attention is the same code): a model without MTP gets a module copied from its last layer, trained
    alone against the main model's own predictions (targets self), its global batch growing by a ramp-up;
    its main weights stay bitwise, the optimizer holds the MTP parameters alone, the module learns."""
    base = tmp_path / "base"
    train(base, steps=1, config=config, overrides=("mtp.num_layers=0", *FROZEN, "checkpoint.save_interval=1"))
    run = tmp_path / "mtp_only"
    train(run, steps=3, config=config,
          # checkpoint.load_optimizer left at its default: a frozen base never takes the source's optimizer
          overrides=(*(o for o in MTP_ONLY if not o.startswith("checkpoint.load_optimizer")), *BY_NAME,
                     f"checkpoint.load={base}", "mtp.init=copy_last_layer", "mtp.targets=self",
                     # with a batch-size ramp: every step builds its frozen-base forward for its own micro-batches
                     "training.rampup_batch_size=[4,2,12]"))
    with TorchDistReader(_latest(base)) as src, TorchDistReader(_latest(run)) as got:
        main_keys = [k for k in src.keys() if not k.startswith("optimizer")]
        assert any("linear_qkv" in k for k in main_keys)
        changed = [k for k in main_keys if not torch.equal(src.read(k), got.read(k))]
        assert not changed, changed[:5]
        params = {k.split(".", 3)[3] for k in got.keys() if k.startswith("optimizer.state.")}
        assert params and all(p.startswith("mtp.") for p in params), sorted(params)[:5]
    losses = [r["train/mtp_loss_1"] for r in metrics(run) if "train/mtp_loss_1" in r]
    assert len(losses) == 3 and losses[-1] < losses[0]
    sizes = [r["train/global_batch_size"] for r in metrics(run) if "train/global_batch_size" in r]
    assert sizes[0] == 4 and sizes == sorted(sizes) and sizes[-1] > 4, sizes  # the ramp grew the batch
