"""Per-rank preflight checks, run on every rank before rendezvous completes.

A bad node is cheapest to find before thousands of ranks wait on it: a GPU
with uncorrected ECC errors, a NIC whose port is down, a rank bound to the
wrong CPUs or a checkpoint directory that is not shared would otherwise show
up minutes later as a hang or a lost checkpoint. Each check returns one line a
person reads, naming the rank's host, and a dict of facts for the run
manifest.

Standard library only at import time: this runs in every rank before the
training script, so it must start fast. nvidia-ml-py's `pynvml` is imported
inside the GPU check, and torch is never imported here. The checks that need
the process group ("comm", "compute") run after rendezvous, elsewhere.
"""

from __future__ import annotations

import errno
import os
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from clusterctl.syntax.cpulist import format_cpulist

# Filesystem roots, module-level so tests can point them at fake trees.
SYSFS = "/sys"
PROC_MEMINFO = "/proc/meminfo"

# How long shared_fs waits for the first node's marker to appear before
# failing: some network filesystems publish a new file to other clients with a
# short delay. Only a node that fails the check pays it.
SHARED_MARKER_WAIT_S = 3.0

MARKER_PREFIX = ".clusterctl-shared-"

CHECKS: tuple[str, ...] = ("gpu", "nic", "cpu", "memory", "dirs", "shared_fs")
POST_RENDEZVOUS: tuple[str, ...] = ("comm", "compute")

UNSUPPORTED = "unsupported"


@dataclass(frozen=True)
class PreflightContext:
    """What one rank must find on its node, as the plan and the wrapper say."""

    rank: int
    local_rank: int
    host: str  # SLURMD_NODENAME (emulated nodes share one hostname)
    gpu: int | None  # physical GPU index from the wrapper (CLUSTERCTL_GPU), None if unknown
    gpu_vendor: str  # "nvidia", "amd", "emulated"
    expected_cpus: frozenset[int]  # the CPU set the plan binds this rank to (empty: unknown)
    nics: tuple[str, ...]  # NIC names the plan gives this rank
    nic_kinds: tuple[str, ...]  # matching kinds: ib, roce, ethernet, efa, slingshot, loopback
    dirs: tuple[str, ...]  # directories that must be writable
    shared_marker: str | None  # marker the first node wrote in the checkpoint dir; None: skip
    shared_token: str | None  # the content the marker must have (the attempt token)
    min_free_memory_bytes: int = 1 << 30
    max_gpu_temp_c: int = 85


@dataclass(frozen=True)
class CheckResult:
    """One check's verdict: `ok` decides, `detail` explains, `data` goes to the manifest."""

    name: str
    ok: bool
    skipped: bool  # the check does not apply here (no GPU, no NVML); ok stays True
    detail: str
    data: dict[str, Any]


def run_checks(names: Sequence[str], ctx: PreflightContext) -> list[CheckResult]:
    """Run the named checks in order.

    Every name is validated before any check runs, so a typo in the spec fails
    at once rather than after slow checks. A check that raises becomes a failed
    result naming the exception: one broken probe must not hide the others.
    """
    if isinstance(names, str):
        raise TypeError("names must be a sequence of check names, not one string")
    for name in names:
        if name in POST_RENDEZVOUS:
            raise ValueError(
                f"check '{name}' runs after rendezvous (it needs the process group), "
                f"not in preflight; preflight checks are: {', '.join(CHECKS)}"
            )
        if name not in _CHECKS:
            raise ValueError(f"unknown preflight check '{name}'; known checks: {', '.join(CHECKS)}")
    results: list[CheckResult] = []
    for name in names:
        try:
            result = _CHECKS[name](ctx)
        except Exception as exc:  # noqa: BLE001 - a failing probe is a failed check, never a crash
            result = CheckResult(
                name=name,
                ok=False,
                skipped=False,
                detail=_one_line(f"{name} check on {ctx.host} raised {type(exc).__name__}: {exc}"),
                data={"exception": type(exc).__name__, "message": str(exc)},
            )
        results.append(result)
    return results


def failed(results: Sequence[CheckResult]) -> list[CheckResult]:
    """The results that fail the rank (skipped ones never do)."""
    return [r for r in results if not r.ok]


