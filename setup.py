"""Packaging: the repository keeps the design card's top-level folders, and they install under one
import namespace (only ``toolkit`` lands at the top of site-packages):

    toolkit/  -> toolkit            patches/ -> toolkit.patches
    verify/   -> toolkit.verify     kernels/ -> toolkit.kernels

Everything else is in pyproject.toml.
"""

from setuptools import find_namespace_packages, find_packages, setup

MAPPED = {"toolkit.patches": "patches", "toolkit.verify": "verify", "toolkit.kernels": "kernels"}

packages = find_packages(include=["toolkit", "toolkit.*"])
for name, folder in MAPPED.items():
    packages += [name] + [f"{name}.{sub}" for sub in find_packages(where=folder)]
# data-only folders (C++ sources built at first use) ship as packages of their own
packages += [f"toolkit.kernels.{sub}" for sub in find_namespace_packages(where="kernels", include=["*.csrc"])]

setup(packages=packages, package_dir={"toolkit": "toolkit", **MAPPED})
