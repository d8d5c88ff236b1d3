"""The worker's own tensors stay what they were: a candidate that writes outside its outputs is caught.

A kernel receives raw pointers and can write anywhere in the process's device memory. The reference's
weights (what every check is measured against) and the candidate model's weights (what the next
candidate is packed from) are compared with what they were when the worker started.

The comparison is a keyed fingerprint computed where the weights are: each weight's 32-bit words dotted
with pseudo-random coefficients, summed modulo 2^64. The coefficients come from a generator whose seed
(drawn from the OS at start-up) lives only in host memory, and they exist on the device only while a
check runs, after the candidate's kernel has finished; a change to any word escapes with probability
about 2^-31. Copying the weights (gigabytes for the full Kimi task) to host memory after every
candidate, as this guard first did, cost ~2.5 s per evaluation.
"""

from __future__ import annotations

import secrets

import torch

CHUNK_WORDS = 1 << 26   # coefficients are made per chunk: 512 MiB of int64 at most at a time


class WeightGuard:
    """The secret seed and the pristine fingerprints live in host memory, where no kernel can reach them."""

    def __init__(self, reference: torch.nn.Module):
        self._seed = secrets.randbits(63)
        self._pristine = {name: self._fingerprint(value) for name, value in reference.state_dict().items()}

    def changed(self, **models: torch.nn.Module) -> list[str]:
        """'model: weight' for every weight of the named models whose fingerprint is not its pristine one."""
        out = []
        for label, model in models.items():
            for name, value in model.state_dict().items():
                want = self._pristine.get(name)
                if want is not None and self._fingerprint(value) != want:
                    out.append(f"{label}: {name}")
        return out

    def _fingerprint(self, tensor: torch.Tensor) -> tuple:
        """(shape, dtype, Σ coefficient_i · word_i mod 2^64): the same coefficients for every call."""
        flat = tensor.detach().contiguous().view(-1).view(torch.uint8)
        words = flat.view(torch.int32) if flat.numel() % 4 == 0 else flat
        generator = torch.Generator(device=words.device)
        generator.manual_seed(self._seed)
        total = torch.zeros((), dtype=torch.int64, device=words.device)
        for start in range(0, words.numel(), CHUNK_WORDS):
            chunk = words[start:start + CHUNK_WORDS].to(torch.int64)
            coefficients = torch.randint(1, 2**31, chunk.shape, generator=generator, dtype=torch.int64,
                                         device=words.device)
            total += (chunk * coefficients).sum()
        return tuple(tensor.shape), tensor.dtype, int(total)
