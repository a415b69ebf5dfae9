"""Your own kernels (--msprobe-kernels) and devices (backends, hooks, entry points), end to end.

The in-process pytester runs share this process's torch (imported once by tests/conftest.py); a
conftest that patches torch restores it in pytest_unconfigure.
"""
from __future__ import annotations

import json
import shutil
from importlib.metadata import EntryPoint
from pathlib import Path
from typing import Any

import pytest

from pytest_msprobe.runs import backends, kernels
from tests.helpers import EXAMPLES, api_records, make_dump, tensor

EXAMPLE = EXAMPLES / "approximate_kernel"






def softmax_dump(pytester: pytest.Pytester, *, big: bool = False) -> Path:
    """Functional.softmax forward + backward (fp32), one Functional.linear (no kernel), one Tensor.add."""
    x = tensor(shape=[4, 16], mx=120.0 if big else 3.0, mn=-3.0, requires_grad=True)
    return make_dump(pytester, {
        "Functional.softmax.0.forward": {"input_args": [x], "input_kwargs": {"dim": {"type": "int", "value": -1}},
                                         "output": [tensor(shape=[4, 16], mx=1.0, mn=0.0, requires_grad=True)]},
        "Functional.softmax.0.backward": {"input": [tensor(shape=[4, 16], mx=0.1, mn=-0.1)],
                                          "output": [tensor(shape=[4, 16])]},
        "Functional.linear.0.forward": {"input_args": [tensor(shape=[4, 8]), tensor(shape=[3, 8])],
                                        "input_kwargs": {}, "output": [tensor(shape=[4, 3])]},
        "Tensor.add.0.forward": {"input_args": [tensor(), tensor()], "input_kwargs": {}, "output": [tensor()]},
    })


GOOD_KERNELS = '''
import torch

def softmax(input, dim=None, _stacklevel=3, dtype=None):
    shifted = input - input.amax(dim, keepdim=True)
    e = torch.exp(shifted)
    return e / e.sum(dim, keepdim=True)

def add(self, other, *, alpha=1):
    return torch.add(self, other, alpha=alpha)

KERNELS = {"Functional.softmax": softmax, "Tensor.add": add}
'''


# --------------------------------------------------------------------------- kernel substitution


def test_correct_kernel_passes_and_unmapped_apis_are_deselected(pytester: pytest.Pytester) -> None:
    dump = softmax_dump(pytester)
    pytester.makepyfile(good_kernels=GOOD_KERNELS)
    pytester.makeini("[pytest]\nmsprobe_kernels = good_kernels.py:KERNELS\n")  # relative to the ini file
    result = pytester.runpytest(str(dump), "--msprobe-device", "cpu", "-v")
    result.assert_outcomes(passed=3, deselected=1)
    result.stdout.fnmatch_lines(["*msprobe kernels: *good_kernels.py:KERNELS substitutes Functional.softmax, Tensor.add;"
                                 " other APIs deselected*",
                                 "*msprobe: 1 deselected: no kernel*"])
    recs = api_records(pytester)
    assert set(recs) == {"Functional.softmax.0.forward", "Functional.softmax.0.backward", "Tensor.add.0.forward"}
    assert recs["Functional.softmax.0.forward"]["impl"] == "good_kernels:softmax (substituted)"
    assert recs["Functional.softmax.0.backward"]["kernel"] == "good_kernels:softmax"
    assert recs["Tensor.add.0.forward"]["impl"] == "good_kernels:add (substituted)"
    assert all(r["status"] == "pass" for r in recs.values())


def test_run_all_keeps_unmapped_apis_with_the_usual_implementation(pytester: pytest.Pytester) -> None:
    dump = softmax_dump(pytester)
    pytester.makepyfile(lazy_kernels='KERNELS = {"Functional.softmax": "impl_mod:softmax"}\n',
                        impl_mod="import torch\n\ndef softmax(input, dim=None, _stacklevel=3, dtype=None):\n"
                                 "    return torch.softmax(input, dim)\n")
    pytester.syspathinsert()  # the module form: importable from sys.path
    result = pytester.runpytest(str(dump), "--msprobe-device", "cpu", "--msprobe-kernels", "lazy_kernels:KERNELS",
                                "-o", "msprobe_kernels_run_all=true")
    result.assert_outcomes(passed=4)
    recs = api_records(pytester)
    assert recs["Functional.softmax.0.forward"]["impl"] == "impl_mod:softmax (substituted)"
    assert recs["Functional.linear.0.forward"]["impl"] == "torch.nn.functional.linear"
    assert "kernel" not in recs["Functional.linear.0.forward"]
    assert "deselected: no kernel" not in result.stdout.str()


