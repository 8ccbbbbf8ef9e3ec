"""The one compiled part: the checksum's row sums (reshardctl/runtime/_rowsums.c, docs/checksums.md).

Optional: where no C compiler is found, the install goes on without it and the checksum runs on the
paths torch provides (the fastest of them on this machine, measured at first use). Everything else is
in pyproject.toml."""

from setuptools import Extension, setup

setup(ext_modules=[Extension("reshardctl.runtime._rowsums", ["reshardctl/runtime/_rowsums.c"],
                             extra_compile_args=["-O3", "-std=c11", "-ffp-contract=fast"], optional=True)])
