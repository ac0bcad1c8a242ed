"""Per-rank preflight checks: each check passing and failing, on real state where the machine allows.

CPU affinity, directory writes, /proc/meminfo and the loopback NIC are the
real ones; NICs and meminfo also use fake trees under tmp_path, and NVML is a
fake `pynvml` module put into sys.modules.
"""

from __future__ import annotations

import ctypes
import dataclasses
import errno
import json
import os
import shutil
import subprocess
import sys
import threading
import time
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from clusterctl.runtime.rank.preflight import CheckResult, PreflightContext, failed, run_checks
from clusterctl.runtime.rank.preflight import common as preflight_common
from clusterctl.runtime.rank.preflight import memory as preflight_memory
from clusterctl.runtime.rank.preflight import nic as preflight_nic
from clusterctl.runtime.rank.preflight import sharedfs as preflight_sharedfs
from clusterctl.runtime.rank.preflight.gpu import fabric_id
from clusterctl.runtime.wire import sharedmarker
from clusterctl.runtime.wire.greeting import registration_proof
from clusterctl.runtime.wire.sharedmarker import write_shared_marker
from clusterctl.syntax.cpulist import format_cpulist

HOST = "node07"


def make_ctx(**changes: object) -> PreflightContext:
    base = PreflightContext(
        rank=5,
        local_rank=1,
        host=HOST,
        gpu=2,
        gpu_vendor="nvidia",
        expected_cpus=frozenset(),
        nics=(),
        nic_kinds=(),
        dirs=(),
        shared_marker=None,
        shared_token=None,
    )
    return dataclasses.replace(base, **changes)


def only(name: str, ctx: PreflightContext) -> CheckResult:
    (result,) = run_checks([name], ctx)
    assert result.name == name
    json.dumps(result.data)  # every result goes into the run manifest
    assert "\n" not in result.detail
    return result


# --- a fake pynvml -------------------------------------------------------------

NOT_SUPPORTED, DRIVER_NOT_LOADED, LIBRARY_NOT_FOUND, GPU_IS_LOST, UNKNOWN = 3, 9, 12, 15, 999
_MESSAGES = {
    NOT_SUPPORTED: "Not Supported",
    DRIVER_NOT_LOADED: "Driver Not Loaded",
    LIBRARY_NOT_FOUND: "NVML Shared Library Not Found",
    GPU_IS_LOST: "GPU is lost",
    UNKNOWN: "Unknown Error",
}


class NVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(_MESSAGES.get(value, f"NVML error {value}"))
        self.value = value


class NVMLError_NotSupported(NVMLError):  # noqa: N801 - pynvml's spelling
    def __init__(self) -> None:
        super().__init__(NOT_SUPPORTED)


class FakeGPU:
    """A healthy H100: ECC on and clean, rows not remapped, page retirement not supported (as on Ampere+)."""

    def __init__(self) -> None:
        self.name = b"NVIDIA H100 80GB HBM3"  # older bindings return bytes
        self.uuid = "GPU-1b2c3d4e-0000-1111-2222-333344445555"
        self.temperature = 41
        self.ecc_mode = [1, 1]
        self.ecc = {(1, 0): 0, (0, 0): 7, (1, 1): 1}  # (error type, counter type) -> count
        self.retired_pending: int | None = None  # None: NotSupported
        self.remapped_rows: tuple | None = (0, 0, 0, 0)
        self.reasons = 0x1  # GPU idle: not a fault
        self.unsupported: set[str] = set()
        self.errors: dict[str, int] = {}
        self.init_error: int | None = None
        self.old_binding = False
        self.fabric: types.SimpleNamespace | None = None  # nvmlDeviceGetGpuFabricInfo: NotSupported (no NVL72 rack)
        self.opened: list[int] = []
        self.shutdowns = 0


class FabricInfo(ctypes.Structure):
    """pynvml's c_nvmlGpuFabricInfo_v2_t."""

    _fields_ = [("version", ctypes.c_uint), ("clusterUuid", ctypes.c_uint8 * 16), ("status", ctypes.c_uint),
                ("cliqueId", ctypes.c_uint32), ("state", ctypes.c_uint8), ("healthMask", ctypes.c_uint32)]


