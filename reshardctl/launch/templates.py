"""A strict renderer for the job scripts in ``sbatch_templates/``.

Placeholders are ``{{name}}``. Rendering fails (``LaunchError``) when a placeholder has no value or a
value has no placeholder: a misspelt name never becomes an empty string in a script that will run on
hundreds of nodes. Values are inserted verbatim; quoting is the caller's job (``slurm_request.py``
quotes every value for the place it lands).
"""

from __future__ import annotations

import re
from importlib import resources
from pathlib import Path
from typing import Mapping

from reshardctl.errors import LaunchError

_PLACEHOLDER = re.compile(r"\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}")


def template_dir() -> Path:
    """The shipped templates (package data, or the repository checkout)."""
    packaged = Path(str(resources.files("reshardctl"))) / "data" / "sbatch_templates"
    if packaged.is_dir():
        return packaged
    return Path(__file__).resolve().parents[2] / "sbatch_templates"  # checkout without the symlink


def load_template(name: str) -> str:
    path = template_dir() / name
    try:
        return path.read_text()
    except OSError as exc:
        raise LaunchError(f"sbatch template {path}: {exc.strerror or exc}") from exc


def render(template: str, values: Mapping[str, str], *, name: str = "template") -> str:
    """``template`` with every ``{{key}}`` replaced by ``values[key]``; strict both ways."""
    used = set(_PLACEHOLDER.findall(template))
    missing = sorted(used - set(values))
    unused = sorted(set(values) - used)
    if missing or unused:
        parts = []
        if missing:
            parts.append(f"no value for {', '.join(missing)}")
        if unused:
            parts.append(f"values without a placeholder: {', '.join(unused)}")
        raise LaunchError(f"sbatch template {name}: {'; '.join(parts)}")
    return _PLACEHOLDER.sub(lambda m: values[m.group(1)], template)  # values are not scanned again