def write_shared_marker(directory: str, token: str, replaces: Sequence[str] = ()) -> str:
    """Write `<directory>/.clusterctl-shared-<token>` holding the token; return its path.

    The first node writes it before ranks start; every other node then proves
    it sees the same directory. Written under a temporary name, fsynced and
    renamed (parent fsynced too), so no node ever reads a torn marker.

    `replaces` names, by token, markers that earlier attempts of the same run
    left in this directory: once the new marker is in place they are removed
    (only `<directory>/.clusterctl-shared-<token>` for those tokens, never
    anything matched by pattern: another run may share the directory).
    """
    if not _marker_token_ok(token):
        raise ValueError(f"attempt token {token!r} cannot be part of a file name")
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, MARKER_PREFIX + token)
    tmp = f"{path}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, token.encode("utf-8"))
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    _fsync_dir(directory)
    for old in set(replaces):
        if old != token and _marker_token_ok(old):
            try:
                os.unlink(os.path.join(directory, MARKER_PREFIX + old))
            except OSError:  # gone already, or not ours to remove: the new marker counts, not the old ones
                pass
    return path


def _marker_token_ok(token: str) -> bool:
    return bool(token) and "/" not in token and "\0" not in token and token not in (".", "..")


# --- gpu ---------------------------------------------------------------------

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


# --- nic ---------------------------------------------------------------------

_RDMA_KINDS = ("ib", "roce")


def check_nic(ctx: PreflightContext) -> CheckResult:
    """Every NIC the plan gives this rank exists, and its port or link is up.

    NCCL given a missing HCA falls back to another (or to TCP) without an
    error, so a dead rail otherwise shows up only as a slow job.
    """
    if not ctx.nics:
        return _skip("nic", "no NICs in the plan for this rank")
    kinds = tuple(ctx.nic_kinds) or ("unknown",) * len(ctx.nics)
    if len(kinds) != len(ctx.nics):
        return CheckResult(
            "nic",
            ok=False,
            skipped=False,
            detail=f"the plan gives {len(ctx.nics)} NICs but {len(ctx.nic_kinds)} kinds: {', '.join(ctx.nics)}",
            data={"nics": list(ctx.nics), "kinds": list(ctx.nic_kinds)},
        )
    seen: list[dict[str, Any]] = []
    problems: list[str] = []
    for nic, kind in zip(ctx.nics, kinds):
        fact, problem = _probe_nic(nic, kind)
        seen.append(fact)
        if problem:
            problems.append(f"NIC {nic} ({kind}) {problem}")
    data = {"nics": seen}
    if problems:
        return CheckResult("nic", False, False, _one_line(f"on {ctx.host}: " + "; ".join(problems)), data)
    states = ", ".join(f"{f['name']} {f['state']}" for f in seen)
    return CheckResult("nic", True, False, f"NICs on {ctx.host}: {states}", data)


def _probe_nic(nic: str, kind: str) -> tuple[dict[str, Any], str | None]:
    fact: dict[str, Any] = {"name": nic, "kind": kind}
    if not nic or "/" in nic or nic in (".", ".."):
        fact["state"] = None
        return fact, "is not a valid device name"
    ib_dir = os.path.join(SYSFS, "class", "infiniband", nic)
    net_dir = os.path.join(SYSFS, "class", "net", nic)
    # EFA devices are RDMA devices (rdmapXsY) but a plan may also name their
    # netdev, so both places are accepted for them, and for a NIC of unknown kind.
    either = kind in ("efa", "unknown")
    if kind in _RDMA_KINDS or (either and os.path.isdir(ib_dir)):
        fact["path"] = ib_dir
        if not os.path.isdir(ib_dir):
            fact["state"] = None
            return fact, f"missing: no {ib_dir}"
        state = _read(os.path.join(ib_dir, "ports", "1", "state"))
        rate = _read(os.path.join(ib_dir, "ports", "1", "rate"))
        if rate is not None:
            fact["rate"] = rate
        if state is None:
            fact["state"] = "present"
            return fact, None
        # sysfs writes "4: ACTIVE"
        word = state.split(":", 1)[-1].strip()
        fact["state"] = word
        if word != "ACTIVE":
            return fact, f"port 1 is {word}, not ACTIVE ({os.path.join(ib_dir, 'ports', '1', 'state')})"
        return fact, None
    fact["path"] = net_dir
    if not os.path.isdir(net_dir):
        fact["state"] = None
        where = f"no {ib_dir} or {net_dir}" if either else f"no {net_dir}"
        return fact, f"missing: {where}"
    operstate = _read(os.path.join(net_dir, "operstate"))
    fact["state"] = operstate if operstate is not None else "present"
    if operstate is None:
        return fact, None
    allowed = ("up", "unknown") if (kind == "loopback" or nic == "lo") else ("up",)
    if operstate not in allowed:
        return fact, f"link is {operstate}, not up ({os.path.join(net_dir, 'operstate')})"
    return fact, None