def fake_pynvml(gpu: FakeGPU) -> types.ModuleType:
    nv = types.ModuleType("pynvml")
    nv.NVMLError = NVMLError
    nv.NVMLError_NotSupported = NVMLError_NotSupported
    nv.NVML_ERROR_NOT_SUPPORTED = NOT_SUPPORTED
    nv.NVML_ERROR_DRIVER_NOT_LOADED = DRIVER_NOT_LOADED
    nv.NVML_ERROR_LIBRARY_NOT_FOUND = LIBRARY_NOT_FOUND
    nv.NVML_FEATURE_ENABLED = 1
    nv.NVML_TEMPERATURE_GPU = 0
    nv.NVML_MEMORY_ERROR_TYPE_CORRECTED = 0
    nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
    nv.NVML_VOLATILE_ECC = 0
    nv.NVML_AGGREGATE_ECC = 1
    prefix = "nvmlClocksThrottleReason" if gpu.old_binding else "nvmlClocksEventReason"
    for suffix, bit in (("GpuIdle", 0x1), ("SwPowerCap", 0x4), ("HwSlowdown", 0x8), ("SwThermalSlowdown", 0x20),
                        ("HwThermalSlowdown", 0x40), ("HwPowerBrakeSlowdown", 0x80)):
        setattr(nv, prefix + suffix, bit)

    def call(name: str, value: object) -> object:
        if name in gpu.errors:
            raise NVMLError(gpu.errors[name])
        if name in gpu.unsupported or value is None:
            raise NVMLError_NotSupported()
        return value

    def init() -> None:
        if gpu.init_error is not None:
            raise NVMLError(gpu.init_error)

    def shutdown() -> None:
        gpu.shutdowns += 1

    def handle_by_index(index: int) -> str:
        gpu.opened.append(index)
        return call("nvmlDeviceGetHandleByIndex", f"handle-{index}")

    nv.nvmlInit = init
    nv.nvmlShutdown = shutdown
    nv.nvmlSystemGetDriverVersion = lambda: "570.86.15"
    nv.nvmlDeviceGetHandleByIndex = handle_by_index
    nv.nvmlDeviceGetName = lambda h: call("nvmlDeviceGetName", gpu.name)
    nv.nvmlDeviceGetUUID = lambda h: call("nvmlDeviceGetUUID", gpu.uuid)
    nv.nvmlDeviceGetMemoryInfo = lambda h: call(
        "nvmlDeviceGetMemoryInfo", types.SimpleNamespace(total=80 << 30, used=1 << 30, free=79 << 30)
    )
    nv.nvmlDeviceGetTemperature = lambda h, sensor: call("nvmlDeviceGetTemperature", gpu.temperature)
    nv.nvmlDeviceGetEccMode = lambda h: call("nvmlDeviceGetEccMode", gpu.ecc_mode)
    nv.nvmlDeviceGetTotalEccErrors = lambda h, kind, counter: call(
        "nvmlDeviceGetTotalEccErrors", gpu.ecc[(kind, counter)]
    )
    nv.nvmlDeviceGetRetiredPagesPendingStatus = lambda h: call(
        "nvmlDeviceGetRetiredPagesPendingStatus", gpu.retired_pending
    )
    nv.nvmlDeviceGetRemappedRows = lambda h: call("nvmlDeviceGetRemappedRows", gpu.remapped_rows)
    nv.NVML_GPU_FABRIC_STATE_COMPLETED = 3
    nv.c_nvmlGpuFabricInfoV_t = FabricInfo

    def fabric_info(handle: str, info: Any) -> int:  # pynvml's: NVML fills the caller's structure
        found = call("nvmlDeviceGetGpuFabricInfoV", gpu.fabric)
        for field, value in vars(found).items():
            setattr(info._obj, field, (ctypes.c_uint8 * 16)(*value) if field == "clusterUuid" else value)
        return 0

    nv.nvmlDeviceGetGpuFabricInfoV = fabric_info
    if gpu.old_binding:
        nv.nvmlDeviceGetCurrentClocksThrottleReasons = lambda h: call(
            "nvmlDeviceGetCurrentClocksThrottleReasons", gpu.reasons
        )
    else:
        nv.nvmlDeviceGetCurrentClocksEventReasons = lambda h: call(
            "nvmlDeviceGetCurrentClocksEventReasons", gpu.reasons
        )
        nv.nvmlDeviceGetCurrentClocksThrottleReasons = lambda h: call(
            "nvmlDeviceGetCurrentClocksThrottleReasons", gpu.reasons
        )
    return nv


@pytest.fixture
def gpu(monkeypatch: pytest.MonkeyPatch) -> FakeGPU:
    """A fake GPU behind a fake `pynvml`; tests edit the GPU, the module reads it at each call."""
    device = FakeGPU()
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(device))
    return device


def test_gpu_healthy(gpu: FakeGPU) -> None:
    r = only("gpu", make_ctx(gpu=2))
    assert (r.ok, r.skipped) == (True, False)
    assert gpu.opened == [2] and gpu.shutdowns == 1
    assert r.detail.startswith(f"GPU 2 ({gpu.uuid}) on {HOST}: NVIDIA H100 80GB HBM3, 41 C")
    assert r.data == {
        "index": 2,
        "name": "NVIDIA H100 80GB HBM3",
        "uuid": gpu.uuid,
        "driver_version": "570.86.15",
        "memory": {"total": 80 << 30, "used": 1 << 30, "free": 79 << 30},
        "temperature_c": 41,
        "fabric_state": "unsupported",  # an H100 outside an NVL72 rack has no multi-node NVLink fabric
        "ecc_mode": "enabled",
        "ecc_volatile_uncorrected": 0,
        "ecc_volatile_corrected": 7,
        "ecc_aggregate_uncorrected": 1,
        "retired_pages_pending": "unsupported",
        "remapped_rows": {"correctable": 0, "uncorrectable": 0, "pending": False, "failure": False},
        "clock_event_reasons": 1,
        "slowdown": [],
    }