def test_approximate_kernel_example_fails_naming_the_api(pytester: pytest.Pytester) -> None:
    """examples/approximate_kernel: the softmax without max-subtraction fails on large logits only."""
    shutil.copytree(EXAMPLE, pytester.path / "example")
    result = pytester.runpytest("example", "--msprobe-device", "cpu",
                                "--msprobe-kernels", "example/kernels.py:KERNELS")
    result.assert_outcomes(passed=2, failed=2, deselected=2)
    result.stdout.fnmatch_lines([
        "*_ msprobe: Functional.softmax.1.forward _*",
        "Functional.softmax.1.forward: error  (device=cpu, standard=strict)",
        "implementation: naive_softmax:softmax (substituted) on cpu",
        "output.0 *float32*float64*error*nan*",
        "rerun: pytest *dump.json::Functional.softmax.1.forward *--msprobe-kernels */example/kernels.py:KERNELS",
        "FAILED example/step0/rank0/dump.json::Functional.softmax.1.forward*",
        "FAILED example/step0/rank0/dump.json::Functional.softmax.1.backward*",
    ])
    recs = api_records(pytester)
    assert {k: r["status"] for k, r in recs.items()} == {
        "Functional.softmax.0.forward": "pass", "Functional.softmax.0.backward": "pass",
        "Functional.softmax.1.forward": "error", "Functional.softmax.1.backward": "error"}


def test_kernel_that_cannot_be_loaded_fails_its_items(pytester: pytest.Pytester) -> None:
    dump = softmax_dump(pytester)
    pytester.makepyfile(k='KERNELS = {"Functional.softmax": "no_such_module_xyz:softmax"}\n')
    result = pytester.runpytest(str(dump), "--msprobe-device", "cpu", "--msprobe-kernels", "k.py:KERNELS")
    result.assert_outcomes(failed=2, deselected=2)
    result.stdout.fnmatch_lines(["*kernel 'no_such_module_xyz:softmax' of Functional.softmax cannot be loaded "
                                 "(ModuleNotFoundError*"])


BAD_KERNELS = [
    ("nocolon", None, "*--msprobe-kernels: 'nocolon' is not module:attr*"),
    ("no_such_module_abc:KERNELS", None, "*cannot import module 'no_such_module_abc'*"),
    ("missing.py:KERNELS", None, "*no such file: *missing.py*"),
    ("k.py:OTHER", "KERNELS = {}\n", "*k.py has no attribute 'OTHER'*"),
    ("k.py:KERNELS", "KERNELS = [1, 2]\n", "*KERNELS is a list, expected a mapping {API name: kernel}*"),
    ("k.py:KERNELS", "KERNELS = {}\n", "*KERNELS is empty*"),
    ("k.py:KERNELS", "KERNELS = {'Functional.softmax': 3}\n",
     "*kernel of 'Functional.softmax' is int 3, expected a callable with the API's signature*"),
    ("k.py:KERNELS", "KERNELS = {'Functional.softmax': 'no colon'}\n", "*expected 'module:function'*"),
    ("k.py:KERNELS", "KERNELS = {'softmax': print}\n", "*key 'softmax' is not an API name of the form <Type>.<api>*"),
    ("k.py:KERNELS", "KERNELS = {'torch.nn.functional.softmax': print}\n",
     "*msprobe names this API 'Functional.softmax'*"),
    ("k.py:KERNELS", "KERNELS = {'Functional.softmax.0.forward': print}\n",
     "*is a dump entry; use the API name 'Functional.softmax'*"),
    ("k.py:KERNELS", "KERNELS = {'Cuda.softmax': print}\n", "*'Cuda' is not an msprobe API type*"),
    ("k.py:KERNELS", "raise RuntimeError('broken module')\n", "*importing *k.py raised RuntimeError: broken module*"),
]


@pytest.mark.parametrize(("spec", "module", "message"), BAD_KERNELS, ids=[m.strip("*")[:40] for _, _, m in BAD_KERNELS])
def test_bad_kernels_are_usage_errors(pytester: pytest.Pytester, spec: str, module: str | None, message: str) -> None:
    if module is not None:
        pytester.makepyfile(k=module)
    result = pytester.runpytest("--collect-only", "--msprobe-kernels", spec)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([message])


