"""The compiled module without torch and without a GPU: the arrays it refuses (each refusal
naming the argument), runtime errors as Python exceptions, bootstrap errors."""

from __future__ import annotations

import os

import pytest

import mkernel
from conftest import BF16, DL_CPU, DL_CUDA, F16, dl_array
from mkernel import _native


def test_package_imports_and_says_whether_the_module_is_there():
    try:
        from mkernel import _build_info  # written by the build
    except ImportError:
        pytest.skip("running from the source tree: no build to compare with")
    if _build_info.native_skipped_reason:
        assert not mkernel.native_available()
        assert _build_info.native_skipped_reason in mkernel.native_unavailable_reason
        with pytest.raises(mkernel.NotBuiltError, match="built without its compiled module"):
            mkernel.all_gather_matmul_workspace_bytes(2, 128, 256)
    else:
        assert mkernel.native_available(), mkernel.native_unavailable_reason
        assert mkernel.native_unavailable_reason == ""


def test_workspace_sizes(native):
    assert mkernel.all_gather_matmul_workspace_bytes(2, 4096, 8192) == 2 * 4096 * 8192 * 2
    assert mkernel.all_gather_matmul_network_bytes(1, 4096, 8192) == 0
    assert mkernel.all_gather_matmul_network_bytes(2, 4096, 8192) == 2 * 4096 * 8192 * 2


def _args(m_local=64, n_local=32, k=128, world=2):
    return dict(
        a=dl_array([m_local, k]),
        w=dl_array([n_local, k]),
        out=dl_array([world * m_local, n_local]),
        gathered_out=dl_array([world * m_local, k]),
        world=world,
    )


def test_well_formed_arrays_pass(native):
    native.check_all_gather_gemm(**_args())
    args = _args()
    args["gathered_out"] = None
    native.check_all_gather_gemm(**args)


@pytest.mark.parametrize(
    "name, replacement, message",
    [
        ("a", dl_array([64, 128], dtype=F16), r"^a: dtype float16; expected bfloat16"),
        ("w", dl_array([32, 128], device=DL_CPU), r"^w: device cpu; expected a CUDA device"),
        ("a", dl_array([2, 64, 128]), r"^a: shape \(2, 64, 128\); expected a matrix"),
        ("a", dl_array([64, 128], [1, 64]), r"^a: strides \(1, 64\) for shape \(64, 128\); expected packed row-major \(128, 1\)"),
        ("w", dl_array([32, 128], [256, 1]), r"^w: strides \(256, 1\) .*expected packed row-major \(128, 1\)"),
        ("a", dl_array([64, 128], data=0x7F0000000008), r"^a: data at 0x7f0000000008 is not 16-byte aligned"),
        ("w", dl_array([32, 64]), r"^w: shape \(32, 64\); expected \(n_local, 128\)"),
        ("out", dl_array([64, 32]), r"^out: shape \(64, 32\); expected \(128, 32\) = \(world \* m_local, n_local\)"),
        ("gathered_out", dl_array([128, 64]), r"^gathered_out: shape \(128, 64\); expected \(128, 128\)"),
        ("out", dl_array([128, 32], device_id=1), r"^out: on CUDA device 1; expected a's device 0"),
        ("a", dl_array([0, 128]), r"^a: shape \(0, 128\); expected no empty dimension"),
    ],
)
def test_arrays_refused_name_the_argument(native, name, replacement, message):
    args = _args()
    args[name] = replacement
    with pytest.raises(mkernel.ArgumentError, match=message) as info:
        native.check_all_gather_gemm(**args)
    assert isinstance(info.value, ValueError)
    assert info.value.code == "invalid argument"


def test_rows_of_one_take_any_stride(native):
    # DLPack producers differ in the stride they give a dimension of size 1.
    args = _args(m_local=1)
    args["a"] = dl_array([1, 128], [999, 1])
    native.check_all_gather_gemm(**args)


