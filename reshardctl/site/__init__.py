"""Site profiles: what reshardctl knows about a cluster (nodes, GPUs, NVLink domains, links, Slurm, refit).

A profile (YAML, or TOML with the same schema) is parsed once into immutable, validated objects.
Reference: docs/site-profiles.md.

Modules: ``spec`` (the value objects, ``profile_to_dict``), ``parse`` (``parse_profile``: validation,
every problem reported at once), ``hostlist`` (``expand_hostlist``), ``loading`` (files, names, search path).
"""

from reshardctl.site.hostlist import expand_hostlist
from reshardctl.site.loading import (
    DEFAULT_PROFILE,
    ENV_PATH,
    available_profiles,
    load_profile,
    load_profile_file,
    shipped_dir,
)
from reshardctl.site.parse import parse_profile
from reshardctl.site.spec import (
    TRANSPORTS,
    FrozenMap,
    LinkSpec,
    NcclSpec,
    RefitSpec,
    SiteProfile,
    SlurmSpec,
    profile_to_dict,
)

__all__ = [
    "DEFAULT_PROFILE",
    "ENV_PATH",
    "TRANSPORTS",
    "FrozenMap",
    "LinkSpec",
    "NcclSpec",
    "RefitSpec",
    "SiteProfile",
    "SlurmSpec",
    "available_profiles",
    "expand_hostlist",
    "load_profile",
    "load_profile_file",
    "parse_profile",
    "profile_to_dict",
    "shipped_dir",
]
