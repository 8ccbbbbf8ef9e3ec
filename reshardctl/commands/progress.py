"""The live progress of long work on stderr (`run`, `bench`, `calibrate`, `collect --wait`): one owner of it.

On a terminal: a rich progress bar (the description, a bar and ``done/total`` once a total is known,
the elapsed time), gone when the work ends. Not a terminal (a pipe, a log file, a CI job): plain lines,
one per change of what is said (a phase, a job state) and at most one per ``every_s`` while only the
counts move; never a carriage return. Either way the work ends on one line that stays: how it ended
(``job 812 COMPLETED``), never a stale ``submitted``.

``slurm_state_line`` says a queue's states: ``job 812 waiting for the queue`` (Slurm gave no reason; its
``None`` is not printed), ``job 812 PENDING (Resources)``, ``job 812 RUNNING on n[1-2]``.

rich is loaded when a progress starts on a console, not with this module: work that says nothing
(``--json``, ``--quiet``) never imports it.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Callable, Union

if TYPE_CHECKING:
    from rich.console import Console

LONG_WORK_S = 1.0  # work that may be quick (`plan`, `layout export`) shows its stages only once it took this long
PLAIN_EVERY_S = 10.0  # not a terminal: the counts said at most this often (a change of phase or state at once)
NO_REASON = ("", "None", "none", "(null)")  # squeue's "no reason"


def slurm_state_line(states: dict, sides: dict | None = None) -> str:
    """``job 12 PENDING (Resources)`` / ``job 12 RUNNING on n1,n2; commits: train 4, infer 4``: the live
    line of a Slurm run (plain text, no markup). ``states``: job id -> ``JobState``."""
    if not states:
        return "submitted, waiting for the queue"
    parts = []
    for j, s in states.items():
        if s.state == "PENDING":
            reason = (s.reason or "").strip()
            parts.append(f"job {j} waiting for the queue" if reason in NO_REASON else f"job {j} PENDING ({reason})")
        else:
            parts.append(f"job {j} {s.state}" + (f" on {s.nodes}" if s.nodes else ""))
    if sides and any(sides.values()):
        parts.append(f"commits: train {sides.get('train', 0)}, infer {sides.get('infer', 0)}")
    return "; ".join(parts)


def end_line(states: dict) -> str:
    """``job 812 COMPLETED`` / ``job 812 FAILED, job 813 CANCELLED``: how a run's job(s) ended (``states``:
    job id -> final state name, as summary.json's ``slurm.states``)."""
    if not states:
        return "job(s) ended (no final state from Slurm)"
    return ", ".join(f"job {j} {st}" for j, st in states.items())


def session_end_line(summary: dict | None) -> str | None:
    """The last progress line of a refit session (`run`, `bench`, `collect --wait`): on Slurm each job's
    end state; here whether every refit committed; None for a detached run (its own lines say where it is)."""
    if summary is None:
        return None
    sl = summary.get("slurm")
    if sl:
        return end_line(sl.get("states") or {})
    return "ranks ended: " + ("every refit committed" if summary.get("ok") else "the run failed (below)")


def _bar(console: Console, what: str):
    """A transient rich bar on ``console``: the description, a bar, ``done/total`` (nothing while the
    total is unknown, never ``0/None``) and the elapsed time; and its task."""
    from rich.markup import escape
    from rich.progress import BarColumn, Progress, ProgressColumn, TextColumn, TimeElapsedColumn
    from rich.text import Text

    class Count(ProgressColumn):
        def render(self, task) -> Text:
            if task.total is None:
                return Text("")
            return Text(f"{int(task.completed)}/{int(task.total)}")

    bar = Progress(TextColumn("{task.description}"), BarColumn(), Count(), TimeElapsedColumn(),
                   console=console, transient=True)
    return bar, bar.add_task(escape(what), total=None)


class LiveProgress:
    """Progress of one piece of work on ``console`` (stderr; or a function that makes it, called when the
    progress starts). ``enabled`` False (``--json``, ``--quiet``): says nothing, and makes no console. ``start()`` before the first update (an input error before it leaves no line behind);
    ``update``/``state`` as the work goes; ``stop(final)`` once: the bar goes, ``final`` stays.
    ``show_after_s``: instead of ``start()``, the first ``update`` at least that long after creation starts
    it (work that is often quick says nothing then; a long one shows the stage it is in)."""

    def __init__(self, console: Union[Console, Callable[[], Console]], what: str, *, enabled: bool = True,
                 every_s: float = PLAIN_EVERY_S, clock=time.monotonic, show_after_s: float | None = None):
        self._console, self.enabled, self.every_s, self.clock = console, enabled, every_s, clock
        self.show_after_s, self._born = show_after_s, clock()
        self.console: Console | None = None  # made (or taken) at start
        self.tty = False
        self.what, self.done, self.total = what, 0, None
        self.started = False
        self._said: tuple | None = None  # plain mode: (what, done, total) last printed, and when
        self._said_at = 0.0
        self._bar = self._task = None

    def start(self) -> None:
        if self.started or not self.enabled:
            return
        self.started = True
        if self.console is None:
            self.console = self._console() if callable(self._console) else self._console
            self.tty = self.console.is_terminal
        if self.tty:
            if self._bar is None:
                self._bar, self._task = _bar(self.console, self.what)
            self._bar.start()
        else:
            self._plain(force=True)

    def update(self, done: int | None = None, total: int | None = None, what: str | None = None) -> None:
        """Counts (``done`` of ``total``) and/or what is being done now."""
        if what is not None:
            self.what = what
        if total is not None:
            self.total = total
        if done is not None:
            self.done = done
        if not self.started:
            if self.show_after_s is None or self.clock() - self._born < self.show_after_s:
                return
            self.start()
            if not self.started:  # not enabled
                return
        if self.tty:
            from rich.markup import escape

            self._bar.update(self._task, description=escape(self.what), completed=self.done, total=self.total)
        else:
            self._plain()

    def state(self, states: dict, sides: dict | None = None) -> None:
        """A queue's job states (``slurm_state_line``); a poll that found no job in the queue (they left
        it, accounting not read yet) keeps the last state said."""
        if states or self.what == "submitting":
            self.update(what=slurm_state_line(states, sides))

    def stop(self, final: str | None = None) -> None:
        """The end: the bar goes; ``final`` (how the work ended) is printed and stays."""
        if not self.started:
            return
        self.started = False
        if self.tty:
            self._bar.stop()
        if final:
            self.console.print(final, markup=False, highlight=False, soft_wrap=True)

    def _text(self) -> str:
        return self.what + (f" ({self.done}/{self.total})" if self.total is not None else "")

    def _plain(self, force: bool = False) -> None:
        now = self.clock()
        said = (self.what, self.done, self.total)
        if said == self._said:
            return
        counts_only = self._said is not None and self._said[0] == self.what
        if counts_only and not force and now - self._said_at < self.every_s:
            return
        self._said, self._said_at = said, now
        self.console.print(self._text(), markup=False, highlight=False, soft_wrap=True)


__all__ = ["LiveProgress", "end_line", "session_end_line", "slurm_state_line", "LONG_WORK_S", "PLAIN_EVERY_S"]
