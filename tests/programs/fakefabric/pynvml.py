"""A stand-in for nvidia-ml-py on NVL72-style trays: healthy GPUs whose NVLink fabric (cluster UUID, clique) is
the rack their node is in, read from FAKE_FABRIC_RACKS ("node1=1,node2=2"), as if Slurm had put a job's trays in
the racks that variable names. Put this directory first on the ranks' PYTHONPATH."""

import os
import types

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


def nvmlDeviceGetGpuFabricInfo(handle):
    racks = dict(item.split("=") for item in os.environ.get("FAKE_FABRIC_RACKS", "").split(",") if "=" in item)
    clique = int(racks.get(os.environ.get("SLURMD_NODENAME", ""), "0"))
    return types.SimpleNamespace(clusterUuid=bytes([0xAB] * 16), cliqueId=clique, state=3, status=0)
