"""Compile check of the CUDA KV kernels (no GPU needed): nvcc from the
nvidia-cuda-nvcc wheel builds kernels/kv_migrate for sm_80 and sm_90, and the
torch extension builds (binding against torch's and CUDA's headers) and
imports."""

import subprocess

import pytest

from tiertp.kv.kernels.cuda import ARCHS, build_extension, pip_cuda_root
from tiertp.kv.kernels.paths import kernel_dir

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cuda_root():
    root = pip_cuda_root()
    assert root is not None, "nvcc missing: pip install -r requirements/python.txt (nvidia-cuda-nvcc)"
    return root


def _run(cmd):
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, f"{' '.join(map(str, cmd))}\n{proc.stdout}\n{proc.stderr}"


def test_kernels_compile_for_sm80_and_sm90(cuda_root, tmp_path):
    obj = tmp_path / "kv_migrate_kernels.o"
    gencode = [f"-gencode=arch=compute_{a},code=sm_{a}" for a in ARCHS]
    _run([cuda_root / "bin" / "nvcc", "-c", kernel_dir() / "kv_migrate_kernels.cu", "-o", obj, "-O3",
          "-std=c++17", "-Xcompiler", "-fPIC", *gencode, f"-I{cuda_root / 'include'}", "-Werror", "all-warnings"])
    data = obj.read_bytes()
    for arch in ARCHS:
        assert f"sm_{arch}".encode() in data, f"no sm_{arch} code in the object"


def test_extension_builds_and_imports_without_gpu():
    """The first-use build path itself (nvcc and CUDA_HOME from the wheels,
    ninja, link, import); cached, so only a fresh machine pays ~1-2 minutes."""
    ext = build_extension()
    assert callable(ext.gather) and callable(ext.scatter)