# --- cpu ---------------------------------------------------------------------


def check_cpu(ctx: PreflightContext) -> CheckResult:
    """The rank runs on exactly the CPUs the plan binds it to.

    A binding lost to a container runtime, a cgroup or a launcher that ignores
    numactl puts data-loader threads on another socket's memory: slow, silent.
    """
    if not ctx.expected_cpus:
        return _skip("cpu", "the plan gives no CPU set for this rank")
    seen = frozenset(os.sched_getaffinity(0))
    expected = frozenset(ctx.expected_cpus)
    data = {"expected": format_cpulist(expected), "seen": format_cpulist(seen)}
    if seen == expected:
        return CheckResult("cpu", True, False, f"rank {ctx.rank} on {ctx.host} bound to CPUs {data['seen']}", data)
    missing, extra = expected - seen, seen - expected
    data["missing"] = format_cpulist(missing)
    data["extra"] = format_cpulist(extra)
    parts = []
    if missing:
        parts.append(f"missing {data['missing']}")
    if extra:
        parts.append(f"extra {data['extra']}")
    detail = (
        f"rank {ctx.rank} on {ctx.host} runs on CPUs {data['seen']} but the plan binds it to "
        f"{data['expected']} ({', '.join(parts)})"
    )
    return CheckResult("cpu", False, False, detail, data)


# --- memory ------------------------------------------------------------------


def check_memory(ctx: PreflightContext) -> CheckResult:
    """The node has the free host memory a rank needs to start.

    A node still holding a previous job's memory (a leaked process, a full
    tmpfs) gets OOM-killed mid-step, which costs a whole restart.
    """
    fields = _meminfo(PROC_MEMINFO)
    data: dict[str, Any] = {"min_free_bytes": ctx.min_free_memory_bytes}
    if "MemTotal" in fields:
        data["mem_total_bytes"] = fields["MemTotal"]
    if "MemAvailable" in fields:
        available = fields["MemAvailable"]
        data["source"] = "MemAvailable"
    else:
        # Kernels before 3.14 have no MemAvailable; this is its usual estimate.
        parts = [fields.get(k) for k in ("MemFree", "Buffers", "Cached")]
        if any(p is None for p in parts):
            raise ValueError(f"{PROC_MEMINFO} has neither MemAvailable nor MemFree/Buffers/Cached")
        available = sum(p for p in parts if p is not None)
        data["source"] = "MemFree+Buffers+Cached"
    data["mem_available_bytes"] = available
    if available >= ctx.min_free_memory_bytes:
        return CheckResult(
            "memory",
            True,
            False,
            f"{ctx.host}: {_bytes(available)} available (need {_bytes(ctx.min_free_memory_bytes)})",
            data,
        )
    return CheckResult(
        "memory",
        False,
        False,
        f"{ctx.host}: only {_bytes(available)} of host memory available, need {_bytes(ctx.min_free_memory_bytes)}",
        data,
    )


def _meminfo(path: str) -> dict[str, int]:
    """/proc/meminfo as bytes per field (the kernel writes kB, meaning KiB)."""
    out: dict[str, int] = {}
    with open(path, encoding="ascii") as fh:
        for line in fh:
            key, _, rest = line.partition(":")
            words = rest.split()
            if not words or not words[0].isdigit():
                continue
            value = int(words[0])
            if len(words) > 1 and words[1].lower() == "kb":
                value *= 1024
            out[key.strip()] = value
    return out


# --- dirs --------------------------------------------------------------------


def check_dirs(ctx: PreflightContext) -> CheckResult:
    """Each directory exists (created if missing) and takes a durable write.

    Creating, fsyncing and removing a file proves more than access(2): it
    catches read-only remounts, full or over-quota filesystems and stale
    mounts before a checkpoint save runs into them.
    """
    if not ctx.dirs:
        return _skip("dirs", "no directories to check")
    seen: list[dict[str, Any]] = []
    first_failure: str | None = None
    failures = 0
    for directory in ctx.dirs:
        error = _probe_dir(directory, ctx)
        fact: dict[str, Any] = {"path": directory, "ok": error is None}
        seen.append(fact)
        if error is not None:
            fact["error"] = error
            failures += 1
            if first_failure is None:
                first_failure = f"directory {directory} is not writable on {ctx.host}: {error}"
    data = {"dirs": seen}
    if first_failure is not None:
        more = f" (and {failures - 1} more)" if failures > 1 else ""
        return CheckResult("dirs", False, False, _one_line(first_failure + more), data)
    return CheckResult("dirs", True, False, f"{len(ctx.dirs)} directories writable on {ctx.host}", data)


