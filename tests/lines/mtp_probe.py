"""One forward and backward of the tiny model on a fixed batch, on whichever megatron-core line runs
this script: what tests/lines compares between the lines.

Usage: mtp_probe.py CONFIG OUT.pt [overrides...]. Writes a dict: the LM loss, each depth's MTP loss
(megatron-core's tracker, read through platform/megatron_core.py), our teacher-forced acceptance and
accuracy per depth (training/metrics.py), megatron-core 0.19's own per-depth counts where it has
them, and the gradient of every MTP parameter (by checkpoint key, so both lines name them alike).
"""

import sys

import torch


def main():
    from megatron_mtp.config import load_config
    from megatron_mtp.config.vocab import padded_vocab_size
    from megatron_mtp.platform import megatron_core, setup
    from megatron_mtp.training.components import build_components, unwrap
    from megatron_mtp.training.distributed import destroy, init_distributed
    from megatron_mtp.training.metrics import MTPMetrics

    cfg = load_config(sys.argv[1], ["model.vocab_size=256", "model.num_layers=2", "training.seq_length=32",
                                    *sys.argv[3:]])
    plat = setup("cpu")
    init_distributed(cfg, plat)
    comp = build_components(cfg, plat, padded_vocab_size(256, cfg), with_optimizer=False)
    gpt = unwrap(comp.model[0])
    gpt.train()
    depth = cfg.mtp.num_layers
    metrics = MTPMetrics(depth, None)
    gpt.output_layer.register_forward_hook(metrics.output_hook)
    g = torch.Generator().manual_seed(0)
    b, s = 4, cfg.training.seq_length
    tokens = torch.randint(0, 256, (b, s), generator=g)
    labels = torch.roll(tokens, -1, 1)
    mask = (torch.rand(b, s, generator=g) > 0.1).float()
    pos = torch.arange(s).expand(b, s)
    metrics.start_microbatch(labels, mask)
    out = gpt(tokens, pos, None, labels=labels, loss_mask=mask)
    lm = (out * mask).sum() / mask.sum()
    taken = gpt.mtp_objective if cfg.mtp.freeze_base else lm
    taken.backward()
    grads = {}
    for name, param in gpt.named_parameters():
        grad = getattr(param, "main_grad", None)  # megatron-core's DDP accumulates here
        if name.startswith("mtp.") and grad is not None:
            grads[name.replace(f".{megatron_core.MTP_LAYER_ATTR}.", ".transformer_layer.")] = grad.detach().clone()
    judged = metrics.sums["judged"]
    counts = megatron_core.mtp_acceptance_counts()
    result = {
        "line": megatron_core.line(),
        "lm_loss": float(lm.detach()),
        "mtp_loss": megatron_core.mtp_loss_values().detach().double().clone(),
        "acceptance": metrics.sums["accepted"] / judged,
        "accuracy": metrics.sums["correct"] / judged,
        "core_counts": None if counts is None else (counts[0].double().clone(), counts[1].double().clone()),
        "mtp_grads": grads,
    }
    torch.save(result, sys.argv[2])
    destroy()


if __name__ == "__main__":
    main()
