"""Gradients with each activation-recompute setting against no recompute, in one process.

Builds the default model (MTP depth 2, so both MTP layers are recomputed too) once per setting (a
JSON object of name -> overrides, the second argument; the first is the config) from the same seed,
runs forward and backward on one batch, and prints one JSON line: for each setting the largest
relative gradient difference over all parameters, the LM loss difference, and how many forward calls
each recomputed module type made (to show the recompute really happened).
"""

import json
import sys

import torch


def main():
    from megatron.core.transformer.moe.moe_utils import clear_aux_losses_tracker

    from megatron_mtp.config import load_config
    from megatron_mtp.config.vocab import padded_vocab_size
    from megatron_mtp.platform import setup
    from megatron_mtp.training.components import build_components, unwrap
    from megatron_mtp.training.distributed import destroy, init_distributed

    base = ["model.vocab_size=200", "mtp.num_layers=2", "model.num_layers=3", "training.seq_length=16"]
    cfg = load_config(sys.argv[1], base)
    plat = setup("cpu")
    init_distributed(cfg, plat)
    g = torch.Generator().manual_seed(0)
    b, s = 2, 16
    tokens = torch.randint(0, 200, (b, s), generator=g)
    labels = torch.roll(tokens, -1, 1)
    mask = torch.ones(b, s)
    pos = torch.arange(s).expand(b, s)
    reference, results = None, {}
    for name, overrides in json.loads(sys.argv[2]).items():
        cfg = load_config(sys.argv[1], base + overrides)
        torch.manual_seed(1234)
        comp = build_components(cfg, plat, padded_vocab_size(200, cfg), with_optimizer=False)
        gpt = unwrap(comp.model[0])
        comp.config.mtp_loss_scaling_factor = 0.3
        calls = {}
        for module in gpt.modules():
            kind = type(module).__name__
            module.register_forward_hook(
                lambda m, i, o, kind=kind, calls=calls: calls.__setitem__(kind, calls.get(kind, 0) + 1))
        out = gpt(tokens, pos, None, labels=labels, loss_mask=mask)
        loss = (out * mask).sum() / mask.sum()
        loss.backward()  # megatron-core's DDP hooks accumulate every gradient into param.main_grad
        grads = [p.main_grad.clone() for p in gpt.parameters() if p.requires_grad]
        clear_aux_losses_tracker()
        if reference is None:
            reference = (float(loss), grads, calls)
        worst = max(float((a - r).abs().max() / (r.abs().max() + 1e-12)) for a, r in zip(grads, reference[1]))
        results[name] = {"max_rel_grad_diff": worst, "loss_diff": abs(float(loss) - reference[0]),
                         "extra_calls": {k: v - reference[2].get(k, 0) for k, v in calls.items()
                                         if v != reference[2].get(k, 0)}}
    print(json.dumps(results))
    destroy()


if __name__ == "__main__":
    main()