def test_runtime_status_becomes_an_exception_with_code_and_origin(native, monkeypatch):
    for var in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "MKERNEL_TOKEN"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(mkernel.ArgumentError) as info:
        native.Communicator.create_from_env(nvlink_bytes=1 << 20)
    e = info.value
    assert e.code == "invalid argument"
    assert e.message == "RANK: not set; expected a number"
    assert "runtime.cc:" in e.where
    assert str(e).startswith("RANK: not set; expected a number [invalid argument, at runtime.cc:")


def test_from_env_names_a_short_token(native, monkeypatch):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "29500")
    monkeypatch.setenv("MKERNEL_TOKEN", "short")
    with pytest.raises(mkernel.ArgumentError, match=r"^MKERNEL_TOKEN: 5 bytes; expected the communicator's secret"):
        mkernel.Communicator.from_env(workspace_bytes=1 << 20, register=False)


def test_unique_id_names_the_daemon_socket(native, tmp_path):
    sock = str(tmp_path / "absent.sock")
    with pytest.raises(mkernel.MkernelError, match=f"cannot connect to mkerneld at {sock}") as info:
        native.get_unique_id(sock)
    assert info.value.code == "unavailable"
    assert not isinstance(info.value, ValueError)


def test_bad_unique_id_text(native):
    with pytest.raises(mkernel.ArgumentError, match="unique id"):
        native.Communicator.create(0, 2, "not an id", nvlink_bytes=1 << 20)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(workspace_bytes=0), r"^workspace_bytes: 0; expected an integer number of bytes >= 1"),
        (dict(workspace_bytes=1 << 20, network_workspace_bytes=-1), r"^network_workspace_bytes: -1"),
        (dict(workspace_bytes=1 << 20, rendezvous_timeout=0), r"^rendezvous_timeout: 0; expected a positive time"),
        (dict(workspace_bytes=1 << 20, gpu_memory="sometimes"), r"^gpu_memory: 'sometimes'; expected 'auto'"),
    ],
)
def test_communicator_options_refused_before_the_runtime(native, kwargs, message):
    with pytest.raises(mkernel.ArgumentError, match=message):
        mkernel.Communicator.from_env(register=False, **kwargs)


def test_errors_module_maps_codes():
    from mkernel import _errors

    e = _errors.from_status("deadline exceeded", "rank 0, launch 2, GEMM waiting: a wait expired", "comm.cuh:1")
    assert type(e) is mkernel.MkernelError and isinstance(e, RuntimeError)
    assert str(e) == "rank 0, launch 2, GEMM waiting: a wait expired [deadline exceeded, at comm.cuh:1]"
    assert isinstance(_errors.from_status("invalid argument", "k: 3", "x.cc:1"), mkernel.ArgumentError)
    assert str(_errors.argument_error("a: bad")) == "a: bad"


def test_reason_when_the_module_is_missing(monkeypatch):
    monkeypatch.setattr(_native, "native", None)
    monkeypatch.setattr(_native, "unavailable_reason", "mkernel was built without its compiled module: no CUDA")
    with pytest.raises(mkernel.NotBuiltError, match="no CUDA"):
        mkernel.Communicator.from_env(workspace_bytes=1 << 20)
    assert os.path.basename(_native.__file__) == "_native.py"


def test_module_built_for_another_python_is_named(native, tmp_path):
    import shutil
    import subprocess
    import sys

    staged = os.path.dirname(mkernel.__file__)
    copy = tmp_path / "mkernel"
    shutil.copytree(staged, copy, ignore=shutil.ignore_patterns("__pycache__", "_C*"))
    (copy / "_C.cpython-39-x86_64-linux-gnu.so").write_bytes(b"")  # no Python 3.9 runs this test
    # cwd: the copy must be the only mkernel in reach (ctest runs this in the staging directory).
    done = subprocess.run([sys.executable, "-c", "import mkernel; print(mkernel.__file__, mkernel.native_unavailable_reason)"],
                          env=dict(os.environ, PYTHONPATH=str(tmp_path)), cwd=str(tmp_path), capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(str(copy)), done.stdout
    assert "_C.cpython-39-x86_64-linux-gnu.so was built for another Python; this is Python" in done.stdout
