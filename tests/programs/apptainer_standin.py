#!/usr/bin/env python3
"""A stand-in for `apptainer exec`, made of bubblewrap (Debian's bwrap): a real mount namespace, a read-only root,
Apptainer's binds and its rules for the environment.

    apptainer_standin.py exec [--nv|--rocm] [--writable-tmpfs] [--pwd DIR] [--bind SRC[:DST[:ro]]]... IMAGE CMD...

IMAGE is a directory holding `.singularity.d/env/90-environment.sh` (`export NAME=VALUE` lines), as an Apptainer
sandbox does. Its root file system is this machine's own, read-only: only the binds, /tmp (bound by Apptainer by
default) and /dev, /proc are usable. The environment follows Apptainer: the host's, then the image's values
winning, then APPTAINERENV_NAME values winning over both. A missing image fails as Apptainer does, naming it.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

ENV_FILE = ".singularity.d/env/90-environment.sh"
EXPORT = re.compile(r"^export\s+([A-Za-z_][A-Za-z0-9_]*)=(.*)$")


def main(argv: list[str]) -> int:
    if not argv or argv[0] != "exec":
        print(f"FATAL: the stand-in knows only `exec`, got {argv[:1]}", file=sys.stderr)
        return 255
    args, binds, pwd = argv[1:], [], os.getcwd()
    while args and args[0].startswith("--"):
        flag = args.pop(0)
        if flag in ("--bind", "-B"):
            binds.append(args.pop(0))
        elif flag == "--pwd":
            pwd = args.pop(0)
        elif flag not in ("--nv", "--rocm", "--writable-tmpfs"):
            print(f"FATAL: unknown flag {flag}", file=sys.stderr)
            return 255
    image, command = args[0], args[1:]
    if not Path(image, ENV_FILE).is_file():
        print(f"FATAL:   could not open image {image}: failed to retrieve path for {image}: lstat {image}:"
              " no such file or directory", file=sys.stderr)
        return 255
    env = dict(os.environ)
    for line in Path(image, ENV_FILE).read_text().splitlines():
        found = EXPORT.match(line.strip())
        if found:
            env[found.group(1)] = found.group(2).strip("'\"")
    for name in [n for n in env if n.startswith("APPTAINERENV_")]:
        env[name.removeprefix("APPTAINERENV_")] = env.pop(name)
    mounts = ["--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--bind", "/tmp", "/tmp"]
    for spec in binds:
        parts = spec.split(":")
        src, dst = parts[0], parts[1] if len(parts) > 1 else parts[0]
        mounts += ["--ro-bind" if parts[2:] == ["ro"] else "--bind", src, dst]
    os.execvpe("bwrap", ["bwrap", *mounts, "--chdir", pwd, "--", *command], env)
    return 255


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
