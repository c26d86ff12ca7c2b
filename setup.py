"""Builds the DuckDB kernel extension as part of ``pip install .`` / ``python -m build --wheel`` and ships it
inside udf_kernels/, so an installed wheel needs no compiler (udf_kernels.extension_path finds it there)."""

from __future__ import annotations

import pathlib
import shutil
import sys

from setuptools import setup
from setuptools.command.bdist_wheel import bdist_wheel
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
        kernel_build.say(f"packaging {built.name} as {dest}")
        shutil.copy2(built, dest)


class PlatformWheel(bdist_wheel):
    """A wheel for this platform only (it holds a compiled shared library), but for any Python 3: DuckDB
    loads the extension through its C API, so no CPython ABI is involved."""

    def finalize_options(self) -> None:
        super().finalize_options()
        self.root_is_pure = False

    def get_tag(self) -> tuple[str, str, str]:
        _python, _abi, platform = super().get_tag()
        return "py3", "none", platform


setup(cmdclass={"build_py": BuildPyWithKernels, "bdist_wheel": PlatformWheel})
