"""The scripts that need GPUs to run are at least valid Python here: the README's example, the
two-GPU test, and their launcher's skip path."""

from __future__ import annotations

import os
import py_compile
import subprocess
import sys

import pytest

from conftest import HAVE_TORCH, _repo


@pytest.mark.parametrize("path", ["python/examples/all_gather_matmul.py", "tests/gpu/python/test_fused_ops.py",
                                  "tests/gpu/python/moe_ring_cases.py", "bench/fused/moe_mlp_torch.py"])
def test_compiles(path, tmp_path):
    py_compile.compile(os.path.join(_repo, path), cfile=str(tmp_path / "out.pyc"), doraise=True)


@pytest.mark.skipif(not HAVE_TORCH, reason="torch is not installed (scripts/install-deps.sh installs it)")
def test_two_gpu_launcher_skips_with_its_reason_without_gpus():
    import torch

    if torch.cuda.device_count() >= 2:
        pytest.skip("this machine has two GPUs: the launcher would run the test, not skip it")
    env = dict(os.environ, MKERNEL_PYTHON=sys.executable)
    done = subprocess.run(["bash", os.path.join(_repo, "tests/gpu/python/run.sh")], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 77, done.stdout + done.stderr
    assert done.stdout.startswith("SKIPPED python_two_gpu_test: needs 2 CUDA GPUs, found"), done.stdout
