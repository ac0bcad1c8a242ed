"""A stand-in for nvidia-ml-py on NVL72-style trays: healthy GPUs whose NVLink fabric (cluster UUID, clique) is
the rack their node is in, read from FAKE_FABRIC_RACKS ("node1=1,node2=2"), as if Slurm had put a job's trays in
the racks that variable names. Put this directory first on the ranks' PYTHONPATH."""

import ctypes
import os

NVML_GPU_FABRIC_STATE_COMPLETED = 3


class NVMLError(Exception):
    pass


def nvmlInit():
    pass


def nvmlShutdown():
    pass


def nvmlSystemGetDriverVersion():
    return "570.86.15"


def nvmlDeviceGetHandleByIndex(index):
    return index


def nvmlDeviceGetName(handle):
    return "NVIDIA GB200"


class c_nvmlGpuFabricInfo_t(ctypes.Structure):  # noqa: N801 - nvidia-ml-py's name
    """The structure NVML fills, as nvidia-ml-py defines it: the caller makes it and passes it by reference."""

    _fields_ = [("clusterUuid", ctypes.c_ubyte * 16), ("status", ctypes.c_uint),
                ("cliqueId", ctypes.c_uint32), ("state", ctypes.c_ubyte)]


def nvmlDeviceGetGpuFabricInfo(handle, info):
    racks = dict(item.split("=") for item in os.environ.get("FAKE_FABRIC_RACKS", "").split(",") if "=" in item)
    filled = info._obj  # a ctypes.byref(...) of the caller's structure
    filled.clusterUuid[:] = [0xAB] * 16
    filled.cliqueId = int(racks.get(os.environ.get("SLURMD_NODENAME", ""), "0"))
    filled.state, filled.status = NVML_GPU_FABRIC_STATE_COMPLETED, 0
    return 0  # NVML_SUCCESS, which nvidia-ml-py passes on
