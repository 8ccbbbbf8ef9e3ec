"""A fast, position-sensitive checksum of a byte buffer, in torch ops (CPU or CUDA, no host sync).

The buffer is read as little-endian 64-bit words ``x_i`` (a zero-padded tail word for the last
``n % 8`` bytes). With odd per-position weights ``w_i`` (a fixed pseudo-random table of ``CHUNK``
entries) and odd per-chunk multipliers ``m_j``, everything modulo 2**64:

    checksum = sum_j m_j * (sum_i w_i * x_{j*CHUNK+i})  +  m_tail * tail  +  K * n

* A change of one word by ``d != 0`` changes the sum by ``d * w_i * m_j``; an odd factor cannot turn a
  non-zero ``d`` into 0 modulo 2**64, so **every change confined to one 8-byte word is detected**
  (any byte flip, any bit flip).
* Swapping two different words (or blocks) changes the sum by ``(x_a - x_b) * (w_a m_a - w_b m_b)``:
  non-zero unless the pseudo-random weights collide, so swaps are detected with overwhelming probability.
* The length is mixed in, so trailing zero bytes are not invisible.

Integer sums are exact, so CPU and CUDA agree bit for bit. Input: a 1-D contiguous uint8 tensor whose
address is 8-byte aligned (``pack.py`` aligns every region); unaligned input is copied first.
"""

from __future__ import annotations

import torch

CHUNK = 1 << 18  # words per inner block (2 MiB of data; bounds the temporary)
_MASK64 = (1 << 64) - 1
_K_LEN = 0x9E3779B97F4A7C15


def _splitmix(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def _signed(x: int) -> int:
    x &= _MASK64
    return x - (1 << 64) if x >= 1 << 63 else x


_tables: dict[tuple[str, int], tuple[torch.Tensor, torch.Tensor]] = {}
_MAX_CHUNKS = 1 << 14  # 32 GiB per buffer at CHUNK words per chunk


def _weights(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    key = (device.type, device.index if device.index is not None else -1)
    tab = _tables.get(key)
    if tab is None:
        # Vectorised splitmix over positions (int64 arithmetic wraps modulo 2**64).
        def mix(seed: int, n: int) -> torch.Tensor:
            x = torch.arange(n, dtype=torch.int64) * _signed(0x9E3779B97F4A7C15) + _signed(_splitmix(seed))
            for shift, mul in ((30, 0xBF58476D1CE4E5B9), (27, 0x94D049BB133111EB)):
                x = x ^ ((x >> shift) & ((1 << (64 - shift)) - 1))
                x = x * _signed(mul)
            x = x ^ ((x >> 31) & ((1 << 33) - 1))
            return x | 1

        tab = (mix(1, CHUNK).to(device), mix(2, _MAX_CHUNKS + 1).to(device))
        _tables[key] = tab
    return tab


def checksum(buf: torch.Tensor) -> torch.Tensor:
    """Checksum of a 1-D uint8 tensor, as a 0-d int64 tensor on the same device (no host sync)."""
    if buf.dtype != torch.uint8 or buf.dim() != 1:
        raise ValueError(f"checksum wants a 1-D uint8 tensor, got {buf.dtype} {tuple(buf.shape)}")
    if not buf.is_contiguous() or buf.data_ptr() % 8:
        buf = buf.clone()  # fresh allocations are aligned
    n = buf.numel()
    w, m = _weights(buf.device)
    nwords = n // 8
    nchunks = -(-nwords // CHUNK)
    if nchunks > _MAX_CHUNKS:
        raise ValueError(f"buffer of {n} bytes is larger than the checksum supports")
    words = buf[: nwords * 8].view(torch.int64)
    if nwords <= CHUNK:  # one chunk (most regions): the same sum in three ops
        total = torch.mul(words, w[:nwords]).sum() * m[0] if nwords else torch.zeros((), dtype=torch.int64, device=buf.device)
        total = total + _signed(_K_LEN * n)
    else:
        total = torch.full((), _signed(_K_LEN * n), dtype=torch.int64, device=buf.device)
        sums = []
        tmp = torch.empty(CHUNK, dtype=torch.int64, device=buf.device)
        for j in range(nchunks):
            part = words[j * CHUNK : (j + 1) * CHUNK]
            k = part.numel()
            out = tmp[:k]
            torch.mul(part, w[:k], out=out)
            sums.append(out.sum())
        total = total + (torch.stack(sums) * m[:nchunks]).sum()
    tail = n - nwords * 8
    if tail:
        shifts = torch.arange(tail, dtype=torch.int64, device=buf.device) * 8
        word = (buf[nwords * 8 :].to(torch.int64) << shifts).sum()
        total = total + word * m[_MAX_CHUNKS]
    return total


def checksums(segments: list[torch.Tensor]) -> torch.Tensor:
    """Checksums of several buffers as a 1-D int64 tensor (empty input -> empty tensor)."""
    if not segments:
        return torch.empty(0, dtype=torch.int64)
    return torch.stack([checksum(s) for s in segments])