def test_run_all_needs_kernels(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("--collect-only", "-o", "msprobe_kernels_run_all=true")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*ini msprobe_kernels_run_all needs --msprobe-kernels*"])


def test_key_names() -> None:
    for good in ("Functional.layer_norm", "Torch.matmul", "Tensor.add", "Tensor.__getitem__", "NPU.npu_rms_norm",
                 "Torch.linalg.norm"):
        assert kernels.key_error(good) is None, good
    assert "Torch.linalg.norm" in str(kernels.key_error("Torch.linalg.norm.3"))
    assert "'Tensor.add'" in str(kernels.key_error("torch.Tensor.add"))
    assert "is a int" in str(kernels.key_error(3))
    assert kernels.api_key("Torch.linalg.norm.0.backward") == "Torch.linalg.norm"
    assert kernels.api_key("not an entry") is None


# --------------------------------------------------------------------------- device backends


INSTRUMENTED_BACKEND = '''
import json
from pathlib import Path

import pytest
from pytest_msprobe.backends import Backend

EVENTS = []


class Fancy(Backend):
    """A device that is the CPU underneath and records what pytest-msprobe asks of it."""

    name, kind = "fancy", "cpu"

    def to_device(self, tensor, device, dtype):
        EVENTS.append(["to_device", str(dtype)])
        return tensor.to(device=device, dtype=dtype)   # no copy for a CPU tensor: the plugin copies

    def run(self, api, fn, args, kwargs):
        EVENTS.append(["run", api, getattr(fn, "__name__", "?")])
        return fn(*args, **kwargs)

    def synchronize(self, device):
        EVENTS.append(["synchronize", device])

    def boundary(self, api, phase):
        EVENTS.append(["boundary", api, phase])
        return super().boundary(api, phase)


def pytest_msprobe_device(config, name):
    return Fancy() if name == "fancy" else None


def pytest_msprobe_device_names(config):
    return ["fancy"]


def pytest_unconfigure(config):
    Path("events.json").write_text(json.dumps(EVENTS))
'''


def test_backend_from_a_conftest_hook_is_used(pytester: pytest.Pytester) -> None:
    dump = softmax_dump(pytester)
    pytester.makeconftest(INSTRUMENTED_BACKEND)
    result = pytester.runpytest(str(dump), "--msprobe-device", "fancy", "-k", "softmax or add")
    result.assert_outcomes(passed=3, deselected=1)
    result.stdout.fnmatch_lines(["*msprobe: seed 1234, device fancy,*"])
    recs = api_records(pytester)
    assert {r["device"] for r in recs.values()} == {"cpu"}
    assert {r["backend"] for r in recs.values()} == {"fancy (cpu)"}
    events = json.loads((pytester.path / "events.json").read_text())
    runs = [e for e in events if e[0] == "run"]
    assert runs == [["run", "Functional.softmax", "softmax"], ["run", "Functional.softmax", "softmax"],
                    ["run", "Tensor.add", "add"]]
    boundaries = [e for e in events if e[0] == "boundary"]
    assert boundaries == [["boundary", "Functional.softmax", "forward"], ["boundary", "Functional.softmax", "forward"],
                          ["boundary", "Functional.softmax", "backward"], ["boundary", "Tensor.add", "forward"]]
    assert sum(e[0] == "synchronize" for e in events) == 4  # once per device call, inside the boundary
    assert ["to_device", "torch.float32"] in events and ["to_device", "torch.float64"] not in events

    # an unknown name is a usage error that lists the registered device too
    result = pytester.runpytest(str(dump), "--msprobe-device", "fancyy")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--msprobe-device: unknown device 'fancyy'; known devices: auto, fancy, npu, cuda, "
                                 "cpu (*pytest_msprobe_device*pytest_msprobe.devices*"])
    result = pytester.runpytest(str(dump), "--msprobe-reference", "auto")
    result.stderr.fnmatch_lines(["*--msprobe-reference: unknown device 'auto'; known devices: fancy, npu, cuda, cpu*"])


