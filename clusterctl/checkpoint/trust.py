"""Which generations may be loaded: the ones this user's runs wrote, sealed with this user's key.

Loading a generation runs code: DCP unpickles its `.metadata` on every rank.
So a generation is loaded only when

* it is this user's: the generation directory and every file in it are
  owned by this user and writable by no one else (the checkpoint directory
  itself is held to rundir/ownership.py's rule at submit and in the batch
  script), and
* its manifest carries a seal: an HMAC-SHA256, with this user's key, of the
  manifest without the seal. The key is 32 random bytes kept 0600 in
  $XDG_STATE_HOME/clusterctl/checkpoint.key, made on first use; submit
  copies it into the run directory (owner-only whatever runs_mode) for
  nodes that do not share the home directory. Every run of the same user
  signs with the same key, so a later run resumes from its own
  `checkpoint.dir` without a step.

A generation written before seals existed, or copied from elsewhere, is
refused with the command that trusts it once: `clusterctl checkpoints
DIR --adopt` verifies every byte against the manifest, then seals it (`adopt`).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import stat
from pathlib import Path
from typing import Any

from clusterctl import envnames
from clusterctl.errors import ClusterctlError
from clusterctl.exitcodes import ExitCode
from clusterctl.checkpoint import durable, names
from clusterctl.rundir import layout, ownership, roots

SEAL = "seal"  # the manifest's key for it: {"run": the run id that wrote it, "hmac": hex}
KEY_BYTES = 32


class TrustError(ClusterctlError):
    """The user's key cannot be read or made safely."""

    def __init__(self, message: str) -> None:
        super().__init__(message, ExitCode.NO_PERMISSION)


def user_key_path() -> Path:
    return roots.state_dir() / layout.CHECKPOINT_KEY


def _read_key(path: Path) -> bytes:
    """The key in `path`, which must be a regular file of this user's that no one else can read."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    with os.fdopen(fd, "rb") as fh:
        info = os.fstat(fh.fileno())
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid() or info.st_mode & 0o077:
            raise TrustError(f"{path} ({ownership.owner_name(info.st_uid)}, {stat.filemode(info.st_mode)}) must be a file"
                             f" of yours that only you can read: `chmod 600 {path}`, or remove it to make a new key"
                             f" (the generations it sealed then need `clusterctl checkpoints DIR --adopt`)")
        data = fh.read().strip()
    try:
        key = bytes.fromhex(data.decode())
    except ValueError:
        key = b""
    if len(key) != KEY_BYTES:
        raise TrustError(f"{path} does not hold a checkpoint key; remove it to make a new one")
    return key


def user_key() -> bytes:
    """This user's key, made (0600, in a 0700 directory) when there is none yet."""
    path = user_key_path()
    try:
        return _read_key(path)
    except FileNotFoundError:
        pass
    except OSError as exc:
        raise TrustError(f"cannot read the checkpoint key {path}: {exc.strerror}") from None
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(secrets.token_hex(KEY_BYTES) + "\n")
    except FileExistsError:
        pass  # another process made it first: read theirs
    except OSError as exc:
        raise TrustError(f"cannot make the checkpoint key {path}: {exc.strerror}") from None
    return _read_key(path)


def run_key(environ: dict[str, str] | None = None) -> bytes:
    """The key a run's ranks and batch host sign and check with: the run directory's copy, else the user's."""
    env = os.environ if environ is None else environ
    run_dir = env.get(envnames.RUN_DIR)
    if run_dir:
        try:
            return _read_key(Path(run_dir) / layout.CHECKPOINT_KEY)
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise TrustError(f"cannot read the run's checkpoint key: {exc.strerror}") from None
    return user_key()


def install(run_dir: Path) -> None:
    """Copy the user's key into a run directory (submit; `submit-run` on a login node), the owner's only; a run
    that has one keeps it."""
    key = user_key()
    try:
        fd = os.open(run_dir / layout.CHECKPOINT_KEY, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError:
        return
    with os.fdopen(fd, "w") as fh:
        fh.write(key.hex() + "\n")


def _mac(manifest: dict[str, Any], key: bytes) -> str:
    body = {k: v for k, v in manifest.items() if k != SEAL}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hmac.new(key, text.encode(), hashlib.sha256).hexdigest()


def sign(manifest: dict[str, Any], key: bytes, run_id: str | None) -> dict[str, Any]:
    """The manifest with its seal (made over its JSON form, which is what a reader will check)."""
    plain = json.loads(json.dumps({k: v for k, v in manifest.items() if k != SEAL}))
    return {**plain, SEAL: {"run": run_id, "hmac": _mac(plain, key)}}


def unsealed(manifest: dict[str, Any], key: bytes) -> str | None:
    """Why the manifest's seal does not hold with `key`, or None when it does."""
    seal = manifest.get(SEAL)
    if not isinstance(seal, dict) or not isinstance(seal.get("hmac"), str):
        return "it has no seal (written before seals, or by another launcher)"
    if not hmac.compare_digest(seal["hmac"], _mac(manifest, key)):
        return "its seal is not made with your key (another user's, or copied from elsewhere)"
    return None


def not_owned(path: Path, uid: int | None = None) -> str | None:
    """Why a generation directory is not wholly this user's (itself, each directory and file in it), or None."""
    uid = os.geteuid() if uid is None else uid
    for root, dirs, files in os.walk(path):
        for entry in [root, *(os.path.join(root, n) for n in dirs + files)]:
            info = os.lstat(entry)
            if stat.S_ISLNK(info.st_mode):
                return f"{entry} is a symbolic link"
            if info.st_uid != uid or info.st_mode & ownership.WRITABLE_BY_OTHERS:
                return f"{entry} (owner {ownership.owner_name(info.st_uid)}, {stat.filemode(info.st_mode)}) is not yours alone"
    return None


def refused(path: Path, manifest: dict[str, Any], key: bytes) -> str | None:
    """Why a whole generation may not be loaded, or None when it may (module doc)."""
    why = not_owned(path) or unsealed(manifest, key)
    if why is None:
        return None
    return (f"{path.name} in {path.parent} is not loaded: {why}. Loading runs code from it (DCP's pickled index), so"
            f" only generations your runs sealed are trusted; if you trust where it came from,"
            f" `clusterctl checkpoints {path.parent} --adopt` verifies and seals it once")


def adopt(path: Path, manifest: dict[str, Any], key: bytes, run_id: str | None = None) -> None:
    """Seal a verified generation's manifest with `key` (written beside it, fsynced, renamed over it)."""
    data = json.dumps(sign(manifest, key, run_id), indent=1).encode() + b"\n"
    tmp = path / f".{names.MANIFEST}.adopt"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path / names.MANIFEST)
    durable.fsync_dir(path)
