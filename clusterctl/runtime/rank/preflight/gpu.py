"""The `gpu` check: NVML health of the rank's GPU (ECC, retirements and remaps, temperature, slowdowns).

The largest check, and the only one with an optional dependency: `pynvml`
(nvidia-ml-py) is imported inside `check_gpu`, never at import time, and
without it or without a driver the check is skipped. `slowdown_reasons` is
shared with the aggregators' GPU sampling (runtime/node/gpusample.py).
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from typing import Any

from clusterctl.runtime.rank.preflight.common import _one_line, _skip
from clusterctl.runtime.rank.preflight.context import CheckResult, PreflightContext

UNSUPPORTED = "unsupported"

# Clock event bits that mean the hardware or driver is slowing the GPU against
# the job's wishes (power caps, idle and application clocks are not faults).
# Values are NVML's; the constants are looked up under both spellings first.
_BAD_CLOCK_REASONS: tuple[tuple[str, str, int], ...] = (
    ("hw_slowdown", "HwSlowdown", 0x08),
    ("sw_thermal_slowdown", "SwThermalSlowdown", 0x20),
    ("hw_thermal_slowdown", "HwThermalSlowdown", 0x40),
    ("hw_power_brake_slowdown", "HwPowerBrakeSlowdown", 0x80),
)

_NVML_NOT_SUPPORTED = 3
_NVML_DRIVER_NOT_LOADED = 9
_NVML_LIBRARY_NOT_FOUND = 12
_NVML_FUNCTION_NOT_FOUND = 13


def check_gpu(ctx: PreflightContext) -> CheckResult:
    """NVML health of this rank's GPU: ECC, pending retirements, temperature, throttling.

    These faults do not stop CUDA from starting, so without this check they
    surface later as NaNs, Xid crashes or one slow rank holding back the job.
    """
    if ctx.gpu_vendor == "emulated":
        return _skip("gpu", "emulated GPU: no hardware to check")
    if ctx.gpu_vendor == "amd":
        return _skip("gpu", "amdsmi checks not implemented")
    if ctx.gpu_vendor != "nvidia":
        return _skip("gpu", f"no GPU checks for vendor '{ctx.gpu_vendor}'")
    if ctx.gpu is None:
        return _skip("gpu", f"physical GPU index unknown on {ctx.host} (CLUSTERCTL_GPU not set)")
    missing = imex_problem(ctx)
    if missing:
        return CheckResult("gpu", False, False, _one_line(f"GPU {ctx.gpu} on {ctx.host}: {missing}"),
                           {"index": ctx.gpu, "imex_channel": None})
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the old `pynvml` wrapper package warns on import
            import pynvml  # noqa: PLC0415 - optional, imported only where a GPU is checked
    except ImportError:
        return _skip("gpu", "pynvml not importable (install nvidia-ml-py): GPU health not checked")

    nvml_error: type[BaseException] = getattr(pynvml, "NVMLError", Exception)
    try:
        pynvml.nvmlInit()
    except nvml_error as exc:
        code = getattr(exc, "value", None)
        no_driver = (
            getattr(pynvml, "NVML_ERROR_LIBRARY_NOT_FOUND", _NVML_LIBRARY_NOT_FOUND),
            getattr(pynvml, "NVML_ERROR_DRIVER_NOT_LOADED", _NVML_DRIVER_NOT_LOADED),
        )
        if code in no_driver:
            return _skip("gpu", f"no NVIDIA driver on {ctx.host} (nvmlInit: {_text(exc)}): GPU health not checked")
        return CheckResult(
            "gpu",
            ok=False,
            skipped=False,
            detail=_one_line(f"NVML failed to initialise on {ctx.host}: {_text(exc)}"),
            data={"index": ctx.gpu, "nvml_init": _text(exc)},
        )
    try:
        return _inspect_gpu(pynvml, nvml_error, ctx)
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:  # noqa: BLE001 - shutdown trouble says nothing about the GPU
            pass


def _inspect_gpu(nvml: Any, nvml_error: type[BaseException], ctx: PreflightContext) -> CheckResult:
    data: dict[str, Any] = {"index": ctx.gpu}
    where = f"GPU {ctx.gpu} on {ctx.host}"
    try:
        handle = nvml.nvmlDeviceGetHandleByIndex(ctx.gpu)
    except nvml_error as exc:
        data["handle"] = f"error: {_text(exc)}"
        return CheckResult("gpu", False, False, _one_line(f"{where}: NVML cannot open it: {_text(exc)}"), data)

    problems: list[str] = []

    def query(key: str, function: str, *args: Any) -> Any:
        """One NVML call: the value, or None with data[key] saying why not."""
        fn = getattr(nvml, function, None)
        if fn is None:
            data[key] = UNSUPPORTED
            return None
        try:
            return fn(handle, *args)
        except nvml_error as exc:
            if _not_supported(nvml, exc):
                data[key] = UNSUPPORTED
            else:
                data[key] = f"error: {_text(exc)}"
                problems.append(f"{key}: {_text(exc)}")
            return None

    name = query("name", "nvmlDeviceGetName")
    if name is not None:
        data["name"] = _str(name)
    uuid = query("uuid", "nvmlDeviceGetUUID")
    if uuid is not None:
        data["uuid"] = _str(uuid)
    try:
        data["driver_version"] = _str(nvml.nvmlSystemGetDriverVersion())
    except (nvml_error, AttributeError):
        data["driver_version"] = UNSUPPORTED
    if uuid is not None:
        where = f"GPU {ctx.gpu} ({data['uuid']}) on {ctx.host}"

    memory = query("memory", "nvmlDeviceGetMemoryInfo")
    if memory is not None:
        data["memory"] = {k: int(getattr(memory, k)) for k in ("total", "used", "free")}

    temperature = query("temperature_c", "nvmlDeviceGetTemperature", getattr(nvml, "NVML_TEMPERATURE_GPU", 0))
    if temperature is not None:
        data["temperature_c"] = int(temperature)
        if temperature >= ctx.max_gpu_temp_c:
            problems.append(f"temperature {int(temperature)} C >= limit {ctx.max_gpu_temp_c} C")

    _fabric(nvml, query, data)
    _check_ecc(nvml, query, data, problems)
    _check_retirement(nvml, query, data, problems)
    _check_clocks(nvml, query, data, problems)

    if problems:
        return CheckResult("gpu", False, False, _one_line(f"{where}: " + "; ".join(problems)), data)
    summary = [data.get("name", "?")]
    if "temperature_c" in data and data["temperature_c"] != UNSUPPORTED:
        summary.append(f"{data['temperature_c']} C")
    summary.append("no uncorrected ECC errors, no pending retirements, no slowdown")
    return CheckResult("gpu", True, False, _one_line(f"{where}: " + ", ".join(str(s) for s in summary)), data)


def imex_problem(ctx: PreflightContext) -> str | None:
    """Why this node cannot give the job multi-node NVLink memory, or None. Without an IMEX channel device
    CUDA's multi-node NVLink calls fail with a permission error, long after start; Slurm's switch/nvidia_imex
    creates one per job (inside a container, enroot 4.0.0 or later shows it)."""
    if not ctx.imex:
        return None
    try:
        channels = sorted(n for n in os.listdir(ctx.imex_dir) if n.startswith("channel"))
    except OSError:
        channels = []
    usable = [n for n in channels if os.access(os.path.join(ctx.imex_dir, n), os.R_OK | os.W_OK)]
    if usable:
        return None
    found = f"{len(channels)} channel(s) there, none this user may open" if channels else "none there"
    return (f"no IMEX channel for multi-node NVLink ({ctx.imex_dir}/channel*: {found}); the site's Slurm"
            " gives each job one with SwitchType=switch/nvidia_imex")


# NVML fills a structure the caller makes (pynvml passes it on as given): the versioned call first, then the
# one CUDA 13 deprecates. Each pair: (function, structure).
FABRIC_CALLS = (("nvmlDeviceGetGpuFabricInfoV", "c_nvmlGpuFabricInfoV_t"),
                ("nvmlDeviceGetGpuFabricInfo", "c_nvmlGpuFabricInfo_t"))


def _fabric(nvml: Any, query: Callable[..., Any], data: dict[str, Any]) -> None:
    """The GPU's NVLink fabric identity (cluster UUID and clique) in data["fabric"]: GPUs with the same one share a
    multi-node NVLink domain (an NVL72 rack), and the controller compares it across each NVLink-bound group.
    Anything else (no fabric on this GPU, one still registering, an error) goes to data["fabric_state"]."""
    import ctypes  # noqa: PLC0415 - only where a GPU is checked

    for function, structure in FABRIC_CALLS:
        if getattr(nvml, function, None) is not None and getattr(nvml, structure, None) is not None:
            info = getattr(nvml, structure)()
            if query("fabric_state", function, ctypes.byref(info)) is None:
                return
            break
    else:
        data["fabric_state"] = UNSUPPORTED
        return
    state, completed = getattr(info, "state", None), getattr(nvml, "NVML_GPU_FABRIC_STATE_COMPLETED", 3)
    if state != completed or getattr(info, "status", 0) != 0:
        data["fabric_state"] = f"not registered (state {state}, status {getattr(info, 'status', None)})"
        return
    data["fabric"] = f"{bytes(info.clusterUuid).hex()}/{int(getattr(info, 'cliqueId', 0))}"


def fabric_id(checks: list[dict[str, Any]]) -> str | None:
    """A registration's fabric identity from its gpu check's data, when the GPU has one."""
    gpu = next((c for c in checks if c.get("name") == "gpu"), {})
    value = (gpu.get("data") or {}).get("fabric")
    return value if isinstance(value, str) else None


def _check_ecc(nvml: Any, query: Callable[..., Any], data: dict[str, Any], problems: list[str]) -> None:
    mode = query("ecc_mode", "nvmlDeviceGetEccMode")
    if mode is None:
        return
    current = mode[0] if isinstance(mode, (list, tuple)) else mode
    enabled = current == getattr(nvml, "NVML_FEATURE_ENABLED", 1)
    data["ecc_mode"] = "enabled" if enabled else "disabled"
    if not enabled:
        return
    uncorrected = getattr(nvml, "NVML_MEMORY_ERROR_TYPE_UNCORRECTED", 1)
    corrected = getattr(nvml, "NVML_MEMORY_ERROR_TYPE_CORRECTED", 0)
    volatile = getattr(nvml, "NVML_VOLATILE_ECC", 0)
    aggregate = getattr(nvml, "NVML_AGGREGATE_ECC", 1)
    counts = {
        "ecc_volatile_uncorrected": (uncorrected, volatile),
        "ecc_volatile_corrected": (corrected, volatile),
        "ecc_aggregate_uncorrected": (uncorrected, aggregate),
    }
    for key, (error_type, counter) in counts.items():
        value = query(key, "nvmlDeviceGetTotalEccErrors", error_type, counter)
        if value is not None:
            data[key] = int(value)
    if isinstance(data.get("ecc_volatile_uncorrected"), int) and data["ecc_volatile_uncorrected"] > 0:
        problems.append(f"{data['ecc_volatile_uncorrected']} volatile uncorrected ECC errors")


def _check_retirement(nvml: Any, query: Callable[..., Any], data: dict[str, Any], problems: list[str]) -> None:
    # Pre-Ampere GPUs retire pages, Ampere and later remap rows; each reports
    # NotSupported for the other, so both are asked.
    pending = query("retired_pages_pending", "nvmlDeviceGetRetiredPagesPendingStatus")
    if pending is not None:
        is_pending = int(pending) == getattr(nvml, "NVML_FEATURE_ENABLED", 1)
        data["retired_pages_pending"] = is_pending
        if is_pending:
            problems.append("retired pages pending (reset the GPU)")
    rows = query("remapped_rows", "nvmlDeviceGetRemappedRows")
    if rows is not None:
        correctable, uncorrectable, rows_pending, rows_failed = (int(v) for v in rows)
        data["remapped_rows"] = {
            "correctable": correctable,
            "uncorrectable": uncorrectable,
            "pending": bool(rows_pending),
            "failure": bool(rows_failed),
        }
        if rows_failed:
            problems.append("row remapping failed (the GPU needs service)")
        elif rows_pending:
            problems.append("row remapping pending (reset the GPU)")


def _check_clocks(nvml: Any, query: Callable[..., Any], data: dict[str, Any], problems: list[str]) -> None:
    reasons = query("clock_event_reasons", "nvmlDeviceGetCurrentClocksEventReasons")
    if reasons is None and data.get("clock_event_reasons") == UNSUPPORTED:
        # Older bindings or drivers know only the earlier name of the same call.
        del data["clock_event_reasons"]
        reasons = query("clock_event_reasons", "nvmlDeviceGetCurrentClocksThrottleReasons")
    if reasons is None:
        return
    mask = int(reasons)
    data["clock_event_reasons"] = mask
    active = slowdown_reasons(nvml, mask)
    data["slowdown"] = active
    if active:
        problems.append("clocks slowed: " + ", ".join(active))


def slowdown_reasons(nvml: Any, mask: int) -> list[str]:
    """The clock event bits in `mask` that are faults (thermal, power brake, hardware slowdown)."""
    return [
        key
        for key, suffix, default in _BAD_CLOCK_REASONS
        if mask
        & int(
            getattr(nvml, f"nvmlClocksEventReason{suffix}", None)
            or getattr(nvml, f"nvmlClocksThrottleReason{suffix}", None)
            or default
        )
    ]


def _not_supported(nvml: Any, exc: BaseException) -> bool:
    """NotSupported (or a call the driver lacks): a fact about the GPU model, not a fault."""
    cls = getattr(nvml, "NVMLError_NotSupported", None)
    if isinstance(cls, type) and isinstance(exc, cls):
        return True
    codes = (
        getattr(nvml, "NVML_ERROR_NOT_SUPPORTED", _NVML_NOT_SUPPORTED),
        getattr(nvml, "NVML_ERROR_FUNCTION_NOT_FOUND", _NVML_FUNCTION_NOT_FOUND),
    )
    return getattr(exc, "value", None) in codes


def _text(exc: BaseException) -> str:
    """An exception's message; NVMLError's str() can itself fail without a library."""
    try:
        text = str(exc)
    except Exception:  # noqa: BLE001
        text = ""
    return text or type(exc).__name__


def _str(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
