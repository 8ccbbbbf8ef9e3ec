"""Which site a command works for when ``--site`` is not given.

Precedence: the ``--site`` flag, then the ``RESHARDCTL_SITE`` environment variable (the same variable a
refit job's workers name their site by: docs/runbook.md), then ``site = "..."`` in the user config file
``$XDG_CONFIG_HOME/reshardctl/config.toml`` (``~/.config/reshardctl/config.toml`` when
``XDG_CONFIG_HOME`` is unset), then ``local`` (``plan``, ``run``, ``bench``, ``calibrate``) or an error
(``status``, ``promote``, ``rollback``: they act on one site's ledger, never on a guessed one).

The config file is read through ``bounded_load`` (at most ``CONFIG_MAX_BYTES``); a file that is not
TOML, a key other than ``site`` or a ``site`` that is not a non-empty string is an ``InputError``
naming the file and the key. A missing file is no error (nothing configured).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from reshardctl.bounded_load import LoadError, load_file
from reshardctl.errors import InputError
from reshardctl.site.loading import DEFAULT_PROFILE

ENV = "RESHARDCTL_SITE"
CONFIG_MAX_BYTES = 64 * 1024
CONFIG_KEYS = ("site",)


@dataclass(frozen=True)
class SiteChoice:
    """The site and where it came from: ``flag`` | ``env`` | ``config`` | ``default``."""

    site: str
    source: str
    where: str = ""  # the config file, for source "config"

    def describe(self) -> str:
        """``site from RESHARDCTL_SITE`` and the like (``profile show``)."""
        if self.source == "flag":
            return "site from the command line"
        if self.source == "env":
            return f"site from {ENV}"
        if self.source == "config":
            return f"site from {self.where}"
        return f"site: the default ({self.site}; set {ENV} or site in {config_path()} to change it)"


def config_path() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(base) / "reshardctl" / "config.toml"


def _config_site() -> str | None:
    """``site`` of the user config file, None when the file does not exist or sets none."""
    path = config_path()
    if not path.exists():
        return None
    try:
        data = load_file(path, "toml", max_bytes=CONFIG_MAX_BYTES)
    except LoadError as exc:
        raise InputError(f"{path}: {exc}", hint='the file holds one line: site = "NAME"') from None
    unknown = sorted(set(data) - set(CONFIG_KEYS))
    if unknown:
        raise InputError(f"{path}: unknown key(s) {', '.join(map(repr, unknown))}; expected only: "
                         f"{', '.join(CONFIG_KEYS)}", hint='e.g. site = "slurm-local"')
    site = data.get("site")
    if site is None:
        return None
    if not isinstance(site, str) or not site.strip():
        raise InputError(f"{path}: key 'site': expected a non-empty string (a profile name or file), "
                         f"got {site!r} ({type(site).__name__})", hint='e.g. site = "slurm-local"')
    return site.strip()


def choose_site(flag: str | None, *, required: bool = False, what: str = "") -> SiteChoice:
    """The site of ``flag`` if given, else of ``RESHARDCTL_SITE``, else of the config file, else ``local``
    (or, with ``required``, an ``InputError`` saying the three ways to name it; ``what``: the command)."""
    if flag:
        return SiteChoice(flag, "flag")
    env = os.environ.get(ENV, "").strip()
    if env:
        return SiteChoice(env, "env")
    site = _config_site()
    if site is not None:
        return SiteChoice(site, "config", str(config_path()))
    if required:
        raise InputError(f"{what or 'this command'} needs a site: none given with --site, in {ENV} or in "
                         f"{config_path()}", hint=f'give --site NAME, export {ENV}=NAME, or write site = "NAME" there')
    return SiteChoice(DEFAULT_PROFILE, "default")


__all__ = ["CONFIG_MAX_BYTES", "ENV", "SiteChoice", "choose_site", "config_path"]
