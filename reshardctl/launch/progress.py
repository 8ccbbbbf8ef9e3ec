"""A run's live progress, read from its ranks' event logs while it runs (both launchers' progress line)."""

from __future__ import annotations

from pathlib import Path

from reshardctl.runtime.events import event_texts


def count_commits(events_dir: Path) -> int:
    return sum(commits_by_side(events_dir).values())


def commits_by_side(events_dir: Path) -> dict[str, int]:
    """Commit events written so far, per side (``{"train": n, "infer": m}``): a run's live progress."""
    out = {"train": 0, "infer": 0}
    for text in event_texts(events_dir):  # bounded, regular files only (summary.json names a skipped one)
        n = text.count('"phase":"commit"')
        if n:
            out["infer" if '"side":"infer"' in text else "train"] += n
    return out


def set_up_done(events_dir: Path) -> int:
    """Ranks whose weights are materialised (set-up progress)."""
    return sum('"phase":"materialise"' in text for text in event_texts(events_dir))
