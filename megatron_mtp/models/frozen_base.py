"""A GPTModel whose main model is frozen (mtp.freeze_base): only its MTP part trains.

Design note. The whole forward runs under torch.no_grad(); the model's ``_postprocess`` turns gradients
back on for its MTP part alone (sequential modules: models/mtp_objective.py; parallel heads:
mtp_styles/parallel/model.py; an assistant: models/gemma4/assistant/model.py), whose input hidden
states are therefore detached. Autograd records nothing of the main model (no saved activations; its
routers neither count tokens for their bias update nor make aux losses: both only happen with grad
enabled), and the embedding and output head are frozen parameters. The MTP part's objective of the
micro-batch is kept in ``mtp_objective``; the trainer runs the schedule forward-only and back-propagates
it from the loss function (training/forward_step.py), so stages without an MTP part do no backward.
"""

from __future__ import annotations

import torch


class FrozenBase:
    """Mixed in before GPTModel: ``freeze`` the parameters outside the MTP part, run the forward without
    gradients, and say in ``_postprocess`` whether the MTP part takes them (``grad_for_mtp``)."""

    freeze_base: bool = False
    _grad_outside: bool = False
    mtp_objective = None
    """This micro-batch's MTP objective while training a frozen base (back-propagated by the trainer)."""

    def freeze(self, trained: tuple[str, ...]) -> None:
        """Freeze every parameter whose name does not start with one of ``trained``."""
        self.freeze_base = True
        for name, param in self.named_parameters():
            param.requires_grad_(name.startswith(trained))

    def forward(self, *args, **kwargs):
        if not self.freeze_base:
            return super().forward(*args, **kwargs)
        self._grad_outside = torch.is_grad_enabled()  # training (the MTP part takes gradients) or not
        with torch.no_grad():
            return super().forward(*args, **kwargs)

    @property
    def grad_for_mtp(self) -> bool:
        """A frozen base's training forward, inside which the MTP part takes gradients."""
        return self.freeze_base and self.training and self._grad_outside

    def keep_objective(self, terms) -> None:
        """Keep Σ ``terms`` (each depth's or head's or step's per-token term) as this micro-batch's MTP objective
        for the trainer's backward; None outside a training forward. The sum is taken with gradients on: the
        forward around it runs without them."""
        with torch.set_grad_enabled(self.grad_for_mtp):
            self.mtp_objective = sum(t.sum() for t in terms) if self.grad_for_mtp else None
