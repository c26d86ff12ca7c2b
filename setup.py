"""Builds the DuckDB kernel extension as part of ``pip install .`` (shipped inside udf_kernels/)."""

from __future__ import annotations

import pathlib
import shutil
import sys

from setuptools import setup
from setuptools.command.build_py import build_py


class BuildPyWithKernels(build_py):
    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return  # editable installs build on first use into udf_kernels/_build
        here = pathlib.Path(__file__).resolve().parent
        sys.path.insert(0, str(here))  # the source tree's udf_kernels (it imports nothing heavy)
        from udf_kernels import build as kernel_build

        built = pathlib.Path(kernel_build.build())
        dest = pathlib.Path(self.build_lib) / "udf_kernels" / built.name
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(built, dest)


setup(cmdclass={"build_py": BuildPyWithKernels})