def test_gpu_in_an_nvl72_rack_reports_its_fabric(gpu: FakeGPU) -> None:
    gpu.fabric = types.SimpleNamespace(clusterUuid=bytes(range(16)), cliqueId=7, state=3, status=0)
    r = only("gpu", make_ctx())
    assert r.ok and r.data["fabric"] == "000102030405060708090a0b0c0d0e0f/7"
    assert fabric_id([{"name": "gpu", "data": r.data}]) == "000102030405060708090a0b0c0d0e0f/7"
    gpu.fabric = types.SimpleNamespace(clusterUuid=bytes(16), cliqueId=0, state=1, status=0)  # still registering
    r = only("gpu", make_ctx())
    assert r.ok and r.data["fabric_state"].startswith("not registered") and fabric_id([{"name": "gpu", "data": r.data}]) is None


def test_gpu_without_an_imex_channel_fails_when_the_job_spans_racks(gpu: FakeGPU, tmp_path: Path) -> None:
    channels = tmp_path / "nvidia-caps-imex-channels"
    r = only("gpu", make_ctx(imex=True, imex_dir=str(channels)))
    assert not r.ok and "no IMEX channel for multi-node NVLink" in r.detail and "switch/nvidia_imex" in r.detail
    assert r.detail.startswith(f"GPU 2 on {HOST}:")
    channels.mkdir()
    (channels / "channel0").touch()
    assert only("gpu", make_ctx(imex=True, imex_dir=str(channels))).ok
    assert only("gpu", make_ctx(imex=False, imex_dir=str(tmp_path / "none"))).ok  # a job inside one tray needs none


def test_gpu_volatile_uncorrected_ecc_errors_fail(gpu: FakeGPU) -> None:
    gpu.ecc[(1, 0)] = 2
    r = only("gpu", make_ctx())
    assert (r.ok, r.skipped) == (False, False)
    assert r.detail == f"GPU 2 ({gpu.uuid}) on {HOST}: 2 volatile uncorrected ECC errors"
    assert r.data["ecc_volatile_uncorrected"] == 2


def test_gpu_ecc_disabled_is_not_counted(gpu: FakeGPU) -> None:
    gpu.ecc_mode = [0, 0]
    gpu.ecc[(1, 0)] = 5  # not read when ECC is off
    r = only("gpu", make_ctx())
    assert r.ok and r.data["ecc_mode"] == "disabled"
    assert "ecc_volatile_uncorrected" not in r.data


def test_gpu_pending_retired_pages_fail_on_older_gpus(gpu: FakeGPU) -> None:
    gpu.retired_pending = 1
    gpu.remapped_rows = None  # pre-Ampere: no row remapping
    r = only("gpu", make_ctx())
    assert not r.ok and not r.skipped
    assert "retired pages pending" in r.detail and HOST in r.detail
    assert r.data["retired_pages_pending"] is True
    assert r.data["remapped_rows"] == "unsupported"


@pytest.mark.parametrize(
    ("rows", "words"),
    [((0, 1, 1, 0), "row remapping pending"), ((0, 3, 0, 1), "row remapping failed")],
)
def test_gpu_remapped_rows_pending_or_failed(gpu: FakeGPU, rows: tuple, words: str) -> None:
    gpu.remapped_rows = rows
    r = only("gpu", make_ctx())
    assert not r.ok and words in r.detail
    assert r.data["remapped_rows"]["uncorrectable"] == rows[1]


def test_gpu_not_supported_calls_are_recorded_not_failed(gpu: FakeGPU) -> None:
    gpu.unsupported = {
        "nvmlDeviceGetMemoryInfo",
        "nvmlDeviceGetTemperature",
        "nvmlDeviceGetEccMode",
        "nvmlDeviceGetCurrentClocksEventReasons",
        "nvmlDeviceGetCurrentClocksThrottleReasons",
    }
    gpu.remapped_rows = None
    r = only("gpu", make_ctx())
    assert (r.ok, r.skipped) == (True, False)
    for key in ("memory", "temperature_c", "ecc_mode", "retired_pages_pending", "remapped_rows", "clock_event_reasons"):
        assert r.data[key] == "unsupported", key


def test_gpu_not_supported_known_only_by_error_code(gpu: FakeGPU) -> None:
    # Bindings whose error classes are not generated still carry the code.
    gpu.errors = {"nvmlDeviceGetTemperature": NOT_SUPPORTED}
    r = only("gpu", make_ctx())
    assert r.ok and r.data["temperature_c"] == "unsupported"


def test_gpu_thermal_throttling_fails(gpu: FakeGPU) -> None:
    gpu.reasons = 0x40 | 0x08 | 0x01
    r = only("gpu", make_ctx())
    assert not r.ok
    assert "clocks slowed: hw_slowdown, hw_thermal_slowdown" in r.detail
    assert r.data["slowdown"] == ["hw_slowdown", "hw_thermal_slowdown"]
    assert r.data["clock_event_reasons"] == 0x49


