"""Builds the DuckDB kernel extension as part of ``pip install .`` (shipped inside udf_kernels/)."""

from __future__ import annotations

import importlib.util
import pathlib
import shutil

from setuptools import setup
from setuptools.command.build_py import build_py


class BuildPyWithKernels(build_py):
    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return  # editable installs build on first use into udf_kernels/_build
        here = pathlib.Path(__file__).parent
        spec = importlib.util.spec_from_file_location("_tensorsql_kernel_build", here / "udf_kernels" / "build.py")
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        built = pathlib.Path(mod.build())
        dest = pathlib.Path(self.build_lib) / "udf_kernels" / built.name
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(built, dest)


setup(cmdclass={"build_py": BuildPyWithKernels})