def _probe_dir(directory: str, ctx: PreflightContext) -> str | None:
    """None when a file can be written, fsynced and removed in `directory`, else the errno text."""
    if not directory:
        return "empty path"
    try:
        os.makedirs(directory, exist_ok=True)
    except FileExistsError:
        return _errno_text(errno.ENOTDIR)  # a file is in the way
    except OSError as exc:
        return _os_error(exc)
    probe = os.path.join(directory, f".clusterctl-preflight-{ctx.host}-{ctx.rank}-{os.getpid()}")
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    except OSError as exc:
        return _os_error(exc)
    try:
        try:
            os.write(fd, b"clusterctl preflight\n")
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as exc:
        _remove_quietly(probe)
        return _os_error(exc)
    try:
        os.unlink(probe)
    except OSError as exc:
        return _os_error(exc)
    return None


# --- shared_fs ---------------------------------------------------------------


def check_shared_fs(ctx: PreflightContext) -> CheckResult:
    """The first node's marker is visible here: the checkpoint directory is shared.

    A node-local checkpoint directory looks fine until a restart resumes from
    it on another node and finds nothing (or an old generation).
    """
    if ctx.shared_marker is None:
        return _skip("shared_fs", "no shared marker to look for")
    path = ctx.shared_marker
    data: dict[str, Any] = {"marker": path}
    content = _read_marker(path)
    data["found"] = content is not None
    if content is None:
        return CheckResult(
            "shared_fs",
            False,
            False,
            f"checkpoint directory is not shared with the first node: marker {path} missing on {ctx.host}",
            data,
        )
    if ctx.shared_token is None:
        data["token_checked"] = False
        return CheckResult("shared_fs", True, False, f"marker {path} visible on {ctx.host}", data)
    data["token_checked"] = True
    data["token_matches"] = content.strip() == ctx.shared_token.strip()
    if not data["token_matches"]:
        shown = content.strip()[:64]
        return CheckResult(
            "shared_fs",
            False,
            False,
            _one_line(
                f"checkpoint directory is not shared with the first node: marker {path} on {ctx.host} "
                f"holds another attempt's token ({shown!r}, expected {ctx.shared_token!r})"
            ),
            data,
        )
    return CheckResult(
        "shared_fs", True, False, f"marker {path} on {ctx.host} holds this attempt's token", data
    )


def _read_marker(path: str) -> str | None:
    deadline = time.monotonic() + SHARED_MARKER_WAIT_S
    while True:
        try:
            with open(path, encoding="utf-8", errors="replace") as fh:
                return fh.read()
        except FileNotFoundError:
            pass
        if time.monotonic() >= deadline:
            return None
        try:
            # Listing the parent makes NFS clients revalidate their view of it.
            os.listdir(os.path.dirname(path) or ".")
        except OSError:
            pass
        time.sleep(0.2)


# --- helpers -----------------------------------------------------------------

_CHECKS: dict[str, Callable[[PreflightContext], CheckResult]] = {
    "gpu": check_gpu,
    "nic": check_nic,
    "cpu": check_cpu,
    "memory": check_memory,
    "dirs": check_dirs,
    "shared_fs": check_shared_fs,
}


def _skip(name: str, detail: str) -> CheckResult:
    return CheckResult(name, ok=True, skipped=True, detail=detail, data={})


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="ascii", errors="replace") as fh:
            return fh.read().strip()
    except OSError:
        return None


def _fsync_dir(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _remove_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _errno_text(code: int) -> str:
    return f"{os.strerror(code)} ({errno.errorcode.get(code, code)})"


def _os_error(exc: OSError) -> str:
    return _errno_text(exc.errno) if exc.errno else str(exc)


def _text(exc: BaseException) -> str:
    """An exception's message; NVMLError's str() can itself fail without a library."""
    try:
        text = str(exc)
    except Exception:  # noqa: BLE001
        text = ""
    return text or type(exc).__name__


def _str(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _bytes(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"
