"""Compare megatron-core's gradient with the hand-computed objective lm + (λ/D)·Σ_d CE_d.

Run as a script (one process; arguments after the config are overrides, e.g. mtp.style=parallel);
prints one JSON line with the largest relative gradient error for each λ tried. The objective is
rebuilt from the captured logits in float64 with torch's own cross entropy, so it shares nothing
with megatron-core's loss path but the logits. The hand path runs its own forward with megatron's
MTP scale set to 0: MTPLossAutoScaler injects the MTP gradient whenever anything backpropagates
through the main hidden states, and would otherwise add to it.
"""

import json
import sys

import torch
import torch.nn.functional as F


def main():
    from megatron_mtp.config import load_config
    from megatron_mtp.config.vocab import padded_vocab_size
    from megatron_mtp.platform import setup
    from megatron_mtp.training.components import build_components, unwrap
    from megatron_mtp.training.distributed import destroy, init_distributed

    depth = int(sys.argv[1])
    cfg = load_config(sys.argv[2], ["model.vocab_size=200", "model.aux_loss_coeff=0", f"mtp.num_layers={depth}",
                                    "model.num_layers=2", "training.seq_length=16", *sys.argv[3:]])
    plat = setup("cpu")
    init_distributed(cfg, plat)
    comp = build_components(cfg, plat, padded_vocab_size(200, cfg), with_optimizer=False)
    gpt = unwrap(comp.model[0])
    params = [p for p in gpt.parameters() if p.requires_grad]
    g = torch.Generator().manual_seed(0)
    b, s = 3, 16
    tokens = torch.randint(0, 200, (b, s), generator=g)
    labels = torch.roll(tokens, -1, 1)
    mask = (torch.rand(b, s, generator=g) > 0.15).float()
    pos = torch.arange(s).expand(b, s)
    captured = []
    gpt.output_layer.register_forward_hook(lambda m, i, o: captured.append(o[0].clone()))
    results = {}
    for lam in (0.3, 0.1):
        # megatron-core's path: the MTP terms enter through MTPLossAutoScaler in backward
        comp.config.mtp_loss_scaling_factor = lam  # what the λ schedule updates between steps
        out = gpt(tokens, pos, None, labels=labels, loss_mask=mask)
        lm = (out * mask).sum() / mask.sum()
        grads_megatron = torch.autograd.grad(lm, params, allow_unused=True)
        # the hand path: a fresh forward with megatron's MTP scale at 0, objective from the logits (with
        # parallel heads in Gloeckle's order, their graphs must be kept for it: heads all at once here)
        comp.config.mtp_loss_scaling_factor = 0.0
        captured.clear()
        head_by_head = getattr(gpt, "head_by_head_backward", False)
        gpt.head_by_head_backward = False
        gpt(tokens, pos, None, labels=labels, loss_mask=mask)
        gpt.head_by_head_backward = head_by_head

        def ce(logits_sbv, target_bs, valid_bs):
            logp = F.log_softmax(logits_sbv.double().transpose(0, 1), dim=-1)  # [b, s, V]
            nll = -logp.gather(-1, target_bs.unsqueeze(-1)).squeeze(-1)
            return (nll * valid_bs).sum() / valid_bs.sum()

        objective = ce(captured[depth], labels, mask.double())
        for k in range(1, depth + 1):
            target = torch.roll(labels, -k, 1)
            valid = torch.zeros_like(mask, dtype=torch.float64)
            valid[:, : s - k] = mask[:, k:].double()
            objective = objective + (lam / depth) * ce(captured[k - 1], target, valid)
        grads_hand = torch.autograd.grad(objective, params, allow_unused=True)
        worst = 0.0
        for gm, gh in zip(grads_megatron, grads_hand):
            if gm is None and gh is None:
                continue
            gm = torch.zeros_like(gh) if gm is None else gm
            gh = torch.zeros_like(gm) if gh is None else gh
            worst = max(worst, float((gm.double() - gh).abs().max() / (gh.abs().max() + 1e-12)))
        results[str(lam)] = {"max_rel_err": worst, "lm": float(lm), "objective": float(objective)}
    print(json.dumps(results))
    destroy()


if __name__ == "__main__":
    main()
