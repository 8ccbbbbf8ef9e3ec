"""The run's store: who can reach it, where the run's keys live, and which records the ranks believe.

* Reach: rank 0 binds the store's listening socket itself (``listen_fd``) to the address it advertises
  (127.0.0.1 for a local run, the head node's address on Slurm) and hands the descriptor to torch's
  ``TCPStore`` (``master_listen_fd``), which would otherwise listen on every interface.
* Keys: everything is derived from the run's token with HMAC-SHA256 under a fixed label per use
  (``RunKeys``): the key prefix of the run's namespace, the key that seals records, the key of the
  rendezvous check. Neither the token nor a digest of it is stored. The prefix is not a secret from a
  process that can connect (a ``TCPStore`` client can list every key); it keeps runs apart, the seals
  are what protect.
* Check: rank 0 stores a random nonce and its HMAC under ``CHECK_KEY``; a rank whose token gives another
  HMAC is refused. The pair reveals nothing about the token or the prefix.
* Records: every record a rank acts on (``attempt-<k>/ctl/failed``, the settle marks) is stored as
  ``<hex HMAC of name and value>:<value>`` (``seal``); ``unseal`` returns ``None`` for a record whose
  HMAC is wrong: a process without the token wrote it, and it is ignored (a forged failure does not stop
  the run). The HMAC covers the record's full name (attempt included), so a genuine record cannot be
  replayed under another name. A store without keys (the API, on the RL framework's store) holds plain
  records.
* torch's records: the store torch's process groups get (``for_torch``: ``init_groups`` passes it to
  ``init_process_group``, and every ``new_group`` lies under it) is a ``SealedStore``: key names
  replaced by their HMAC (a listing shows opaque names), values sealed over their full name; a wrong
  seal is refused on read (``SealError``: the group creation fails, naming it), so an outsider can
  neither stand in for a rank (a forged gloo address, NCCL unique id) nor join the run's groups (its
  ``init_process_group`` waits on names no rank writes). Counters (``add``: only torch's opt-in
  store-based barrier) cannot be sealed: an outsider's add there is a denial of service, not a stand-in.
  What remains open: a ``TCPStore`` has no access control, so a process that can connect can delete or
  overwrite keys and make group creation or settling fail or time out (the run reports it).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import socket
from dataclasses import dataclass

import torch.distributed as dist

CHECK_KEY = "reshardctl/run-check"
_LABEL = b"reshardctl/store/v2/"


@dataclass(frozen=True)
class RunKeys:
    prefix: str  # the run's namespace in the store
    seal_key: bytes = b""
    check_key: bytes = b""

    @classmethod
    def from_token(cls, token: str | None) -> "RunKeys":
        """``token`` None or empty: keys every token-less process shares (no protection; the local and
        Slurm launchers always make a token)."""
        t = (token or "").encode()

        def derive(label: str) -> bytes:
            return hmac.new(t, _LABEL + label.encode(), hashlib.sha256).digest()

        return cls(prefix=f"run-{derive('prefix').hex()[:32]}/", seal_key=derive("seal"),
                   check_key=derive("check"))

    def __repr__(self) -> str:  # never print the keys
        return "RunKeys(<derived from the run token>)"


class RunStore(dist.PrefixStore):
    """A prefix store (the run's namespace, or a scope inside it) that carries the run's keys and the
    names its records are sealed under: ``scope`` + key. torch uses it as any store."""

    keys: RunKeys | None
    scope: str
    sealed: "SealedStore | None" = None  # torch's view of this store (``for_torch``)

    @classmethod
    def make(cls, prefix: str, inner, keys: RunKeys | None, scope: str = "") -> "RunStore":
        store = cls(prefix, inner)
        store.keys, store.scope = keys, scope
        return store


def scoped(store, prefix: str):
    """``PrefixStore(prefix, store)`` that keeps ``store``'s keys (a plain one when it has none)."""
    keys = getattr(store, "keys", None)
    if keys is None:
        return dist.PrefixStore(prefix, store)
    return RunStore.make(prefix, store, keys, getattr(store, "scope", "") + prefix)


class SealError(RuntimeError):
    """A value torch read through the run's store carries a wrong seal (a ``RuntimeError``, as torch's own
    store errors are: ``init_groups`` reports it as the group set-up's failure)."""


class SealedStore(dist.Store):
    """The store torch's process groups get on reshardctl's own ranks (``init_process_group``, and so every
    ``new_group``): every key name is replaced by an HMAC of it (``name``: the listing shows opaque names,
    not the attempt, group, device or rank a record belongs to), every value stored as a 32-byte HMAC over
    the full key name and the value, then the value. ``get`` (and ``multi_get``, ``compare_set``) raise
    ``SealError`` for a value whose seal is wrong: a process without the token wrote it (a forged gloo
    address, NCCL unique id). Counters (``add``) cannot be sealed; torch adds only in its opt-in
    store-based barrier (``TORCH_DIST_INIT_BARRIER=1``): an outsider's add there can end a barrier early
    or never, not stand in for a rank (docs/runs.md, "The run's store"). Sealing is deterministic, so
    ``compare_set`` compares sealed values exactly as torch expects. ``inner``: the run's namespace."""

    def __init__(self, inner, keys: RunKeys) -> None:
        super().__init__()
        self.inner = inner
        self._names = hmac.new(keys.seal_key, b"torch/names", hashlib.sha256).digest()
        self._values = hmac.new(keys.seal_key, b"torch/values", hashlib.sha256).digest()

    def name(self, key: str) -> str:
        return "t-" + hmac.new(self._names, key.encode(), hashlib.sha256).hexdigest()[:40]

    def _seal(self, key: str, value: bytes | str) -> bytes:
        data = value.encode() if isinstance(value, str) else bytes(value)
        return hmac.new(self._values, key.encode() + b"\0" + data, hashlib.sha256).digest() + data

    def _open(self, key: str, raw: bytes) -> bytes:
        mac, data = raw[:32], raw[32:]
        if len(raw) < 32 or not hmac.compare_digest(mac, self._seal(key, data)[:32]):
            raise SealError(f"the run's store holds a record with a wrong seal under {key!r}: written without "
                            f"the run's token (another process on the store's port), refused")
        return data

    def set(self, key, value) -> None:
        self.inner.set(self.name(key), self._seal(key, value))

    def get(self, key) -> bytes:
        return self._open(key, self.inner.get(self.name(key)))

    def multi_set(self, keys, values) -> None:
        self.inner.multi_set([self.name(k) for k in keys], [self._seal(k, v) for k, v in zip(keys, values)])

    def multi_get(self, keys) -> list[bytes]:
        return [self._open(k, raw) for k, raw in zip(keys, self.inner.multi_get([self.name(k) for k in keys]))]

    def compare_set(self, key, expected, desired) -> bytes:
        old = self._seal(key, expected) if len(expected) else b""
        return self._open(key, self.inner.compare_set(self.name(key), old, self._seal(key, desired)))

    def add(self, key, value: int) -> int:
        return self.inner.add(self.name(key), value)

    def check(self, keys) -> bool:
        return self.inner.check([self.name(k) for k in keys])

    def wait(self, keys, timeout=None) -> None:
        names = [self.name(k) for k in keys]
        if timeout is None:
            self.inner.wait(names)
        else:
            self.inner.wait(names, timeout)

    def delete_key(self, key) -> bool:
        return self.inner.delete_key(self.name(key))

    def num_keys(self) -> int:
        return self.inner.num_keys()

    def set_timeout(self, timeout) -> None:
        self.inner.set_timeout(timeout)

    def has_extended_api(self) -> bool:  # no append: a sealed value cannot grow in pieces
        return False


def for_torch(store):
    """The store to hand torch's process groups: ``SealedStore`` over a store with run keys (the run's
    namespace from ``rendezvous``), the store itself otherwise (the API: the framework's store). One per
    run store, kept on it: torch holds only the C++ side of a Python store, whose methods are gone once
    the Python object is collected ("Not implemented" from torch's trampoline)."""
    keys = getattr(store, "keys", None)
    if keys is None:
        return store
    if getattr(store, "sealed", None) is None:
        store.sealed = SealedStore(store, keys)
    return store.sealed


def _mac(keys: RunKeys, name: str, value: str) -> str:
    return hmac.new(keys.seal_key, name.encode() + b"\0" + value.encode(), hashlib.sha256).hexdigest()


def seal(store, key: str, value: str) -> str:
    """What to store under ``key`` of ``store`` for ``value``: sealed where the store has run keys."""
    keys = getattr(store, "keys", None)
    if keys is None:
        return value
    return _mac(keys, getattr(store, "scope", "") + key, value) + ":" + value


def unseal(store, key: str, raw: bytes | str) -> str | None:
    """The value of a stored record, ``None`` when its seal is wrong (written without the token)."""
    text = raw.decode(errors="replace") if isinstance(raw, bytes) else raw
    keys = getattr(store, "keys", None)
    if keys is None:
        return text
    mac, sep, value = text.partition(":")
    if not sep or not hmac.compare_digest(mac, _mac(keys, getattr(store, "scope", "") + key, value)):
        return None
    return value


def read_sealed(store, key: str) -> str | None:
    """The value under ``key`` when it is there and its seal holds, else ``None``."""
    if not store.check([key]):
        return None
    return unseal(store, key, store.get(key))


def challenge(keys: RunKeys) -> str:
    """Rank 0's check record: a fresh nonce and its HMAC under the check key."""
    nonce = secrets.token_hex(16)
    return nonce + ":" + hmac.new(keys.check_key, nonce.encode(), hashlib.sha256).hexdigest()


def answers(keys: RunKeys, record: bytes) -> bool:
    """Whether rank 0's check record was made with this process's token."""
    nonce, _, mac = record.decode(errors="replace").partition(":")
    want = hmac.new(keys.check_key, nonce.encode(), hashlib.sha256).hexdigest()
    return hmac.compare_digest(mac, want)


def listen_fd(addr: str, port: int) -> int:
    """A TCP socket bound to ``addr:port`` (the address the ranks connect to, not every interface), for
    ``TCPStore(master_listen_fd=...)``, which then owns the descriptor. ``OSError`` when no address of
    ``addr`` can be bound here (not this host's, or the port is taken)."""
    last: OSError | None = None
    for family, kind, proto, _, sockaddr in socket.getaddrinfo(addr, port, type=socket.SOCK_STREAM):
        s = socket.socket(family, kind, proto)
        try:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(sockaddr)
        except OSError as exc:
            s.close()
            last = exc
            continue
        return s.detach()
    raise last or OSError(f"no address for {addr}")