@pytest.mark.parametrize(("bit", "name"), [(0x20, "sw_thermal_slowdown"), (0x80, "hw_power_brake_slowdown")])
def test_gpu_other_slowdowns_fail(gpu: FakeGPU, bit: int, name: str) -> None:
    gpu.reasons = bit
    r = only("gpu", make_ctx())
    assert not r.ok and r.data["slowdown"] == [name]


def test_gpu_power_cap_is_not_a_fault(gpu: FakeGPU) -> None:
    gpu.reasons = 0x04
    assert only("gpu", make_ctx()).ok


def test_gpu_older_binding_uses_throttle_reasons(gpu: FakeGPU, monkeypatch: pytest.MonkeyPatch) -> None:
    gpu.old_binding = True
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(gpu))
    gpu.reasons = 0x20
    r = only("gpu", make_ctx())
    assert not r.ok and r.data["slowdown"] == ["sw_thermal_slowdown"]


def test_gpu_too_hot_fails(gpu: FakeGPU) -> None:
    gpu.temperature = 90
    r = only("gpu", make_ctx(max_gpu_temp_c=85))
    assert not r.ok and "temperature 90 C >= limit 85 C" in r.detail
    gpu.temperature = 85  # the limit itself fails
    assert not only("gpu", make_ctx(max_gpu_temp_c=85)).ok
    gpu.temperature = 84
    assert only("gpu", make_ctx(max_gpu_temp_c=85)).ok


@pytest.mark.parametrize("code", [LIBRARY_NOT_FOUND, DRIVER_NOT_LOADED])
def test_gpu_without_driver_is_skipped(gpu: FakeGPU, code: int) -> None:
    gpu.init_error = code
    r = only("gpu", make_ctx())
    assert (r.ok, r.skipped) == (True, True)
    assert r.detail.startswith(f"no NVIDIA driver on {HOST}")
    assert gpu.opened == []


def test_gpu_nvml_init_failing_otherwise_fails(gpu: FakeGPU) -> None:
    gpu.init_error = UNKNOWN
    r = only("gpu", make_ctx())
    assert (r.ok, r.skipped) == (False, False)
    assert r.detail == f"NVML failed to initialise on {HOST}: Unknown Error"


def test_gpu_lost_fails_naming_gpu_and_host(gpu: FakeGPU) -> None:
    gpu.errors = {"nvmlDeviceGetHandleByIndex": GPU_IS_LOST}
    r = only("gpu", make_ctx(gpu=6))
    assert not r.ok and r.detail == f"GPU 6 on {HOST}: NVML cannot open it: GPU is lost"
    assert gpu.shutdowns == 1


def test_gpu_error_in_one_query_fails(gpu: FakeGPU) -> None:
    gpu.errors = {"nvmlDeviceGetTemperature": GPU_IS_LOST}
    r = only("gpu", make_ctx())
    assert not r.ok and "temperature_c: GPU is lost" in r.detail
    assert r.data["temperature_c"] == "error: GPU is lost"


def test_gpu_without_pynvml_is_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import raises ImportError
    r = only("gpu", make_ctx())
    assert (r.ok, r.skipped) == (True, True) and "pynvml not importable" in r.detail


@pytest.mark.parametrize(
    ("changes", "words"),
    [
        ({"gpu_vendor": "emulated"}, "emulated GPU"),
        ({"gpu_vendor": "amd"}, "amdsmi checks not implemented"),
        ({"gpu": None}, "physical GPU index unknown"),
    ],
)
def test_gpu_skips(gpu: FakeGPU, changes: dict, words: str) -> None:
    r = only("gpu", make_ctx(**changes))
    assert (r.ok, r.skipped) == (True, True) and words in r.detail
    assert gpu.opened == []


