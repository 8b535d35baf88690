"""Compare megatron-core's gradient with the hand-computed objective lm + (λ/D)·Σ_d CE_d.

CE_d is to the data token, or with mtp.targets=self|mix to the main model's detached distribution at
the position d ahead (softmax(logits / mtp.self_temperature)), or the mix of both; with
mtp.freeze_base the gradient taken is the one the trainer takes, of the MTP objective the model keeps.
Runs at any tensor-parallel size: the captured logits are gathered over the vocabulary first.

Run as a script (one process; arguments after the config are overrides, e.g. mtp.style=parallel);
prints one JSON line with the largest relative gradient error for each λ tried (and the main loss's
relative error). The objective is
rebuilt from the captured logits in float64 with torch's own cross entropy, so it shares nothing
with megatron-core's loss path but the logits. The hand path runs its own forward with megatron's
MTP scale set to 0 (and with the whole logits, which the chunked output loss never makes):
MTPLossAutoScaler injects the MTP gradient whenever anything backpropagates
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

    def capture(module, inputs, output):
        from megatron.core.tensor_parallel import gather_from_tensor_model_parallel_region

        captured.append(gather_from_tensor_model_parallel_region(output[0].clone()))

    gpt.output_layer.register_forward_hook(capture)
    mtp = cfg.mtp
    results = {}
    for lam in (0.3, 0.1):
        # megatron-core's path: the MTP terms enter through MTPLossAutoScaler in backward
        comp.config.mtp_loss_scaling_factor = lam  # what the λ schedule updates between steps
        out = gpt(tokens, pos, None, labels=labels, loss_mask=mask)
        lm = (out * mask).sum() / mask.sum()
        taken = gpt.mtp_objective if mtp.freeze_base else lm  # frozen: what the trainer back-propagates
        grads_megatron = torch.autograd.grad(taken, params, allow_unused=True)
        # the hand path: a fresh forward with megatron's MTP scale at 0, objective from the logits (with
        # parallel heads in Gloeckle's order, their graphs must be kept for it: heads all at once here)
        comp.config.mtp_loss_scaling_factor = 0.0
        captured.clear()
        head_by_head = getattr(gpt, "head_by_head_backward", False)
        chunk = getattr(gpt, "output_chunk", None)  # kernels.chunked_output_loss: the hand path needs the logits
        gpt.head_by_head_backward, gpt.output_chunk = False, None
        gpt(tokens, pos, None, labels=labels, loss_mask=mask)
        gpt.head_by_head_backward, gpt.output_chunk = head_by_head, chunk

        def ce(logits_sbv, target_bs, valid_bs):
            logp = F.log_softmax(logits_sbv.double().transpose(0, 1), dim=-1)  # [b, s, V]
            nll = -logp.gather(-1, target_bs.unsqueeze(-1)).squeeze(-1)
            return (nll * valid_bs).sum() / valid_bs.sum()

        def soft_ce(logits_sbv, teacher_sbv, valid_bs):
            logq = F.log_softmax(logits_sbv.double().transpose(0, 1), dim=-1)
            p = F.softmax(teacher_sbv.detach().double().transpose(0, 1) / mtp.self_temperature, dim=-1)
            return (-(p * logq).sum(-1) * valid_bs).sum() / valid_bs.sum()

        main = captured[depth]
        objective = 0.0 if mtp.freeze_base else ce(main, labels, mask.double())
        for k in range(1, depth + 1):
            target = torch.roll(labels, -k, 1)
            valid = torch.zeros_like(mask, dtype=torch.float64)
            valid[:, : s - k] = mask[:, k:].double()
            if cfg.data.eod_mask_loss:  # a zero of the mask is an EOD: depth k at i also needs i .. i+k-1
                for j in range(k):
                    valid[:, : s - k] *= mask[:, j: s - k + j].double()
            by_tokens = ce(captured[k - 1], target, valid)
            by_self = soft_ce(captured[k - 1], torch.roll(main, -k, 0), valid)
            term = {"tokens": by_tokens, "self": by_self,
                    "mix": (1 - mtp.self_weight) * by_tokens + mtp.self_weight * by_self}[mtp.targets]
            objective = objective + (lam / depth) * term
        grads_hand = torch.autograd.grad(objective, params, allow_unused=True)
        worst = 0.0
        for gm, gh in zip(grads_megatron, grads_hand):
            if gm is None and gh is None:
                continue
            gm = torch.zeros_like(gh) if gm is None else gm
            gh = torch.zeros_like(gm) if gh is None else gh
            worst = max(worst, float((gm.double() - gh).abs().max() / (gh.abs().max() + 1e-12)))
        main_ce = ce(main, labels, mask.double())
        results[str(lam)] = {"max_rel_err": worst, "lm": float(lm), "objective": float(objective),
                             "lm_rel_err": float(abs(lm.double() - main_ce) / main_ce),
                             "trainable": sum(p.numel() for p in params)}
    if torch.distributed.get_rank() == 0:
        print(json.dumps(results))
    destroy()


if __name__ == "__main__":
    main()