def test_builtin_devices_come_from_the_same_hook(pytester: pytest.Pytester) -> None:
    pytester.makeconftest('''
        from pytest_msprobe.backends import CpuBackend

        class LoudCpu(CpuBackend):
            pass

        def pytest_msprobe_device(config, name):
            return LoudCpu() if name == "cpu" else None
    ''')
    dump = softmax_dump(pytester)
    result = pytester.runpytest(str(dump), "--msprobe-device", "cpu", "-k", "linear")
    result.assert_outcomes(passed=1, deselected=3)
    assert api_records(pytester)["Functional.linear.0.forward"]["backend"] == "cpu"
    assert backends.builtin_backend("cuda").__class__ is backends.CudaBackend
    assert backends.builtin_backend("nope", entry_points=[]) is None


class EpBackend(backends.Backend):
    """A backend as a package would ship it, loaded through an entry point."""

    kind = "cpu"


def ep_factory() -> backends.Backend:
    return EpBackend()


NOT_A_BACKEND = object()


def entry_point(name: str, value: str) -> EntryPoint:
    return EntryPoint(name=name, value=value, group=backends.ENTRY_POINT_GROUP)


def test_entry_point_loading() -> None:
    for value in ("tests.test_kernels:EpBackend", "tests.test_kernels:ep_factory"):
        backend = backends.load_entry_point(entry_point("epdev", value))
        assert isinstance(backend, EpBackend) and backend.name == "epdev"
    with pytest.raises(backends.BackendError, match="expected a pytest_msprobe.backends.Backend"):
        backends.load_entry_point(entry_point("bad", "tests.test_kernels:NOT_A_BACKEND"))
    with pytest.raises(backends.BackendError, match="cannot be loaded .ModuleNotFoundError"):
        backends.load_entry_point(entry_point("gone", "no_such_pkg_q:Backend"))
    eps = [entry_point("epdev", "tests.test_kernels:EpBackend")]
    assert backends.entry_point_names(eps) == ["epdev"]
    assert isinstance(backends.builtin_backend("epdev", entry_points=eps), EpBackend)


