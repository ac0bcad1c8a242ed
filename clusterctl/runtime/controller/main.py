"""The controller: one per attempt, on the first node, started by the batch script.

It hosts torch.distributed's TCPStore on the planned port (moving to the next
free one if taken, and publishing the one it got before any rank starts),
waits for every rank's registration, judges them (registration.judge), writes
attempt-N/manifest.json and verdict.json, and tells the ranks the verdict
through the store. It then keeps hosting the store — the ranks' process
group uses it — until the batch script says the ranks are done (SIGHUP),
and exits with the attempt's verdict code. SIGTERM (or SIGINT) comes from
outside instead: scancel, `clusterctl cancel`, the time limit stop every
process of the job at once, so the ranks that die then are not to blame and
no blame follows (runtime/controller/keeper.py). A cancel (cancel.json, or Slurm
cancelling the job) is the attempt's verdict: 89, naming no culprit. Slurm's
own stop (the time limit, a preemption, a requeue) gives 85, as a requested
stop does: the recovery step goes on in a new job or lets Slurm's requeue
continue the run.

With the shared_fs check it writes the attempt's marker in the checkpoint
directory before any rank starts, and removes it when it exits (the ranks
read it only in their preflight). Markers that earlier attempts of the same
run left behind (a controller killed with the job) are removed when the next
attempt writes its own: exactly the paths their controller.json recorded, so
another run sharing the directory never loses its marker. Attempts of one
run never overlap (a restart, a requeue and a continuation each start after
the previous step or job ended), so an earlier attempt's marker has no reader.

At scale (bench/controller_scale.py: 100,000 ranks): it raises its
open-file soft limit to the hard limit before anything else and refuses at
once, with a verdict naming the numbers, when even the hard limit cannot
hold a connection per rank (runtime/controller/filelimit.py); it listens with the
largest backlog the kernel allows; it reads registrations in bounded
requests (store/collect.py), decodes only each one's short summary line,
publishes the verdict, and only then writes manifest.json from the rows the
ranks stored (clusterctl/rundir/rankmanifest.py).

    python -m clusterctl.runtime.controller --attempt-dir DIR --port PORT
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import re
import signal
import socket
import sys
import threading
import time
from array import array
from pathlib import Path
from typing import Any, Iterator

from clusterctl import envnames, rundir
from clusterctl.exitcodes import ExitCode
from clusterctl.plan.ranks import GROUP_KINDS, RankLayout
from clusterctl.rundir import history, phasetimes, rankmanifest, runjson, write_json_atomic
from clusterctl.rundir import verdict as verdictfile
from clusterctl.rundir.verdict import Verdict
from clusterctl.runtime.controller import admission, filelimit, storeport
from clusterctl.runtime.controller.blame import parse_srun_lines, stopped_on_request
from clusterctl.runtime.controller.intake import Intake
from clusterctl.runtime.controller.keeper import VerdictKeeper
from clusterctl.runtime.controller.response import Response
from clusterctl.runtime.controller.watchdog import Watchdog
from clusterctl.runtime.controller.watchserver import WatchServer
from clusterctl.runtime.wire import registration, stacks
from clusterctl.runtime.wire.registration import POST_RENDEZVOUS
from clusterctl.runtime.wire.sharedmarker import MARKER_PREFIX, write_shared_marker
from clusterctl.store import collect, sealed

READY = rundir.CONTROLLER_JSON
POLL_S = 0.02
PRESENCE_EVERY_S = 2.0  # besides each time the counter reaches the world: look whether every registration is there
READ_EVERY_S = 0.25  # while ranks arrive, read what came this often: at the last arrival, little is left to decode
SRUN_LOG_SETTLE_S = 2.0  # srun's last lines reach srun.log through tee, a moment after srun itself ended
MANIFEST_GROUP_LISTS_UP_TO = 4096  # beyond this many ranks the manifest keeps group indices only
# Lines a rank's log gets when Slurm stops it because another rank failed: not its own error.
COLLATERAL = re.compile(r"slurmstepd|CANCELLED AT|Terminated|Killed|srun: ")


def nvlink_groups(run: runjson.RunJson) -> list[tuple[str, list[int]]]:
    """The groups the plan keeps inside one multi-node NVLink domain (a block site's segments), by kind."""
    if not run.nvlink_kinds:
        return []
    p = run.parallel
    layout = RankLayout(tp=p.tp, cp=p.cp, dp=p.dp, pp=p.pp, ep=p.ep)
    return [(kind, group) for kind in run.nvlink_kinds for group in layout.groups(kind)]


def log(message: str) -> None:
    print(f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())} clusterctl controller: {message}", flush=True)


