"""`reshardctl profile show|validate` (filled in by the site-profile work)."""

from __future__ import annotations

import typer

app = typer.Typer(help="Site profiles: show the resolved profile, validate files.", no_args_is_help=True)