def test_entry_point_backend_end_to_end(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(backends, "_entry_points", lambda: [entry_point("epdev", "tests.test_kernels:EpBackend")])
    dump = softmax_dump(pytester)
    result = pytester.runpytest(str(dump), "--msprobe-device", "epdev", "-k", "linear")
    result.assert_outcomes(passed=1, deselected=3)
    assert api_records(pytester)["Functional.linear.0.forward"]["backend"] == "epdev (cpu)"
    result = pytester.runpytest(str(dump), "--msprobe-device", "nope")
    result.stderr.fnmatch_lines(["*known devices: auto, npu, cuda, cpu, epdev*"])


# --------------------------------------------------------------------------- the boundary


BOUNDARY_PLUGIN = '''
import json
from pathlib import Path

import pytest
import torch
from torch.overrides import TorchFunctionMode

INSIDE = {"phase": None}
LOG = []
REAL_SOFTMAX = torch.nn.functional.softmax


def spy_softmax(input, *args, **kwargs):
    """Installed for the whole run: every softmax call, device and bench, says where it ran."""
    LOG.append(["softmax", INSIDE["phase"], str(input.dtype)])
    return REAL_SOFTMAX(input, *args, **kwargs)


torch.nn.functional.softmax = spy_softmax


class Corrupting(TorchFunctionMode):
    """Instrumentation inside the boundary: logs every torch call and corrupts softmax outputs by +1."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        dtypes = sorted({str(a.dtype) for a in args if isinstance(a, torch.Tensor)})
        LOG.append(["op", INSIDE["phase"], getattr(func, "__name__", str(func)), dtypes])
        if func is spy_softmax:  # F.softmax dispatches under its module-level name, the spy now
            return REAL_SOFTMAX(*args, **(kwargs or {})) + 1
        return func(*args, **(kwargs or {}))


@pytest.hookimpl(wrapper=True)
def pytest_msprobe_device_call(item_name, api, phase, device, call):
    assert not call.done
    INSIDE["phase"] = phase
    try:
        with Corrupting():
            result = yield
    finally:
        INSIDE["phase"] = None
    assert call.done and result is call
    return result


def pytest_unconfigure(config):
    torch.nn.functional.softmax = REAL_SOFTMAX
    Path("log.json").write_text(json.dumps(LOG))
'''


def test_bench_is_untouched_by_the_boundary(pytester: pytest.Pytester) -> None:
    """A plugin instruments torch around the device call; the bench never sees it, and its numbers are right."""
    dump = softmax_dump(pytester)
    pytester.makeconftest(BOUNDARY_PLUGIN)
    # one thread, so that the log's order is the runs' order: the plugin's phase flag is one global, which a bench
    # running beside the device call (a spare core) would read as "forward" (own-devices.md: such state must be
    # per thread); the mode itself is per thread either way
    result = pytester.runpytest(str(dump), "--msprobe-device", "cpu", "-k", "softmax and forward",
                                "--msprobe-standard", "strict", "-o", "msprobe_helper_thread=off")
    result.assert_outcomes(failed=1, deselected=3)
    log = json.loads((pytester.path / "log.json").read_text())
    softmax_calls = [(phase, dtype) for kind, phase, dtype, *_ in log if kind == "softmax"]
    # device (fp32) inside the boundary; bench (fp64) and strict's torch run (fp32) outside it
    assert softmax_calls == [("forward", "torch.float32"), (None, "torch.float64"), (None, "torch.float32")]
    ops = [entry for entry in log if entry[0] == "op"]
    assert ["op", "forward", "spy_softmax", ["torch.float32"]] in ops
    assert all(phase == "forward" for _, phase, _, _ in ops)  # the mode only ever saw the device call
    assert all(dtypes in ([], ["torch.float32"]) for *_, dtypes in ops)  # never a bench (fp64) tensor
    output = api_records(pytester)["Functional.softmax.0.forward"]["outputs"][0]
    worst = output["worst"]  # off by exactly the +1, and the bench is a probability: it was not corrupted
    assert abs(worst["device"] - worst["bench"] - 1) < 1e-6 and 0 <= worst["bench"] <= 1


def test_device_call_without_config_runs_in_the_backend_boundary() -> None:
    import torch

    from pytest_msprobe.runs.execution import Device

    seen = []

    class Tracing(backends.Backend):
        name, kind = "tracing", "cpu"

        def boundary(self, api: str, phase: str) -> Any:
            seen.append((api, phase))
            return super().boundary(api, phase)

        def synchronize(self, device: str) -> None:
            seen.append(("sync", device))

    device = Device("cpu", None, Tracing())
    assert device.label == "tracing (cpu)"
    out = backends.device_call("Torch.abs.0.forward", "Torch.abs", "forward", device, "torch.abs",
                               lambda: torch.abs(torch.tensor([-1.0])))
    assert out.tolist() == [1.0] and seen == [("Torch.abs", "forward"), ("sync", "cpu")]
    source = torch.ones(3)
    moved = device.to_device(source, torch.float32)  # a backend that does not copy still gets a copy
    moved.add_(1)
    assert source.tolist() == [1.0, 1.0, 1.0]


XDIST_CONFTEST = INSTRUMENTED_BACKEND + '''

import sys


def pytest_collection_finish(session):
    worker = getattr(session.config, "workerinput", {}).get("workerid", "controller")
    Path(f"torch_at_collection_{worker}.txt").write_text(str("torch" in sys.modules))
'''


def test_kernels_and_a_conftest_backend_under_xdist(pytester: pytest.Pytester) -> None:
    """Each worker selects by name without torch, imports the kernel lazily and runs it on the plugin's device."""
    dump = softmax_dump(pytester)
    pytester.makeconftest(XDIST_CONFTEST)
    pytester.makepyfile(lazy_kernels='KERNELS = {"Functional.softmax": "impl_mod:softmax"}\n',
                        impl_mod="import torch\n\ndef softmax(input, dim=None, _stacklevel=3, dtype=None):\n"
                                 "    return torch.softmax(input, dim)\n")
    result = pytester.runpytest_subprocess(str(dump), "-n", "2", "-p", "xdist", "-o", "msprobe_min_work_per_worker=0",
                                           "-p", "no:hypothesispytest",
                                           "-p", "no:benchmark", "--msprobe-device", "fancy",
                                           "--msprobe-kernels", "lazy_kernels.py:KERNELS")
    result.assert_outcomes(passed=2)
    recs = api_records(pytester)
    assert set(recs) == {"Functional.softmax.0.forward", "Functional.softmax.0.backward"}
    assert {(r["impl"], r["backend"]) for r in recs.values()} == {("impl_mod:softmax (substituted)", "fancy (cpu)")}
    flags = {p.name: p.read_text() for p in pytester.path.glob("torch_at_collection_*.txt")}
    assert flags == {"torch_at_collection_gw0.txt": "False", "torch_at_collection_gw1.txt": "False"}