def test_a_gpu_check_that_breaks_is_skipped_not_held_against_the_node(gpu: FakeGPU, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(handle: object) -> None:  # a binding whose signature changed: the same on every node
        raise TypeError("nvmlDeviceGetName() missing 1 required positional argument")

    monkeypatch.setattr(sys.modules["pynvml"], "nvmlDeviceGetName", broken)
    r = only("gpu", make_ctx())
    assert (r.ok, r.skipped) == (True, True) and failed([r]) == []
    assert r.detail == (f"gpu check on {HOST} could not run (raised TypeError: nvmlDeviceGetName() missing 1 required"
                        " positional argument); the node is not judged by it")
    assert r.data == {"exception": "TypeError", "message": "nvmlDeviceGetName() missing 1 required positional argument"}
    assert gpu.shutdowns == 1  # NVML is shut down even then


# --- nic -------------------------------------------------------------------------


@pytest.fixture
def sysfs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> types.SimpleNamespace:
    root = tmp_path / "sys"

    def ib(name: str, state: str | None = "4: ACTIVE", rate: str = "400 Gb/sec (4X NDR)") -> None:
        port = root / "class" / "infiniband" / name / "ports" / "1"
        port.mkdir(parents=True)
        if state is not None:
            (port / "state").write_text(state + "\n")
            (port / "rate").write_text(rate + "\n")

    def net(name: str, operstate: str) -> None:
        d = root / "class" / "net" / name
        d.mkdir(parents=True)
        (d / "operstate").write_text(operstate + "\n")

    monkeypatch.setattr(preflight_nic, "SYSFS", str(root))
    return types.SimpleNamespace(root=root, ib=ib, net=net)


def test_nic_present_and_up(sysfs: types.SimpleNamespace) -> None:
    sysfs.ib("mlx5_0")
    sysfs.ib("mlx5_1", state=None)  # no port files: presence is enough
    sysfs.net("eth0", "up")
    sysfs.net("lo", "unknown")
    ctx = make_ctx(nics=("mlx5_0", "mlx5_1", "eth0", "lo"), nic_kinds=("ib", "roce", "ethernet", "loopback"))
    r = only("nic", ctx)
    assert (r.ok, r.skipped) == (True, False), r.detail
    assert r.detail == f"NICs on {HOST}: mlx5_0 ACTIVE, mlx5_1 present, eth0 up, lo unknown"
    assert r.data["nics"][0] == {
        "name": "mlx5_0",
        "kind": "ib",
        "path": str(sysfs.root / "class/infiniband/mlx5_0"),
        "state": "ACTIVE",
        "rate": "400 Gb/sec (4X NDR)",
    }


def test_nic_missing_fails_naming_nic_and_host(sysfs: types.SimpleNamespace) -> None:
    sysfs.ib("mlx5_0")
    r = only("nic", make_ctx(nics=("mlx5_0", "mlx5_3"), nic_kinds=("ib", "ib")))
    assert not r.ok
    assert r.detail == f"on {HOST}: NIC mlx5_3 (ib) missing: no {sysfs.root}/class/infiniband/mlx5_3"
    assert r.data["nics"][1]["state"] is None


def test_nic_port_down_fails(sysfs: types.SimpleNamespace) -> None:
    sysfs.ib("mlx5_2", state="1: DOWN")
    r = only("nic", make_ctx(nics=("mlx5_2",), nic_kinds=("roce",)))
    assert not r.ok
    assert f"on {HOST}: NIC mlx5_2 (roce) port 1 is DOWN, not ACTIVE" in r.detail
    assert r.data["nics"][0]["state"] == "DOWN"


@pytest.mark.parametrize("state", ["down", "unknown", "lowerlayerdown"])
def test_ethernet_link_not_up_fails(sysfs: types.SimpleNamespace, state: str) -> None:
    sysfs.net("hsn0", state)
    r = only("nic", make_ctx(nics=("hsn0",), nic_kinds=("slingshot",)))
    assert not r.ok and f"NIC hsn0 (slingshot) link is {state}, not up" in r.detail and HOST in r.detail


def test_ethernet_nic_missing_fails(sysfs: types.SimpleNamespace) -> None:
    r = only("nic", make_ctx(nics=("eth9",), nic_kinds=("ethernet",)))
    assert not r.ok and f"NIC eth9 (ethernet) missing: no {sysfs.root}/class/net/eth9" in r.detail


def test_efa_found_as_rdma_device_or_netdev(sysfs: types.SimpleNamespace) -> None:
    sysfs.ib("rdmap16s27")
    sysfs.net("efa0", "up")
    assert only("nic", make_ctx(nics=("rdmap16s27", "efa0"), nic_kinds=("efa", "efa"))).ok
    r = only("nic", make_ctx(nics=("rdmap99s1",), nic_kinds=("efa",)))
    assert not r.ok and "class/infiniband/rdmap99s1 or" in r.detail


def test_nic_kinds_must_match_nics(sysfs: types.SimpleNamespace) -> None:
    r = only("nic", make_ctx(nics=("mlx5_0", "mlx5_1"), nic_kinds=("ib",)))
    assert not r.ok and "2 NICs but 1 kinds" in r.detail


def test_nic_of_unknown_kind_is_looked_up_in_both_places(sysfs: types.SimpleNamespace) -> None:
    # A plan row without kinds (GPU index unknown) still gets its NICs checked.
    sysfs.ib("mlx5_0")
    sysfs.net("eth0", "up")
    r = only("nic", make_ctx(nics=("mlx5_0", "eth0"), nic_kinds=()))
    assert r.ok and [n["kind"] for n in r.data["nics"]] == ["unknown", "unknown"]
    r = only("nic", make_ctx(nics=("mlx5_9",), nic_kinds=()))
    assert not r.ok and "NIC mlx5_9 (unknown) missing: no " in r.detail


def test_nic_skipped_without_nics() -> None:
    r = only("nic", make_ctx())
    assert (r.ok, r.skipped) == (True, True)


@pytest.mark.skipif(not os.path.exists("/sys/class/net/lo"), reason="no loopback in /sys")
def test_real_loopback_nic() -> None:
    r = only("nic", make_ctx(nics=("lo",), nic_kinds=("loopback",)))
    assert r.ok, r.detail


# --- cpu -------------------------------------------------------------------------


@pytest.fixture
def restore_affinity() -> Iterator[set[int]]:
    before = os.sched_getaffinity(0)
    yield before
    os.sched_setaffinity(0, before)


def test_cpu_matches_real_affinity(restore_affinity: set[int]) -> None:
    seen = frozenset(restore_affinity)
    r = only("cpu", make_ctx(expected_cpus=seen))
    assert (r.ok, r.skipped) == (True, False)
    assert r.data == {"expected": format_cpulist(seen), "seen": format_cpulist(seen)}


def test_cpu_narrower_real_affinity_fails(restore_affinity: set[int]) -> None:
    allowed = sorted(restore_affinity)
    expected = frozenset(allowed)
    if len(allowed) > 1:
        os.sched_setaffinity(0, {allowed[0]})
        seen = frozenset({allowed[0]})
    else:  # one CPU: the plan asks for one more than the process has
        expected = expected | {allowed[0] + 1}
        seen = frozenset(allowed)
    r = only("cpu", make_ctx(rank=5, expected_cpus=expected))
    assert (r.ok, r.skipped) == (False, False)
    assert r.detail.startswith(
        f"rank 5 on {HOST} runs on CPUs {format_cpulist(seen)} but the plan binds it to {format_cpulist(expected)}"
    )
    assert r.data["missing"] == format_cpulist(expected - seen) and r.data["extra"] == ""


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs")
def test_cpu_wider_real_affinity_fails(restore_affinity: set[int]) -> None:
    # An unbound rank (the launcher ignored the binding) sees more CPUs than planned.
    seen = frozenset(restore_affinity)
    expected = frozenset({min(seen)})
    r = only("cpu", make_ctx(expected_cpus=expected))
    assert not r.ok
    assert r.data["missing"] == "" and r.data["extra"] == format_cpulist(seen - expected)
    assert r.detail.endswith(f"(extra {format_cpulist(seen - expected)})")


def test_cpu_detail_uses_range_form(restore_affinity: set[int]) -> None:
    cpu = min(restore_affinity)
    os.sched_setaffinity(0, {cpu})
    expected = frozenset({cpu + 1000, cpu + 1001, cpu + 1002, cpu + 1003, cpu + 1008})
    r = only("cpu", make_ctx(expected_cpus=expected))
    assert not r.ok
    assert f"plan binds it to {cpu + 1000}-{cpu + 1003},{cpu + 1008} (missing " in r.detail
    assert f"extra {cpu})" in r.detail


def test_cpu_skipped_without_plan() -> None:
    assert only("cpu", make_ctx()).skipped


# --- memory ----------------------------------------------------------------------

MEMINFO = """MemTotal:       2113276880 kB
MemFree:        1982373316 kB
MemAvailable:   {avail} kB
Buffers:          123456 kB
Cached:          2345678 kB
HugePages_Total:       0
"""


def test_memory_enough(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "meminfo"
    path.write_text(MEMINFO.format(avail=2 * 1024 * 1024))  # 2 GiB
    monkeypatch.setattr(preflight_memory, "PROC_MEMINFO", str(path))
    r = only("memory", make_ctx())
    assert (r.ok, r.skipped) == (True, False)
    assert r.detail == f"{HOST}: 2.0 GiB available (need 1.0 GiB)"
    assert r.data == {
        "min_free_bytes": 1 << 30,
        "mem_total_bytes": 2113276880 * 1024,
        "mem_available_bytes": 2 << 30,
        "source": "MemAvailable",
    }


def test_memory_too_little_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "meminfo"
    path.write_text(MEMINFO.format(avail=512 * 1024))
    monkeypatch.setattr(preflight_memory, "PROC_MEMINFO", str(path))
    r = only("memory", make_ctx())
    assert not r.ok
    assert r.detail == f"{HOST}: only 512.0 MiB of host memory available, need 1.0 GiB"


def test_memory_without_memavailable_estimates(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "meminfo"
    path.write_text("MemTotal: 4096 kB\nMemFree: 1000 kB\nBuffers: 24 kB\nCached: 0 kB\n")
    monkeypatch.setattr(preflight_memory, "PROC_MEMINFO", str(path))
    r = only("memory", make_ctx(min_free_memory_bytes=1024 * 1024))
    assert r.ok and r.data["mem_available_bytes"] == 1024 * 1024
    assert r.data["source"] == "MemFree+Buffers+Cached"


def test_memory_real_proc_meminfo() -> None:
    r = only("memory", make_ctx(min_free_memory_bytes=1))
    assert r.ok and r.data["mem_available_bytes"] > 0
    r = only("memory", make_ctx(min_free_memory_bytes=1 << 60))
    assert not r.ok and r.detail.startswith(f"{HOST}: only ")


# --- dirs ------------------------------------------------------------------------


def test_dirs_created_and_writable(tmp_path: Path) -> None:
    scratch, ckpt = tmp_path / "scratch", tmp_path / "ckpt" / "run" / "deep"
    (tmp_path / "scratch").mkdir()
    r = only("dirs", make_ctx(dirs=(str(scratch), str(ckpt))))
    assert (r.ok, r.skipped) == (True, False)
    assert ckpt.is_dir()
    assert list(scratch.iterdir()) == [] and list(ckpt.iterdir()) == []  # the probe file is gone
    assert r.data == {"dirs": [{"path": str(scratch), "ok": True}, {"path": str(ckpt), "ok": True}]}


def test_dir_under_a_file_fails(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    bad = blocker / "ckpt"
    r = only("dirs", make_ctx(dirs=(str(tmp_path), str(bad))))
    assert not r.ok
    assert r.detail == f"directory {bad} is not writable on {HOST}: Not a directory (ENOTDIR)"
    assert r.data["dirs"][1] == {"path": str(bad), "ok": False, "error": "Not a directory (ENOTDIR)"}


def test_dir_that_is_a_file_fails_and_first_failure_is_named(tmp_path: Path) -> None:
    first, second = tmp_path / "a", tmp_path / "b"
    first.write_text("x")
    second.write_text("x")
    r = only("dirs", make_ctx(dirs=(str(first), str(second))))
    assert r.detail == f"directory {first} is not writable on {HOST}: Not a directory (ENOTDIR) (and 1 more)"


@pytest.fixture
def unwritable_dir(tmp_path: Path) -> Iterator[Path]:
    """A directory this process cannot create files in, even as root (immutable flag), else by mode."""
    d = tmp_path / "locked"
    d.mkdir()
    chattr = shutil.which("chattr")
    immutable = False
    if chattr and subprocess.run([chattr, "+i", str(d)], capture_output=True).returncode == 0:
        immutable = True
    elif os.geteuid() != 0:
        d.chmod(0o555)
    else:
        pytest.skip("cannot make a directory unwritable for root here (no immutable attribute)")
    try:
        yield d
    finally:
        if immutable:
            subprocess.run([chattr, "-i", str(d)], check=True)
        d.chmod(0o755)


def test_unwritable_existing_dir_fails(unwritable_dir: Path) -> None:
    r = only("dirs", make_ctx(dirs=(str(unwritable_dir),)))
    assert not r.ok
    assert r.detail.startswith(f"directory {unwritable_dir} is not writable on {HOST}: ")
    assert r.detail.endswith(("(EPERM)", "(EACCES)"))
    assert list(unwritable_dir.iterdir()) == []


def test_dirs_skipped_when_none() -> None:
    assert only("dirs", make_ctx()).skipped


# --- shared_fs -------------------------------------------------------------------


def test_write_shared_marker_is_atomic_and_named_by_the_attempt_not_its_token(tmp_path: Path) -> None:
    path = write_shared_marker(str(tmp_path / "ckpt"), "a1b2c3")
    named = ".clusterctl-shared-" + sharedmarker.marker_id("a1b2c3")
    assert path == str(tmp_path / "ckpt" / named)
    assert open(path).read() == sharedmarker.marker_id("a1b2c3")  # the token is neither its name nor its content
    assert os.listdir(tmp_path / "ckpt") == [named]  # no temporary left behind
    with pytest.raises(ValueError):
        write_shared_marker(str(tmp_path), "")


def test_shared_marker_present(tmp_path: Path) -> None:
    path = write_shared_marker(str(tmp_path), "tok-7")
    r = only("shared_fs", make_ctx(shared_marker=path, shared_token="tok-7"))
    assert (r.ok, r.skipped) == (True, False)
    assert r.data == {"marker": path, "found": True, "token_checked": True, "token_matches": True}


def test_shared_marker_missing_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(preflight_sharedfs, "SHARED_MARKER_WAIT_S", 0.0)
    path = str(tmp_path / ".clusterctl-shared-tok-7")
    r = only("shared_fs", make_ctx(shared_marker=path, shared_token="tok-7"))
    assert (r.ok, r.skipped) == (False, False)
    assert r.detail == f"checkpoint directory is not shared with the first node: marker {path} missing on {HOST}"
    assert r.data == {"marker": path, "found": False}


def test_shared_marker_wrong_token_fails(tmp_path: Path) -> None:
    path = tmp_path / "marker"
    path.write_text(sharedmarker.marker_id("tok-6"))
    r = only("shared_fs", make_ctx(shared_marker=str(path), shared_token="tok-7"))
    assert not r.ok
    assert r.detail == (
        f"checkpoint directory is not shared with the first node: marker {path} on {HOST} holds another attempt's id"
        f" ('{sharedmarker.marker_id('tok-6')}', expected '{sharedmarker.marker_id('tok-7')}')"
    )
    assert "tok-7" not in r.detail
    assert r.data["token_matches"] is False


def test_shared_marker_appearing_late_is_waited_for(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(preflight_sharedfs, "SHARED_MARKER_WAIT_S", 5.0)
    target = sharedmarker.marker_path(str(tmp_path), "late")
    timer = threading.Timer(0.15, write_shared_marker, args=(str(tmp_path), "late"))
    timer.start()
    try:
        started = time.monotonic()
        r = only("shared_fs", make_ctx(shared_marker=target, shared_token="late"))
    finally:
        timer.join()
    assert r.ok and time.monotonic() - started < 2


def test_shared_fs_skipped_without_marker() -> None:
    r = only("shared_fs", make_ctx())
    assert (r.ok, r.skipped) == (True, True)


# --- run_checks ------------------------------------------------------------------


def test_run_checks_in_order_and_failed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(preflight_sharedfs, "SHARED_MARKER_WAIT_S", 0.0)
    ctx = make_ctx(
        gpu_vendor="emulated",
        expected_cpus=frozenset(os.sched_getaffinity(0)),
        dirs=(str(tmp_path),),
        shared_marker=str(tmp_path / "absent"),
        shared_token="t",
    )
    results = run_checks(["shared_fs", "gpu", "cpu", "dirs", "memory"], ctx)
    assert [r.name for r in results] == ["shared_fs", "gpu", "cpu", "dirs", "memory"]
    assert [r.name for r in failed(results)] == ["shared_fs"]
    assert results[1].skipped and results[1].ok
    assert run_checks([], ctx) == []


def test_a_check_that_raises_is_skipped_and_the_checks_after_it_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(preflight_memory, "PROC_MEMINFO", str(tmp_path / "no-such-meminfo"))
    results = run_checks(["memory", "cpu"], make_ctx())
    assert results[0].ok is True and results[0].skipped is True
    assert results[0].detail.startswith(f"memory check on {HOST} could not run (raised FileNotFoundError: ")
    assert results[0].data["exception"] == "FileNotFoundError"
    assert results[1].skipped  # the checks after it still ran
    assert failed(results) == []


@pytest.mark.parametrize("name", ["comm", "compute"])
def test_post_rendezvous_checks_are_rejected(name: str) -> None:
    with pytest.raises(ValueError, match=f"check '{name}' runs after rendezvous"):
        run_checks(["memory", name], make_ctx())


def test_unknown_check_is_rejected_before_any_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ctx = make_ctx(dirs=(str(tmp_path / "made-only-if-dirs-runs"),))
    with pytest.raises(ValueError, match=r"unknown preflight check 'gpus'; known checks: gpu, nic, cpu"):
        run_checks(["dirs", "gpus"], ctx)
    assert not (tmp_path / "made-only-if-dirs-runs").exists()
    with pytest.raises(TypeError):
        run_checks("gpu", ctx)  # type: ignore[arg-type]


def test_import_needs_only_the_standard_library() -> None:
    code = (
        "import sys; import clusterctl.runtime.rank.preflight; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] not in sys.stdlib_module_names "
        "and not m.startswith(('clusterctl', '_distutils_hack', '__editable__')) and m != '__main__'))"
    )
    out = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True,
                         cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))), check=True)
    assert out.stdout.strip() == "[]"


def test_errno_text_names_the_code() -> None:
    assert preflight_common._errno_text(errno.EROFS) == "Read-only file system (EROFS)"


@pytest.mark.skipif(not os.path.exists("/sys/class/net/lo"), reason="no loopback in /sys")
def test_lab_site_nics_pass_and_a_missing_nic_fails_with_81() -> None:
    """The slurm-lab site names the NIC its nodes have; a NIC no node has fails the job, naming NIC and host."""
    from clusterctl.config.site import load_site
    from clusterctl.exitcodes import ExitCode
    from clusterctl.plan.binding import binding_table
    from clusterctl.runtime.controller.admission import judge

    site, _ = load_site("slurm-lab")
    (node_type,) = site.node_types.values()
    for row in binding_table(node_type):
        lab = make_ctx(nics=tuple(row.nics.split(",")), nic_kinds=tuple(row.nic_kinds.split(",")))
        r = only("nic", lab)
        assert (r.ok, r.skipped) == (True, False), r.detail
        assert r.detail.startswith(f"NICs on {HOST}: lo ")
    bogus = "mlx5_nosuch9"
    assert not os.path.exists(f"{preflight_nic.SYSFS}/class/infiniband/{bogus}")
    r = only("nic", dataclasses.replace(lab, nics=("lo", bogus), nic_kinds=("loopback", "ib")))
    assert not r.ok
    assert r.detail == f"on {HOST}: NIC {bogus} (ib) missing: no {preflight_nic.SYSFS}/class/infiniband/{bogus}"
    # What the controller makes of it: exit 81 (preflight failed), the node and the NIC named.
    versions = {"torch": "2.13.0", "cuda": None, "nccl": None, "hip": None}
    checks = {"node06": [], HOST: [{"name": r.name, "ok": r.ok, "detail": r.detail}]}
    records = {
        rank: {"rank": rank, "world_size": 2, "host": host, "pid": 100 + rank, "versions": versions,
               "proof": registration_proof("t", rank, host, 100 + rank), "preflight": checks[host]}
        for rank, host in enumerate(["node06", HOST])
    }
    verdict = judge(records, {}, world_size=2, hosts=["node06", HOST], gpus_per_node=1, token="t")
    assert verdict.code == ExitCode.PREFLIGHT_FAILED == 81
    assert verdict.message == f"preflight failed on 1 node(s): {HOST}: rank 1 nic: {r.detail}"
    assert verdict.evidence == {"nodes": [HOST]}
