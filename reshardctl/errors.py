"""One small exception hierarchy. Library code raises these; ``cli.py`` maps them to exit codes
(docs/architecture.md, "Exit codes").

Exit code 2 = bad input (the user can fix a file or a flag); exit code 1 = runtime failure.
"""

from __future__ import annotations


class ReshardError(Exception):
    """Base class. ``exit_code`` is what the CLI returns for it."""

    exit_code = 1

    def __init__(self, message: str, *, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:  # one paragraph, hint appended
        return self.message if not self.hint else f"{self.message}\n{self.hint}"


class InputError(ReshardError):
    """Bad input: a file, a key, a flag or an arithmetic condition the user can fix. Exit code 2."""

    exit_code = 2


class ProfileError(InputError):
    """A site profile is unreadable, has an unknown key, a wrong type or an impossible value."""


class ModelError(InputError):
    """A model (config.json, safetensors index, preset) cannot be read or understood."""


class LayoutError(InputError):
    """Layouts that do not fit the model or the allocation. Carries every violation at once."""

    def __init__(self, violations: list[str] | str, *, hint: str | None = None):
        if isinstance(violations, str):
            violations = [violations]
        self.violations = list(violations)
        if len(self.violations) == 1:
            msg = self.violations[0]
        else:
            msg = f"{len(self.violations)} layout problems:\n" + "\n".join(f"  - {v}" for v in self.violations)
        super().__init__(msg, hint=hint)


class OutputError(InputError):
    """An output (``--out``, ``--export-transfers``, a file to write) cannot be written: a missing or
    unwritable directory, a full disk. Names the flag and the path; exit code 2 (the user can pick another)."""


class PlanError(InputError):
    """A plan cannot be built from these inputs (or a serialised plan does not match them)."""


class LaunchError(ReshardError):
    """Starting processes or talking to Slurm failed (carries the command and its output)."""


class Interrupted(ReshardError):
    """The user interrupted a run (Ctrl-C); what was cancelled is in the message. Exit code 130."""

    exit_code = 130


class NotEnded(LaunchError):
    """A run asked about (``reshardctl collect`` without ``--wait``) has not ended: its jobs are queued or
    running; nothing was read or written. Says each job's state. Exit code 3 (not a failure of the run)."""

    exit_code = 3


class RecordError(ReshardError):
    """A run's record (``summary.json``, ``run.json``, its plan files) could not be written: a full or
    read-only disk. Names the file and says what the ranks did (a refit may have committed). Exit code 1."""


class TransferError(ReshardError):
    """A refit failed at run time (a rank died, a timeout, a backend error)."""


class VerificationError(TransferError):
    """Bytes arrived but do not match what was sent; the refit was not committed."""


class LedgerError(InputError):
    """A site ledger that cannot be trusted: unreadable, corrupt, or written by a newer reshardctl.
    Names the file and line; the ledger is never rewritten to "repair" it. Exit code 2."""


class RefusedError(ReshardError):
    """A runbook step refused on the evidence (a promotion that fails a condition, a rollback whose
    validation refit was not verified). Names the condition and its numbers. Exit code 1."""


class BindingError(InputError):
    """A framework's parameters that do not match the side's layout (reshardctl/bind/binding.py): names
    missing or unexpected, shapes, dtypes, devices. Lists every problem at once, one line each
    (``name: expected X, got Y``), sorted, at most ``MAX_LINES`` of them. Exit code 2."""

    MAX_LINES = 50

    def __init__(self, problems: list[str], *, where: str, hint: str | None = None):
        self.problems = sorted(problems)
        self.where = where
        n = len(self.problems)
        lines = [f"  - {p}" for p in self.problems[:self.MAX_LINES]]
        if n > self.MAX_LINES:
            lines.append(f"  ... and {n - self.MAX_LINES} more")
        head = f"{n} binding problem{'s' if n != 1 else ''} on {where}:"
        super().__init__("\n".join([head, *lines]), hint=hint)
