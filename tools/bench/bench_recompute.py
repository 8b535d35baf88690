"""Activation recomputation: bytes kept for backward and step time per mode, against no recompute.

For each mode the same model (the benchmark size, MTP D=1) is built in one process. Saved bytes are
measured over one micro-batch's forward with torch.autograd.graph.saved_tensors_hooks, each storage
counted once (the parameters, which are saved too, are left out). Step time is the real trainer
step, measured in alternating rounds. The predicted step ratio is 1 + (forward FLOPs recomputed in
backward) / (forward + backward FLOPs), from the modules each mode recomputes.

    .venv/bin/python tools/bench/bench_recompute.py [--hidden 512 --layers 4 --seq 512 ...]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

MODES = {
    "none": [],
    "selective mla_up_proj,mlp": ["recompute.granularity=selective", "recompute.modules=[mla_up_proj,mlp]"],
    "selective +moe,layernorm": ["recompute.granularity=selective",
                                 "recompute.modules=[mla_up_proj,mlp,moe,layernorm]"],
    "selective core_attn": ["recompute.granularity=selective", "recompute.modules=[core_attn]"],
    "full uniform": ["recompute.granularity=full", "recompute.method=uniform", "recompute.num_layers=1"],
}


def recomputed_flops_per_token(cfg, modules: set[str], full: bool) -> float:
    """Forward FLOPs per token that the mode runs again in backward (decoder and MTP layers)."""
    from megatron_mtp.models.deepseek_v3.sizes import layer_sizes

    m, s = cfg.model, layer_sizes(cfg)
    seq, n = cfg.training.seq_length, m.num_attention_heads
    qk = m.qk_head_dim + m.qk_pos_emb_head_dim
    up = (m.q_lora_rank or 0) * n * qk + m.kv_lora_rank * n * (m.qk_head_dim + m.v_head_dim)
    scores = 2 * n * (qk + m.v_head_dim) * seq / 2
    moe_layers = (m.num_layers - m.first_k_dense) + cfg.mtp.num_layers
    dense_layers = m.first_k_dense
    all_layers = m.num_layers + cfg.mtp.num_layers
    if full:
        return dense_layers * (2 * (s.attention + s.dense_mlp) + scores) + \
            moe_layers * (2 * (s.attention + s.moe_active) + scores)
    shared = 3 * m.hidden_size * m.moe_ffn_hidden_size * m.num_shared_experts
    flops = 0.0
    flops += all_layers * 2 * up if "mla_up_proj" in modules else 0
    flops += all_layers * scores if "core_attn" in modules else 0
    flops += dense_layers * 2 * s.dense_mlp if "mlp" in modules else 0
    flops += moe_layers * 2 * s.moe_active if "moe" in modules else 0
    flops += moe_layers * 2 * shared if "shared_experts" in modules and "moe" not in modules else 0
    return flops


def saved_bytes(trainer, batch) -> int:
    import torch
    from _train_bench import after_unscheduled_backward

    from megatron_mtp.training.components import unwrap

    gpt = unwrap(trainer.components.model[0])
    params = {p.untyped_storage().data_ptr() for p in gpt.parameters()}
    seen: dict[int, int] = {}

    def pack(t):
        storage = t.untyped_storage()
        if storage.data_ptr() not in params:
            seen[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = gpt(batch["tokens"], batch["position_ids"], None, labels=batch["labels"], loss_mask=batch["loss_mask"])
    out.sum().backward()
    for chunk in trainer.components.model:
        chunk.zero_grad_buffer()
    after_unscheduled_backward()
    return sum(seen.values())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    from _train_bench import model_arguments

    model_arguments(ap)
    args = ap.parse_args()

    import torch
    from _train_bench import RandomTokens, interleaved, scratch_dir, single_process_setup, trainer_step
    from megatron.core.transformer.moe.moe_utils import get_moe_layer_wise_logging_tracker

    from megatron_mtp.config import load_config
    from megatron_mtp.models.deepseek_v3.sizes import training_flops_per_token
    from megatron_mtp.training.batches import MicroBatchIterator
    from megatron_mtp.training.distributed import destroy

    base, plat, vocab = single_process_setup(args)
    data_set = RandomTokens(vocab, args.seq)
    steps, memory, predicted = {}, {}, {}
    run_dir = scratch_dir("bench_recompute_")
    for name, overrides in MODES.items():
        cfg = load_config(args.config, [*base_overrides(base), *overrides])
        torch.manual_seed(0)
        trainer, steps[name] = trainer_step(cfg, plat, vocab, data_set, run_dir / name.replace(" ", "_"))
        memory[name] = saved_bytes(trainer, next(MicroBatchIterator(data_set, 0, args.micro_batch, 0, 1)))
        get_moe_layer_wise_logging_tracker().clear()
        r = cfg.recompute
        extra = recomputed_flops_per_token(cfg, set(r.modules) if r.granularity == "selective" else set(),
                                           r.granularity == "full") if r.granularity != "none" else 0.0
        predicted[name] = 1 + extra / training_flops_per_token(cfg, vocab, cfg.mtp.num_layers)
    times = interleaved(steps, rounds=args.rounds, steps_per_round=args.steps_per_round)
    print(f"model: hidden {args.hidden}, layers {args.layers}, seq {args.seq}, vocab {vocab}, micro batch "
          f"{args.micro_batch}, MTP D={base.mtp.num_layers}, device {plat.device}, threads {torch.get_num_threads()}")
    print(f"{'mode':28s} {'saved MiB':>10s} {'vs none':>8s} {'step ms':>9s} {'step ratio':>11s} {'predicted':>10s}")
    for name in MODES:
        print(f"{name:28s} {memory[name] / 2**20:10.1f} {memory[name] / memory['none']:8.3f} "
              f"{times[name] * 1e3:9.1f} {times[name] / times['none']:11.3f} {predicted[name]:10.3f}")
    destroy()


def base_overrides(cfg) -> list[str]:
    """The benchmark size as overrides (so each mode is built from the same YAML and sizes)."""
    m, t = cfg.model, cfg.training
    return [f"model.hidden_size={m.hidden_size}", f"model.num_layers={m.num_layers}",
            f"model.ffn_hidden_size={m.ffn_hidden_size}", f"model.moe_ffn_hidden_size={m.moe_ffn_hidden_size}",
            f"model.vocab_size={m.vocab_size}", f"training.seq_length={t.seq_length}",
            f"training.micro_batch_size={t.micro_batch_size}", f"training.global_batch_size={t.global_batch_size}",
            "logging.tensorboard=false"]


if __name__ == "__main__":
    main()