class Controller:
    def __init__(self, attempt_dir: Path, port: int, address: str = "") -> None:
        self.attempt_dir = attempt_dir
        self.address = address  # the rendezvous address (MASTER_ADDR): the only one listened on
        self.run_dir = attempt_dir.parent
        self.run = runjson.load_attempt(self.run_dir)  # at this attempt's width (an elastic job may shrink)
        self.hosts = rundir.read_hosts(attempt_dir)
        self.token = os.environ.get(envnames.TOKEN, "")
        self.world = self.run.world_size
        self.gpn = self.run.gpus_per_node
        self.timeout_s = float(self.run.rendezvous.timeout_s)
        self.port_range = tuple(self.run.rendezvous.port_range)
        self.first_port = port
        self.done = threading.Event()
        self.store = None
        self.stop_requested = False
        self.stopped_from_outside = False
        self.marker: str | None = None
        self.records: dict[int, dict] = {}  # rank -> the judged summary of its registration
        self.intake: Intake | None = None  # the registrations read so far (from the rendezvous on)
        self.watch: WatchServer | None = None
        self.response: Response | None = None
        self.keeper = VerdictKeeper(attempt_dir, log)
        self.refused: Verdict | None = None
        self.file_limit: filelimit.FileLimit | None = None

    # --- start -----------------------------------------------------------------
    def start(self) -> int:
        self.check_file_limit()
        listener, port = storeport.reserve_port(self.first_port, self.port_range, self.run.rendezvous.address_family, self.address, log)
        checkpoint_dir = str(self.run.checkpoint_dir(self.run_dir))
        if "shared_fs" in self.run.preflight.checks:
            try:
                self.marker = write_shared_marker(checkpoint_dir, self.token, self.earlier_markers(checkpoint_dir))
            except OSError as exc:
                log(f"cannot write the shared-filesystem marker in {checkpoint_dir}: {exc}")
        self.watch = self.start_watch(listener)
        write_json_atomic(
            self.attempt_dir / READY,
            {
                "port": port,
                "watch_port": self.watch.port,
                "pid": os.getpid(),
                "host": os.environ.get("SLURMD_NODENAME", ""),
                "marker": self.marker,
            },
        )
        self.store = storeport.host_store(listener, self.world, self.timeout_s)
        if self.stop_requested:  # the signal came while the store was starting
            self.request_stop()
        log(f"hosting the rendezvous store on port {port} for {self.world} ranks")
        return port

    def check_file_limit(self) -> None:
        """Raise the soft open-file limit to the hard one; refuse at once when even that is too small."""
        limit = filelimit.raise_to_hard(filelimit.needed_files(self.world, len(self.hosts)))
        self.file_limit = limit
        if limit.soft != limit.soft_before:
            log(f"open-file limit raised from {limit.soft_before} to {limit.soft} ({limit.needed} needed)")
        if not limit.enough:
            self.refused = self.keeper.give(
                filelimit.refusal(limit, self.world, len(self.hosts), os.environ.get("SLURMD_NODENAME", "")))

    def start_watch(self, store: socket.socket) -> WatchServer:
        """The heartbeat path's end: a port of its own (any free one) for the node aggregators, on the store's address."""
        family, host = store.family, str(store.getsockname()[0])
        sock = socket.socket(family, socket.SOCK_STREAM)
        if family == socket.AF_INET6 and host == "::":
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        sock.bind((host, 0))
        sock.listen(storeport.listen_backlog())
        number = self.attempt_dir.name.removeprefix(rundir.ATTEMPT_PREFIX)
        earlier = phasetimes.run_longest(self.run_dir, int(number)) if number.isdigit() else {}
        watchdog = Watchdog(self.world, self.hosts, self.gpn, self.run.watchdog, earlier)
        server = WatchServer(sock, self.token, watchdog, self.attempt_dir / rundir.TIMELINE, self.on_finding, log)
        self.response = Response(self.attempt_dir, server, watchdog, self.keeper)
        server.start()
        return server

    def on_finding(self, finding: Verdict) -> None:
        """The watchdog called a hang, a straggler or a lost node: the response records it and stops the ranks."""
        assert self.response is not None
        self.response.on_finding(finding)

    def earlier_markers(self, checkpoint_dir: str) -> list[str]:
        """Tokens of the markers that this run's earlier attempts wrote in `checkpoint_dir`."""
        prefix = rundir.ATTEMPT_PREFIX
        mine = self.attempt_dir.name.removeprefix(prefix)
        if not mine.isdigit():
            return []
        tokens = []
        for entry in self.run_dir.glob(f"{prefix}*"):
            number = entry.name.removeprefix(prefix)
            if not number.isdigit() or int(number) >= int(mine):
                continue
            try:
                marker = json.loads((entry / READY).read_text()).get("marker")
            except (OSError, ValueError, AttributeError):
                continue
            if not isinstance(marker, str):
                continue
            folder, name = os.path.split(marker)
            if name.startswith(MARKER_PREFIX) and os.path.realpath(folder) == os.path.realpath(checkpoint_dir):
                tokens.append(name.removeprefix(MARKER_PREFIX))
        return tokens

    def remove_marker(self) -> None:
        """The attempt is over: its ranks are done with the marker."""
        if self.marker is not None:
            try:
                os.unlink(self.marker)
            except OSError as exc:
                if not isinstance(exc, FileNotFoundError):
                    log(f"cannot remove the shared-filesystem marker {self.marker}: {exc}")
            self.marker = None

    # --- rendezvous --------------------------------------------------------------
    def wait_for_ranks(self) -> int:
        """Until every rank's registration is in the store (or the timeout); how many are. The counter the ranks
        bump only says when to look: anyone can move it, and a stranger's decrement must not hold the rendezvous
        any more than an increment may start it with ranks missing. What arrived is read (and its summaries
        decoded) as it is looked at (intake.py), so little is left to read once the last rank is in."""
        deadline = time.monotonic() + self.timeout_s
        self.intake = Intake(self.store, self.world, self.gpn, self.token, self.attempt_dir)
        seen, looked = -1, 0.0
        while not self.done.is_set() and time.monotonic() < deadline:
            count = self.store.add(registration.ARRIVED, 0)
            full = count != seen and count >= self.world
            since = time.monotonic() - looked
            if full or since >= PRESENCE_EVERY_S or (count != seen and since >= READ_EVERY_S):
                seen, looked = count, time.monotonic()
                if self.intake.complete(thorough=full):
                    return self.world
            time.sleep(POLL_S)
        self.intake.complete(thorough=True)
        return len(self.intake.records)

    def collect(self) -> tuple[dict[int, dict], dict[int, list[dict]], dict[int, str]]:
        """Registrations (their summaries, intake.py), duplicates and early errors.

        Bounded requests (store/collect.py): linear, and never the
        >131,072-key request the store refuses. Only each registration's
        summary is kept: the full records stay in the store until the
        manifest is written (at 100,000 ranks, ~180 MB not held twice).
        """
        store = self.store
        records = self.intake.records
        duplicates = {rank: list(found) for rank, found in self.intake.duplicates.items()}
        for rank, claim in registration.parse_claims(self._raw(registration.DUPLICATES), self.token, self.world):
            key = registration.reg_key(rank, claim)
            if store.check([key]):
                duplicates.setdefault(rank, []).append(registration.open_registration(self.token, rank, claim,
                                                                                     store.get(key))[0])
        return records, duplicates, self._errors()

    def _raw(self, key: str) -> bytes | None:
        return self.store.get(key) if self.store.check([key]) else None

    def _sealed(self, key: str) -> bytes | None:
        """A value under `key` that a holder of the token wrote (store/sealed.py); None for none, or another's."""
        return sealed.unseal(self.token, key, self._raw(key))

    def _publish(self, verdict: Verdict) -> None:
        """The rendezvous verdict for the ranks, sealed: a stranger's in its place is refused by every rank."""
        self.store.set(registration.VERDICT, sealed.seal(self.token, registration.VERDICT, registration.verdict_body(verdict)))

    def _errors(self) -> dict[int, str]:
        """The ranks' error reports (ERRORED lists them): rank -> text; one not sealed by a holder of the token
        (a stranger's, which would blame a node once failures are classified from their text) is skipped."""
        errors = {}
        for rank in registration.parse_ranks(self._raw(registration.ERRORED), self.token, self.world):
            text = self._sealed(registration.error_key(rank))
            if text is not None:
                errors[rank] = text.decode(errors="replace")
        return errors

    def node_log_errors(self, missing: list[int]) -> dict[int, str]:
        """For missing ranks, the first line each wrote to its node log (srun --label: `R: text`)."""
        found: dict[int, str] = {}
        wanted = set(missing)
        for slot in sorted({r // self.gpn for r in missing}):
            path = rundir.node_log(self.attempt_dir, slot)
            try:
                lines = path.read_text(errors="replace").splitlines()
            except OSError:
                continue
            for line in lines:
                label, sep, text = line.partition(": ")
                if not sep or not label.strip().isdigit() or COLLATERAL.search(text):
                    continue
                rank = int(label)
                if rank in wanted and rank not in found and text.strip():
                    found[rank] = text.strip()[:300]
        return found

    def rendezvous(self) -> Verdict:
        if self.refused is not None:  # the file limit cannot hold the job: tell the ranks that reach the store
            self._publish(self.refused)
            return self.refused
        gc.disable()  # ~100,000 small dicts decoded as they arrive: the collector's passes were half the decoding time
        arrived = self.wait_for_ranks()
        if self.stopped_from_outside and arrived < self.world:
            gc.enable()
            return self.give_up_rendezvous(arrived)
        started, cpu = time.perf_counter(), time.process_time()
        try:
            records, duplicates, errors = self.collect()
            collected = time.perf_counter()
            missing = [r for r in range(self.world) if r not in records]
            verdict = admission.judge(
                records,
                duplicates,
                world_size=self.world,
                hosts=self.hosts,
                gpus_per_node=self.gpn,
                token=self.token,
                errors=errors,
                log_errors=self.node_log_errors(missing) if missing else {},
                nvlink_groups=nvlink_groups(self.run),
            )
            judged = time.perf_counter()
            self.records = records
            self._publish(verdict)
            published = time.perf_counter()
            if verdict.ok and self.watch is not None:
                self.watch.arm()
            try:
                self.write_manifest(records)
            except (OSError, RuntimeError) as exc:  # the verdict is out: a record lost must not lose verdict.json too
                log(f"cannot write {rundir.MANIFEST}: {exc}")
            written = time.perf_counter()
            self.keeper.give(verdict)
        finally:
            gc.enable()
            gc.freeze()  # what stays (the summaries) is never garbage: later collections skip it
        timings = {
            "ranks": self.world,
            "arrived": arrived,
            "collect_s": round(collected - started, 4),
            "judge_s": round(judged - collected, 4),
            "verdict_s": round(published - started, 4),
            "manifest_s": round(written - published, 4),
            "cpu_s": round(time.process_time() - cpu, 4),
        }
        log(f"rendezvous timings {json.dumps(timings)}")
        return verdict

    def give_up_rendezvous(self, arrived: int) -> Verdict:
        """Stopped from outside before every rank arrived: the ranks are released with the stop's code (a cancel's 89,
        Slurm's own stop's 85) and no node is blamed."""
        verdict = self.outside_stop(f" before the rendezvous completed ({arrived} of {self.world} ranks had arrived)")
        self._publish(verdict)
        return self.keeper.give(verdict)

    def stop_from_outside(self) -> None:
        """SIGTERM or SIGINT: the job is being stopped; end the attempt without blaming the ranks the stop kills.

        What the stop was is asked (outside_stop), not read from the ranks' exits: the batch shell's USR2 relay of
        the same TERM (whose handler Python may run first) must not wait for a rank's 85 past KillWait. Later
        signals are ignored: one arriving during shutdown, handlers gone, would kill us and lose the code."""
        self.stopped_from_outside, self.stop_requested = True, False
        self.keeper.stopped_from_outside()
        self.done.set()
        with contextlib.suppress(ValueError):  # not the main thread (a test calling it directly): nothing to shield
            for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR2):
                signal.signal(sig, signal.SIG_IGN)

    def outside_stop(self, when: str = "") -> Verdict:
        """The stop from outside, naming no culprit: a cancel (89: cancel.json, or Slurm asked as the recovery step
        asks it, so verdict and history agree) or Slurm's own (85: time limit, preemption, requeue; the run goes on)."""
        from clusterctl.backends.slurm import batchhost  # noqa: PLC0415 - only a job stopped from outside asks Slurm

        who = history.cancel_asked_by(rundir.RunDir(self.run_dir))
        job_id = os.environ.get("SLURM_JOB_ID", "")
        end = "cancelled" if who else batchhost.ending(job_id, batchhost.restart_count(dict(os.environ))) if job_id else "running"
        return verdictfile.stopped_from_outside(end, who, when)

    def write_manifest(self, records: dict[int, dict]) -> None:
        """manifest.json, one rank per line (clusterctl/rundir/rankmanifest.py): each judged rank's stored record plus its groups.

        The records are read again from the store, a chunk at a time, for
        the ranks that were judged (a rank that arrives later is not in it).
        """
        layout = RankLayout(**self.run.parallel.sizes())
        lists = self.world <= MANIFEST_GROUP_LISTS_UP_TO  # beyond, the rows' indices say it all
        groups: dict[str, list[list[int]]] = {}
        columns = []
        for kind in GROUP_KINDS:
            kind_groups = layout.groups(kind)
            slot = array("q", bytes(8 * self.world))  # 8 bytes a rank, where a list of ints took ~36
            for g, members in enumerate(kind_groups):
                for r in members:
                    slot[r] = g
            columns.append(slot)
            if lists:
                groups[kind] = kind_groups
            del kind_groups
        header: dict[str, Any] = {
            "attempt": int(os.environ.get(envnames.ATTEMPT, "0") or 0),
            "world_size": self.world,
            "hosts": self.hosts,
        }
        if lists:
            header["groups"] = groups
        template = ('"groups":{' + ",".join(f'"{kind}":%d' for kind in GROUP_KINDS) + "}}").encode()

        def rows() -> Iterator[bytes]:
            for start in range(0, self.world, collect.CHUNK):
                ranks = range(start, min(self.world, start + collect.CHUNK))
                fulls = self.intake.full_records([r for r in ranks if r in records])
                for r in ranks:
                    tail = template % tuple(column[r] for column in columns)
                    full = fulls.get(r)
                    if full is None:
                        yield b'{"rank":%d,"missing":true,' % r + tail
                    else:
                        yield b"".join((full[:-1], b"," if len(full) > 2 else b"", tail))

        rankmanifest.write(self.attempt_dir / rundir.MANIFEST, header, rows())

    def request_stop(self) -> None:
        """The batch shell trapped the pre-timeout signal or a preemption: ask the ranks to save and stop."""
        self.stop_requested = True
        if self.store is not None:
            self.store.set(registration.STOP, sealed.seal(self.token, registration.STOP, str(time.time())))
            log("stop requested: the ranks save, commit and exit at their next step")

    # --- after the rendezvous ------------------------------------------------------
    def finish(self, verdict: Verdict) -> int:
        """Host the store until the ranks are done; then the attempt's code."""
        self.done.wait()
        try:
            return self._final_code(verdict)
        finally:
            if self.watch is not None:
                self.watch.close()
                self.record_phase_times(self.watch.watchdog)
            stacks.remove_empty(self.attempt_dir)

    def record_phase_times(self, watchdog: Watchdog) -> None:
        """The saves and load this attempt measured, for the next attempts' bounds (rundir/phasetimes.py)."""
        try:
            phasetimes.write(self.attempt_dir, watchdog.longest, phasetimes.loaded_from(self.attempt_dir))
        except OSError as exc:
            log(f"cannot write {rundir.PHASE_TIMES}: {exc}")

    def _final_code(self, verdict: Verdict) -> int:
        if not verdict.ok:
            return verdict.code
        if (finding := self.keeper.failure) is not None:
            return finding.code  # the watchdog's, recorded when it was called
        planned = any(c in POST_RENDEZVOUS for c in self.run.preflight.checks)  # else a postcheck is a stranger's
        if planned and (body := self._sealed(registration.POSTCHECK)) is not None:
            post = registration.read_verdict(body)
            if not post.ok:
                return self.keeper.give(post).code
            log(post.message)
        if self.stop_requested and self._stopped_on_request():
            log("the ranks saved, committed and stopped on request (85); any that srun stopped on their way out are not failures")
            return int(ExitCode.PRE_TIMEOUT)
        if self.stopped_from_outside:  # never 0: "every rank finished" would end the run
            stop = self.outside_stop()
            if stop.code == ExitCode.CANCELLED:
                return self.keeper.give(stop).code
            log(stop.message)  # Slurm's own stop is no failure: verdict.json keeps the rendezvous's word
            return stop.code
        final = self.end_verdict()
        return 0 if final is None else self.keeper.give(final).code

    def _stopped_on_request(self) -> bool:
        """A rank's exit 85 in srun's lines (tee may write them a moment after srun ended)."""
        path = self.attempt_dir / rundir.SRUN_LOG
        deadline = time.monotonic() + SRUN_LOG_SETTLE_S
        while True:
            try:
                ends = parse_srun_lines(path.read_text(errors="replace").splitlines())
            except OSError:
                ends = []
            if stopped_on_request(ends) or time.monotonic() >= deadline:
                return stopped_on_request(ends)
            time.sleep(0.1)

    def end_verdict(self) -> Verdict | None:
        """Culprits apart from victims (runtime/controller/response.py), once every rank is done; None when none failed."""
        if self.response is None:
            return None
        errors = self._errors()
        returned = registration.parse_returned(self._raw(registration.RETURNED), self.token, self.world)
        return self.response.end_verdict(errors, {r: rec.get("gpu") for r, rec in self.records.items()}, returned)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m clusterctl.runtime.controller")
    parser.add_argument("--attempt-dir", type=Path, required=True)
    parser.add_argument("--port", type=int, required=True, help="first port to try (the job's hashed port)")
    parser.add_argument("--address", default="", help="the rendezvous address (MASTER_ADDR), the only one listened on")
    args = parser.parse_args(argv)
    controller = Controller(args.attempt_dir, args.port, args.address)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: controller.stop_from_outside())
    signal.signal(signal.SIGHUP, lambda *_: controller.done.set())  # the batch script: srun ended, the ranks are done
    signal.signal(signal.SIGUSR2, lambda *_: controller.request_stop())
    try:
        try:
            controller.start()
        except Exception as exc:  # noqa: BLE001 - reported to the batch log, then a verdict code
            log(f"cannot host the rendezvous store: {exc}")
            return int(ExitCode.RENDEZVOUS_FAILED)
        verdict = controller.rendezvous()
        return controller.finish(verdict)
    finally:
        controller.remove_marker()


if __name__ == "__main__":
    sys.exit(main())
