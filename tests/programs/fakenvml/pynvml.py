"""A stand-in for nvidia-ml-py: two healthy GPUs per node, except GPU 1 of node2, hot and throttled with ECC errors.

Put this directory first on PYTHONPATH of the node aggregators to test that a
verdict's evidence carries what NVML says about the culprit's GPU.
"""

import os

NVML_TEMPERATURE_GPU = 0
NVML_CLOCK_SM = 1
NVML_MEMORY_ERROR_TYPE_CORRECTED = 0
NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
NVML_VOLATILE_ECC = 0
nvmlClocksEventReasonHwThermalSlowdown = 0x40


class NVMLError(Exception):
    pass


def _sick(handle):
    return os.environ.get("SLURMD_NODENAME") == "node2" and handle == 1


def nvmlInit():
    pass


def nvmlShutdown():
    pass


def nvmlDeviceGetCount():
    return 2


def nvmlDeviceGetHandleByIndex(index):
    return index


def nvmlDeviceGetTemperature(handle, sensor):
    return 93 if _sick(handle) else 55


def nvmlDeviceGetClockInfo(handle, clock):
    return 1005 if _sick(handle) else 1980


def nvmlDeviceGetMaxClockInfo(handle, clock):
    return 1980


def nvmlDeviceGetCurrentClocksEventReasons(handle):
    return nvmlClocksEventReasonHwThermalSlowdown if _sick(handle) else 0


def nvmlDeviceGetTotalEccErrors(handle, error_type, counter):
    if not _sick(handle):
        return 0
    return 7 if error_type == NVML_MEMORY_ERROR_TYPE_UNCORRECTED else 1200
