"""The kernel build's drivers: which kernel sets ``python -m udf_kernels.make`` and
``python -m udf_kernels.build`` build, and why. The compilers are stubbed out: these check the decisions,
not the compiles (``make kernels`` and the kernel tests cover those)."""

from __future__ import annotations

import ast
import pathlib
import subprocess

import pytest

from udf_kernels import KernelBuildError, build, gpu_build, make

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture
def builds(monkeypatch):
    """The builds asked for, in order: 'cpu', 'cuda' or 'emulated'; nothing is compiled."""
    calls: list[str] = []

    def cpu(force: bool = False) -> pathlib.Path:
        calls.append("cpu")
        return build.BUILT_PATH

    def gpu(emulated: bool = False, force: bool = False) -> pathlib.Path:
        calls.append("emulated" if emulated else "cuda")
        return gpu_build.built_path(emulated)

    monkeypatch.setattr(build, "build", cpu)
    monkeypatch.setattr(gpu_build, "build", gpu)
    monkeypatch.delenv(build.BUILD_CUDA_ENV, raising=False)
    return calls


@pytest.mark.parametrize(
    ("env", "visible", "args", "want"),
    [
        (None, False, [], ["cpu"]),  # nvcc or not, no device: no CUDA build
        (None, True, [], ["cpu", "cuda"]),
        ("0", True, [], ["cpu"]),
        ("1", False, [], ["cpu", "cuda"]),
        (None, False, ["--cuda"], ["cpu", "cuda"]),
        ("1", True, ["--no-cuda"], ["cpu"]),
        (None, False, ["--emulated"], ["cpu", "emulated"]),
    ],
)
def test_make_builds_the_cuda_set_where_a_device_is_visible_or_when_asked(
    builds, monkeypatch, capsys, env, visible, args, want
):
    if env is not None:
        monkeypatch.setenv(build.BUILD_CUDA_ENV, env)
    monkeypatch.setattr(gpu_build, "cuda_device_visible", lambda: visible)
    monkeypatch.setattr(gpu_build, "find_nvcc", lambda: "/usr/local/cuda/bin/nvcc")
    assert make.main(args) == 0
    assert builds == want
    if "cuda" not in want:
        assert "the CUDA kernel set is not built" in capsys.readouterr().err


def test_make_skips_a_visible_device_without_nvcc_but_not_an_explicit_ask(builds, monkeypatch, capsys):
    monkeypatch.setattr(gpu_build, "cuda_device_visible", lambda: True)
    monkeypatch.setattr(gpu_build, "find_nvcc", lambda: None)
    assert make.main([]) == 0
    assert builds == ["cpu"]
    assert "no nvcc" in capsys.readouterr().err
    assert make.main(["--cuda"]) == 0  # asked: gpu_build.build itself raises for the missing nvcc
    assert builds == ["cpu", "cpu", "cuda"]


def test_make_reports_a_build_error(monkeypatch, capsys):
    def failing(force: bool = False) -> pathlib.Path:
        raise KernelBuildError("no C++17 compiler found (set CXX, or install g++)")

    monkeypatch.setattr(build, "build", failing)
    assert make.main(["--no-cuda"]) == 1
    assert "no C++17 compiler" in capsys.readouterr().err


def test_the_build_env_variable_must_be_a_flag(monkeypatch):
    for text, want in (("1", True), ("yes", True), ("0", False), ("off", False), ("", None)):
        monkeypatch.setenv(build.BUILD_CUDA_ENV, text)
        assert build.env_flag(build.BUILD_CUDA_ENV) is want
    monkeypatch.setenv(build.BUILD_CUDA_ENV, "cuda")
    with pytest.raises(KernelBuildError, match="expected 1 or 0"):
        gpu_build.cuda_wanted()


def test_hidden_devices_are_not_visible(monkeypatch):
    for hidden in ("", "-1"):
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", hidden)
        assert gpu_build.cuda_device_visible() is False


def test_build_main_hands_the_gpu_set_to_a_child_process_only_when_asked(builds, monkeypatch, capsys):
    children: list[list[str]] = []

    def run(cmd, **kw):
        children.append(cmd)
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr(subprocess, "run", run)
    assert build.main([]) == 0
    assert children == []
    monkeypatch.setenv(build.BUILD_CUDA_ENV, "1")
    assert build.main(["--no-cuda"]) == 0
    assert children == []
    assert build.main(["--force"]) == 0
    assert [c[1:] for c in children] == [["-m", "udf_kernels.gpu_build", "--force"]]
    assert build.main(["--bogus"]) == 2
    assert "usage" in capsys.readouterr().err


def test_build_never_imports_the_gpu_build_or_the_driver():
    """build.py is the base both others import; an import back (even a lazy one) would close a circle."""
    tree = ast.parse((ROOT / "udf_kernels" / "build.py").read_text())
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            imported |= {f"{node.module}.{a.name}" for a in node.names} | {node.module}
        elif isinstance(node, ast.Import):
            imported |= {a.name for a in node.names}
    assert not imported & {"udf_kernels.gpu_build", "udf_kernels.make", "udf_kernels"}, imported
