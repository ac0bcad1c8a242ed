"""What killed jobs leave in a node's /tmp is removed by the next job's processes there (runtime/node/leftovers.py):
dead servers' pid files and sockets nobody listens on go; live ones, and anything not this user's own, stay."""

from __future__ import annotations

import os
import socket
import subprocess
import time
from pathlib import Path

from clusterctl.runtime.node import leftovers


def dead_pid() -> int:
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


def test_dead_pid_files_and_unheard_sockets_go_and_live_ones_stay(tmp_path: Path) -> None:
    (tmp_path / "clusterctl-warm.aa.node1.pid").write_text(f"{dead_pid()}\n")  # a SIGKILLed server's
    (tmp_path / "clusterctl-warm.bb.node1.pid").write_text(f"{os.getpid()}\n")  # a live server's
    (tmp_path / "clusterctl-warm.cc.node2.pid").write_text("")  # a server about to write its pid
    old_empty = tmp_path / "clusterctl-warm.dd.node2.pid"
    old_empty.write_text("")
    os.utime(old_empty, (time.time() - 3600, time.time() - 3600))
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    dead.bind(str(tmp_path / "clusterctl-0123abcd4567-node1.sock"))
    dead.close()  # the file stays, as a killed aggregator leaves it
    live = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    live.bind(str(tmp_path / "clusterctl-89ef01234567-node2.sock"))
    (tmp_path / "unrelated.pid").write_text("1\n")
    link = tmp_path / "clusterctl-warm.ee.node3.pid"
    link.symlink_to(tmp_path / "unrelated.pid")  # never followed, never removed
    (tmp_path / "clusterctl-warm.gg.node2.pid").write_text(f"{dead_pid()}\n")  # this job's server that died on node2
    theirs = tmp_path / "clusterctl-warm.ff.node1.pid"
    theirs.write_text(f"{dead_pid()}\n")
    if os.geteuid() == 0:
        os.chown(theirs, 4242, 4242)  # another user's leftover is theirs to clean
    else:
        theirs.unlink()
    try:
        assert leftovers.sweep(tmp_path, job="clusterctl-warm.gg") == 3
        assert sorted(p.name for p in tmp_path.iterdir()) == [
            "clusterctl-89ef01234567-node2.sock", "clusterctl-warm.bb.node1.pid", "clusterctl-warm.cc.node2.pid",
            "clusterctl-warm.ee.node3.pid", *(["clusterctl-warm.ff.node1.pid"] if os.geteuid() == 0 else []),
            "clusterctl-warm.gg.node2.pid",
            "unrelated.pid"]
    finally:
        live.close()
