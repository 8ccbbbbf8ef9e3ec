"""``fork_map``: a pure function over independent items in forked worker processes, where that helps.

For work that is CPU-bound Python and numpy, independent per item, and whose results are small (the
plan report's parts and the ``--compare-infer`` candidates: a plan each, a few figures back). Children are forked, so they
start with everything the parent has built (model, layouts, caches) and nothing is pickled on the way
in; only each result comes back. Each process takes the next item not yet taken whenever it is free
(item numbers read from one pipe they share), so a heavy item does not hold up the ones dealt after it.
The results are those of ``[fn(x) for x in items]``, in order.
"""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Callable, Sequence
from typing import TypeVar

from reshardctl.errors import InputError, ReshardError

T = TypeVar("T")
R = TypeVar("R")

WORKERS_ENV = "RESHARDCTL_PLAN_WORKERS"


def workers_available() -> int:
    """Processes to use: ``$RESHARDCTL_PLAN_WORKERS`` when set (1: everything in this process), else the
    CPUs this process may run on (its affinity mask: a Slurm step's CPUs, not the node's)."""
    raw = os.environ.get(WORKERS_ENV, "").strip()
    if raw:
        try:
            n = int(raw)
        except ValueError:
            raise InputError(f"${WORKERS_ENV}={raw!r} is not a whole number of worker processes") from None
        if n < 1:
            raise InputError(f"${WORKERS_ENV}={raw!r}: at least 1 worker process (1: none forked)")
        return n
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _run(fn: Callable, x):
    """In a child: ``fn(x)``, or what it raised in a form that unpickles whatever the exception's
    constructor takes (a ``ReshardError``'s type, arguments and attributes; any other as text with its
    traceback)."""
    import pickle

    try:
        return ("ok", fn(x))
    except ReshardError as e:
        out = ("reshard", type(e), e.args, dict(e.__dict__))
        try:
            pickle.dumps(out)
            return out
        except Exception:  # noqa: BLE001 - an attribute that does not pickle: said as text
            return ("other", f"{type(e).__name__}: {e}", traceback.format_exc())
    except Exception as e:  # noqa: BLE001 - carried to the parent, raised there
        return ("other", f"{type(e).__name__}: {e}", traceback.format_exc())


def _rebuilt(kind: type, args: tuple, attrs: dict) -> ReshardError:
    """The child's exception again, without calling its constructor (subclasses take other arguments)."""
    err = kind.__new__(kind)
    err.args = args
    err.__dict__.update(attrs)
    return err


TOKENS = 1024  # items are taken in at most this many chunks (a token each: 4 bytes; 4 KiB fit any pipe buffer)


def _taken(r: int, chunk: int, n: int):
    """The item numbers this process takes, one chunk at a time, until the tokens run out: a token is 4
    bytes read from a pipe every worker shares (a pipe read of 4 bytes is one read, whoever reads)."""
    while True:
        data = os.read(r, 4)
        if len(data) < 4:
            return
        k = int.from_bytes(data, "little")
        yield from range(k * chunk, min(n, (k + 1) * chunk))


def fork_map(fn: Callable[[T], R], items: Sequence[T], workers: int | None = None) -> list[R]:
    """``[fn(x) for x in items]``, by up to ``workers`` (default ``workers_available()``) processes: this
    one and forked children, where there are two or more items, two or more workers and the platform
    forks; all in this process otherwise. Each process takes the next item not yet taken whenever it is
    free, in item order (put the heaviest first: the last item to finish then bounds the wait least).
    The first failing item (in item order) raises here: a ``ReshardError`` as itself (its type, message,
    hint and exit code), anything else as ``RuntimeError`` with the child's traceback. A child that dies
    (killed, out of memory) raises ``RuntimeError``; an interrupt here kills and reaps the children."""
    import pickle
    import signal

    items = list(items)
    n = min(workers or workers_available(), len(items))
    if n < 2 or not hasattr(os, "fork"):
        return [fn(x) for x in items]
    chunk = -(-len(items) // TOKENS)
    tokens_r, tokens_w = os.pipe()  # every token written and the write end closed before any fork: EOF ends
    with os.fdopen(tokens_w, "wb") as f:
        f.write(b"".join(k.to_bytes(4, "little") for k in range(-(-len(items) // chunk))))
    # what this process has buffered would otherwise be written again by every child
    sys.stdout.flush()
    sys.stderr.flush()
    children: list[tuple[int, int]] = []  # (pid, read end of its pipe)
    outcomes: dict[int, tuple] = {}
    try:
        for _ in range(1, n):
            r, wr = os.pipe()
            pid = os.fork()
            if pid == 0:  # the child: the items it takes, pickled down its pipe, then out without any clean-up
                code = 0
                try:
                    os.close(r)
                    data = pickle.dumps([(i, _run(fn, items[i])) for i in _taken(tokens_r, chunk, len(items))])
                    with os.fdopen(wr, "wb") as f:
                        f.write(data)
                except BaseException:  # noqa: BLE001 - the parent sees a child that said nothing
                    code = 1
                finally:
                    os._exit(code)
            os.close(wr)
            children.append((pid, r))
        outcomes.update((i, _run(fn, items[i])) for i in _taken(tokens_r, chunk, len(items)))
        for pid, r in children:
            with os.fdopen(r, "rb") as f:
                data = f.read()
            _, status = os.waitpid(pid, 0)
            if not data or os.waitstatus_to_exitcode(status) != 0:
                raise RuntimeError(f"a worker process (pid {pid}) ended with status "
                                   f"{os.waitstatus_to_exitcode(status)} before its results; "
                                   f"{WORKERS_ENV}=1 runs the work in this process")
            outcomes.update(pickle.loads(data))
        children = []
    finally:
        os.close(tokens_r)
        for pid, _ in children:  # an exception or interrupt here: none left behind
            try:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
            except (ProcessLookupError, ChildProcessError):
                pass
    results = []
    for i in range(len(items)):
        out = outcomes[i]
        if out[0] == "reshard":
            raise _rebuilt(*out[1:])
        if out[0] == "other":
            raise RuntimeError(f"{out[1]} (in a worker process)\n{out[2]}")
        results.append(out[1])
    return results
