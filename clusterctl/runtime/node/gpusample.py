"""GPU health samples for the aggregator: throttle reasons, clocks, temperature, ECC counters.

Standard library plus pynvml where it imports (nvidia-ml-py); without it, or
without a driver, `sample()` returns nothing and costs nothing. A verdict's
evidence carries the culprit's GPU sample, so a straggler that is a hot or
throttled GPU says so.
"""

from __future__ import annotations

import warnings
from typing import Any

from clusterctl.runtime.rank.preflight import slowdown_reasons


class GpuSampler:
    def __init__(self) -> None:
        self.nvml: Any = None
        self.error: type[BaseException] = Exception
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                import pynvml  # noqa: PLC0415 - optional
        except ImportError:
            return
        self.error = getattr(pynvml, "NVMLError", Exception)
        try:
            pynvml.nvmlInit()
        except self.error:
            return
        self.nvml = pynvml

    @property
    def enabled(self) -> bool:
        return self.nvml is not None

    def sample(self) -> dict[str, dict[str, Any]]:
        """GPU index (as text) -> its facts now; {} without NVML."""
        if self.nvml is None:
            return {}
        nvml = self.nvml
        try:
            count = nvml.nvmlDeviceGetCount()
        except self.error:
            return {}
        out: dict[str, dict[str, Any]] = {}
        for index in range(count):
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
            except self.error:
                continue
            out[str(index)] = self._one(handle)
        return out

    def _one(self, handle: Any) -> dict[str, Any]:
        nvml = self.nvml
        facts: dict[str, Any] = {}

        def ask(key: str, function: str, *args: Any) -> Any:
            fn = getattr(nvml, function, None)
            if fn is None:
                return None
            try:
                value = fn(handle, *args)
            except self.error:
                return None
            facts[key] = int(value)
            return value

        ask("temperature_c", "nvmlDeviceGetTemperature", getattr(nvml, "NVML_TEMPERATURE_GPU", 0))
        sm = getattr(nvml, "NVML_CLOCK_SM", 1)
        ask("sm_clock_mhz", "nvmlDeviceGetClockInfo", sm)
        ask("max_sm_clock_mhz", "nvmlDeviceGetMaxClockInfo", sm)
        reasons = ask("clock_event_reasons", "nvmlDeviceGetCurrentClocksEventReasons")
        if reasons is None:
            reasons = ask("clock_event_reasons", "nvmlDeviceGetCurrentClocksThrottleReasons")
        if reasons is not None:
            facts["slowdown"] = slowdown_reasons(nvml, int(reasons))
        volatile = getattr(nvml, "NVML_VOLATILE_ECC", 0)
        ask("ecc_volatile_uncorrected", "nvmlDeviceGetTotalEccErrors", getattr(nvml, "NVML_MEMORY_ERROR_TYPE_UNCORRECTED", 1), volatile)
        ask("ecc_volatile_corrected", "nvmlDeviceGetTotalEccErrors", getattr(nvml, "NVML_MEMORY_ERROR_TYPE_CORRECTED", 0), volatile)
        return facts
