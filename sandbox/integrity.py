"""The worker's own tensors stay what they were: a candidate that writes outside its outputs is caught.

A kernel receives raw pointers and can write anywhere in the process's device memory. The reference's
weights (what every check is measured against) and the candidate model's weights (what the next
candidate is packed from) are compared bit for bit with copies taken when the worker started.
"""

from __future__ import annotations

import torch


class WeightGuard:
    """The pristine copies live in host memory, where no kernel can reach them."""

    def __init__(self, reference: torch.nn.Module):
        self._pristine = {k: v.detach().cpu().clone() for k, v in reference.state_dict().items()}

    def changed(self, **models: torch.nn.Module) -> list[str]:
        """'model: weight' for every weight of the named models that differs from its pristine copy."""
        out = []
        for label, model in models.items():
            for name, value in model.state_dict().items():
                want = self._pristine.get(name)
                if want is not None and not torch.equal(value.detach().cpu(), want):
                    out.append(f"{label}: {name}")
        return out
