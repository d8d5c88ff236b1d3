"""The worker's own tensors stay what they were: a candidate that writes outside its outputs is caught.

A kernel receives raw pointers and can write anywhere in the process's device memory. The reference's
weights (what every check is measured against) and the candidate model's weights (what the next
candidate is packed from) are compared with what they were when the worker started.

The comparison is a keyed fingerprint computed where the weights are: each weight's 32-bit words dotted
with pseudo-random coefficients, summed modulo 2^64. Each check uses a key of its own, drawn from the OS
at start-up and kept in host memory; every fingerprint a worker will compare against is taken at start-up,
and the device buffers that held coefficients are zeroed before they are freed, so no key a later check
uses is ever readable on the device. A change to any word then escapes with probability about 2^-31.
A worker that has used its keys is retired (CHECKS evaluations). Copying the weights (gigabytes for the
full Kimi task) to host memory after every candidate, as this guard first did, cost ~2.5 s per evaluation.
"""

from __future__ import annotations

import secrets

import torch

CHECKS = 128            # keys per worker: the checks it can make before it must be replaced
CHUNK_WORDS = 1 << 25   # coefficients are made per chunk (256 MiB of int64 at a time)


class GuardExhausted(RuntimeError):
    """Every key has been used: the worker must be replaced before it evaluates another candidate."""


class WeightGuard:
    """The keys and the pristine fingerprints live in host memory, where no kernel can reach them."""

    def __init__(self, reference: torch.nn.Module, checks: int = CHECKS):
        self._keys = [secrets.randbits(63) for _ in range(checks)]
        self._pristine = {name: [_fingerprint(value, key) for key in self._keys]
                          for name, value in reference.state_dict().items()}
        self._used = 0

    @property
    def remaining(self) -> int:
        """Checks left before the worker must be replaced."""
        return len(self._keys) - self._used

    def changed(self, **models: torch.nn.Module) -> list[str]:
        """'model: weight' for every weight of the named models whose fingerprint is not its pristine one,
        under a key no earlier check used."""
        if self._used >= len(self._keys):
            raise GuardExhausted(f"all {len(self._keys)} integrity keys are used")
        index, self._used = self._used, self._used + 1
        out = []
        for label, model in models.items():
            for name, value in model.state_dict().items():
                want = self._pristine.get(name)
                if want is not None and _fingerprint(value, self._keys[index]) != want[index]:
                    out.append(f"{label}: {name}")
        return out


def _fingerprint(tensor: torch.Tensor, key: int) -> tuple:
    """(shape, dtype, Σ coefficient_i · word_i mod 2^64), the coefficients drawn from `key`; the words are
    32-bit where the tensor's bytes allow it, bytes otherwise."""
    flat = tensor.detach().contiguous().view(-1).view(torch.uint8)
    whole_words = flat.numel() % 4 == 0 and flat.data_ptr() % 4 == 0
    words = flat.view(torch.int32) if whole_words else flat
    generator = torch.Generator(device=words.device)
    generator.manual_seed(key)
    total = torch.zeros((), dtype=torch.int64, device=words.device)
    for start in range(0, words.numel(), CHUNK_WORDS):
        part = words[start:start + CHUNK_WORDS]
        products = torch.randint(1, 2**31, part.shape, generator=generator, dtype=torch.int64, device=words.device)
        products.mul_(part)
        total += products.sum()
        products.zero_()   # freed memory keeps no trace of the key
    return tuple(tensor.shape), tensor.dtype, int(total)
