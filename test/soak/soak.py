#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
# Seeded fault soak of the net plugin: runs inside a 3-host x 3-port netlab (scripts/soak.sh
# starts it), keeps a validated ring all-reduce going and injects port failures, flaps, host
# isolations, tbf degradations and peer kills; every fault is checked to have fired.
"""Fault soak driver (see scripts/soak.sh --help for the user-facing description).

Each *epoch* is one set of vigil-netbench processes (one rank per lab host, --loop
--progress) forming a ring. A peer kill ends its epoch: the survivors must fail with a clear
error within the bound, and a fresh epoch starts. Every other fault must be survived: no
error may reach the caller while a path to the peer is alive, and every all-reduce result is
checked exactly by the ranks themselves.

Clocks: everything is CLOCK_MONOTONIC (time.monotonic() here, the ranks' mono_s fields and
the plugin's link-monitor timestamps), the same in every network namespace of the host.
"""

import argparse
import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time

KINDS = ("port-down", "flap", "host-down", "degrade", "peer-kill")
# One bag of 20 faults, shuffled with the seed; a soak draws bag after bag, so every kind
# appears in every 20 faults in these proportions.
BAG = {"port-down": 6, "flap": 5, "degrade": 4, "host-down": 3, "peer-kill": 2}
RATES = ("50mbit", "100mbit", "200mbit")  # tbf rates, all below what a lab port carries here

now = time.monotonic


def log(msg):
    print(f"soak: {msg}", file=sys.stderr, flush=True)


# Plugin log lines (NCCL_DEBUG=INFO) that are evidence of a fault and its handling.
EVENT_PATTERNS = [
    ("link", re.compile(r"link monitor: (eth\d+) is (down|up) \(monotonic ([\d.]+) s\)")),
    ("failover", re.compile(r"failover: (?:primary|backup) dev (eth\d+) .*?; now on "
                            r"(?:primary|backup) dev (eth\d+)")),
    ("standby_lost", re.compile(r"standby path lost: (?:primary|backup) dev (eth\d+)")),
    ("path_lost", re.compile(r"host \S+: path lost: (?:primary|backup) dev (eth\d+).*?"
                             r"(no path left|other path)")),
    ("failback", re.compile(r"failback to (?:primary|backup) dev (eth\d+)")),
    ("resumed", re.compile(r"connection resumed on (?:primary|backup) dev (eth\d+)")),
    ("rebuilt", re.compile(r"path rebuilt(?: by the peer)?: (?:primary|backup) dev (eth\d+)")),
    ("degraded", re.compile(r"path degraded: (?:send|recv) (?:primary|backup) dev (eth\d+)")),
    ("replay_ack", re.compile(r"first replayed message acknowledged ([\d.]+) us")),
    ("conn_failed", re.compile(r"connection failed: (.*)")),
]
WARN_RE = re.compile(r" NCCL WARN (.*)")
# WARN lines that are the normal voice of the events above (anything else is reported).
KNOWN_WARN = re.compile(r"failover:|standby path lost|path lost:|connection resumed|"
                        r"path degraded|connection failed|no path to the peer|"
                        r"closed the connection|backup path from dev .* not established|"
                        r"connect from dev .* failed|connections told in|"
                        r"within \d+ s \(a port event reaches|were logged at INFO only")


class Rank:
    """One vigil-netbench process of an epoch, its output read by two threads.

    Every line is written to a log file prefixed with its arrival time; progress and result
    JSON lines and plugin events are parsed. The reader threads only append; the main thread
    reads under `lock`.
    """

    def __init__(self, soak, epoch, rank, cmd):
        self.rank, self.epoch = rank, epoch
        self.lock = threading.Lock()
        self.progress = None       # last progress record
        self.first_progress = None  # soak time of the first one
        self.last_progress_t = None  # soak time of the last one
        self.result = None         # the {"ok":...} line (error or summary)
        self.events = []           # (time, kind, groups)
        self.stalls = []           # (stall_s, from_s) per iteration with a stall
        self.unknown_warns = []
        self.exit_t = None
        self.killed_t = None
        base = os.path.join(soak.workdir, f"e{epoch:04d}.r{rank}")
        self.out_f = open(base + ".out", "w", encoding="utf-8")
        self.err_f = open(base + ".err", "w", encoding="utf-8")
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     stdin=subprocess.DEVNULL)
        self.pid = self.proc.pid  # netlab exec and ip netns exec both exec: this is the rank
        self.threads = [threading.Thread(target=self._read, args=(self.proc.stdout, True),
                                         daemon=True),
                        threading.Thread(target=self._read, args=(self.proc.stderr, False),
                                         daemon=True)]
        for t in self.threads:
            t.start()

    def _read(self, stream, is_out):
        f = self.out_f if is_out else self.err_f
        for raw in stream:
            t = now()
            line = raw.decode("utf-8", "replace").rstrip("\n")
            f.write(f"{t:.6f} {line}\n")
            if is_out:
                self._stdout_line(t, line)
            else:
                self._stderr_line(t, line)
        f.flush()

    def _stdout_line(self, t, line):
        if not line.startswith("{"):
            return
        try:
            rec = json.loads(line)
        except ValueError:
            return
        with self.lock:
            if rec.get("type") == "progress":
                self.progress = rec
                self.last_progress_t = t
                if self.first_progress is None:
                    self.first_progress = t
                if rec.get("stall_s", 0) > 0:
                    self.stalls.append((rec["stall_s"], rec["stall_from_s"]))
            elif "ok" in rec:
                self.result = rec

    def _stderr_line(self, t, line):
        for kind, rx in EVENT_PATTERNS:
            m = rx.search(line)
            if m:
                ev_t = float(m.group(3)) if kind == "link" else t
                with self.lock:
                    self.events.append((ev_t, kind, m.groups()))
                break
        w = WARN_RE.search(line)
        if w and not KNOWN_WARN.search(w.group(1)):
            with self.lock:
                self.unknown_warns.append((t, w.group(1)))

    def alive(self):
        return self.proc.poll() is None

    def counters(self):
        """(msgs, bytes_verified, wrong) of this rank: its last progress line, or its error
        line, which carries the counters at the time of the error (the summary line holds
        sums over ranks and is not used)."""
        with self.lock:
            best = (0, 0, 0)
            for rec in (self.progress, self.result):
                if rec and "bytes_verified" in rec and rec.get("ok") is not True:
                    best = max(best, (rec["msgs"], rec["bytes_verified"], rec["wrong"]))
            return best

    def close(self):
        for t in self.threads:
            t.join(timeout=5)
        self.out_f.close()
        self.err_f.close()


class Fault:
    """One injected fault: what, where, when it was applied and reverted, and whether the
    plugin's own output shows that it fired."""

    def __init__(self, kind, host, ports, epoch, t0, detail=""):
        self.kind, self.host, self.ports, self.epoch = kind, host, ports, epoch
        self.t0, self.t_end, self.detail = t0, None, detail
        self.fired, self.evidence = None, ""
        self.revert_at = None
        self.acted = 0        # port faults: path events on the port (failover, path lost)
        self.sent = 0         # degrade: packets through the tbf qdiscs
        self.shaped = 0       # degrade: packets they held back or dropped
        self.verdicts = 0     # degrade: the plugin's degraded verdicts on the port
        self.down_ms = None   # flap: down time between the link monitor's two events

    def label(self):
        where = f"host {self.host}" + (f" port {','.join(map(str, self.ports))}"
                                       if self.ports else "")
        return f"{self.kind} {where} {self.detail}".strip()


class Soak:
    def __init__(self, a):
        self.a = a
        # The seed fixes the order of kinds (bag_rng) and each fault's own draws (a generator
        # seeded with the seed and the fault's number); which ports are free when a fault
        # comes depends on timing, so targets can differ between two runs of one seed.
        self.bag_rng = random.Random(a.seed)
        self.gap_rng = random.Random(f"{a.seed}:gaps")
        self.lab = os.environ["NETLAB"]
        self.hosts = int(os.environ.get("NETLAB_HOSTS", "3"))
        self.ports = int(os.environ.get("NETLAB_PORTS", "3"))
        self.workdir = a.workdir
        self.fatal_s = int(os.environ.get("VIGIL_FATAL_TIMEOUT_MS", "10000")) / 1000
        self.hold_max = min(4.0, 0.4 * self.fatal_s)  # host-down: restored well in time
        self.hang_s = max(30.0, self.fatal_s + 15)
        self.bag = []
        self.epoch = 0
        self.ranks = []
        self.all_ranks = []
        self.faults = []
        self.active = []            # faults not yet reverted
        self.down = set()           # (host, port) down now
        self.port_log = []          # (t, host, port, up)
        self.degraded = set()
        self.violations = []
        self.peer_kills = []        # (fault, {rank: seconds to its error or None})
        self.epoch_ends = []        # (epoch, cause)
        self.t_start = now()
        self.stop_reason = ""

    # ---- lab actions ----------------------------------------------------------------------
    def netlab(self, *args):
        r = subprocess.run([self.a.netlab, *map(str, args)], capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"netlab.sh {' '.join(map(str, args))}: {r.stderr.strip()}")
        return r.stdout

    def flap_port(self, h, p, gap_s):
        """Takes the port down and up `gap_s` later through one `ip -batch` started
        beforehand, so the down time is the gap plus two pipe writes (the plugin's link
        monitor stamps both edges; verify() reads the true down time from them)."""
        ip = subprocess.Popen(["ip", "-n", f"{self.lab}-h{h}", "-batch", "-"],
                              stdin=subprocess.PIPE, text=True)
        t_down = now()
        ip.stdin.write(f"link set dev eth{p} down\n")
        ip.stdin.flush()
        time.sleep(gap_s)
        ip.stdin.write(f"link set dev eth{p} up\n")
        ip.stdin.close()
        if ip.wait() != 0:
            raise RuntimeError(f"ip -batch could not flap eth{p} of host {h}")
        return t_down, now()

    def port_down(self, h, p):
        self.netlab("fail", h, p)
        self.down.add((h, p))
        self.port_log.append((now(), h, p, False))

    def port_up(self, h, p):
        self.netlab("restore", h, p)
        self.down.discard((h, p))
        self.port_log.append((now(), h, p, True))

    def tbf_stats(self, h, p):
        """(packets sent, packets held back or dropped) by the tbf qdiscs of a degraded port,
        both ends."""
        sent = shaped = 0
        for ns, dev in ((f"{self.lab}-h{h}", f"eth{p}"), (f"{self.lab}-sw", f"h{h}p{p}")):
            out = subprocess.run(["tc", "-n", ns, "-s", "qdisc", "show", "dev", dev],
                                 capture_output=True, text=True).stdout
            for m in re.finditer(r"qdisc tbf .*?Sent \d+ bytes (\d+) pkt \(dropped (\d+), "
                                 r"overlimits (\d+)", out, re.S):
                sent += int(m.group(1))
                shaped += int(m.group(2)) + int(m.group(3))
        return sent, shaped

    # ---- epochs ---------------------------------------------------------------------------
    def rank_cmd(self, r):
        rdv = os.path.join(self.workdir, f"rdv.{self.epoch}.sock")
        return [self.a.netlab, "exec", str(r), "--", "env", "NCCL_DEBUG=INFO", self.a.netbench,
                "--plugin", self.a.plugin, "--rank", str(r), "--nranks", str(self.hosts),
                "--rendezvous", "unix:" + rdv, "--workload", "allreduce",
                "--bytes", self.a.bytes, "--slice", self.a.slice,
                "--channels", str(self.ports), "--loop", "--progress", "--yield",
                "--timeout", "0"]

    def start_epoch(self):
        self.epoch += 1
        self.ranks = [None] * self.hosts
        for r in reversed(range(self.hosts)):
            self.ranks[r] = Rank(self, self.epoch, r, self.rank_cmd(r))
        self.all_ranks.extend(self.ranks)
        deadline = now() + 120
        while now() < deadline:
            if all(k.first_progress is not None for k in self.ranks):
                log(f"epoch {self.epoch} running (pids "
                    f"{' '.join(str(k.pid) for k in self.ranks)})")
                return True
            if any(not k.alive() for k in self.ranks):
                break
            time.sleep(0.05)
        self.violation(f"epoch {self.epoch} did not start: "
                       + "; ".join(f"rank {k.rank}: {k.result}" for k in self.ranks))
        self.end_epoch_by_kill("did not start")
        for k in self.ranks:
            k.close()
        return False

    def end_epoch_by_kill(self, cause):
        """Ends every rank still running (by PID) after a failure of the soak itself."""
        for k in self.ranks:
            if k.alive():
                k.proc.kill()
        for k in self.ranks:
            k.proc.wait()
            k.exit_t = k.exit_t or now()
        self.epoch_ends.append((self.epoch, cause))

    def stop_epoch(self):
        """Every rank votes to stop; they finish the same iteration and close cleanly."""
        for k in self.ranks:
            if k.alive():
                os.kill(k.pid, signal.SIGUSR1)
        deadline = now() + 60
        for k in self.ranks:
            try:
                k.proc.wait(timeout=max(0.1, deadline - now()))
            except subprocess.TimeoutExpired:
                self.violation(f"epoch {self.epoch} rank {k.rank} did not stop within 60 s")
                k.proc.kill()
                k.proc.wait()
            k.exit_t = now()
        for k in self.ranks:
            k.close()
        r0 = self.ranks[0].result
        if not r0 or r0.get("ok") is not True:
            self.violation(f"epoch {self.epoch}: final summary not ok: {r0}")
        for k in self.ranks:
            if k.proc.returncode != 0:
                self.violation(f"epoch {self.epoch} rank {k.rank} exited "
                               f"{k.proc.returncode}: {k.result}")
        self.epoch_ends.append((self.epoch, "stopped"))

    # ---- faults ---------------------------------------------------------------------------
    def next_kind(self):
        if not self.bag:
            self.bag = [k for k, n in BAG.items() for _ in range(n)]
            self.bag_rng.shuffle(self.bag)
        return self.bag[-1]

    def free_ports(self):
        busy = {(f.host, p) for f in self.active for p in f.ports}
        return [(h, p) for h in range(self.hosts) for p in range(self.ports)
                if (h, p) not in busy and (h, p) not in self.down]

    def inject(self):
        """Injects the next fault of the bag if the lab allows it now; True when done."""
        kind = self.next_kind()
        quiet = not self.active
        if kind in ("host-down", "peer-kill") and not quiet:
            return False  # these start from a lab without other faults
        free = self.free_ports()
        if kind == "port-down":
            # Never the last port of a host (that is host-down's job); at most 2 at once.
            cand = [(h, p) for h, p in free
                    if sum((h, q) in self.down for q in range(self.ports)) < self.ports - 1]
            if len(self.down) >= 2 or not cand:
                return False
        elif kind in ("flap", "degrade"):
            cand = free
            if not cand or (kind == "degrade" and len(self.degraded) >= 2):
                return False
        self.bag.pop()
        rng = random.Random(f"{self.a.seed}:{len(self.faults)}")
        t0 = now()
        if kind == "port-down":
            h, p = rng.choice(cand)
            f = Fault(kind, h, [p], self.epoch, t0)
            self.port_down(h, p)
            f.revert_at = now() + rng.uniform(0.3, 3.0)
            self.active.append(f)
        elif kind == "flap":
            h, p = rng.choice(cand)
            gap = rng.uniform(0.005, 0.025)
            f = Fault(kind, h, [p], self.epoch, t0, f"gap {gap * 1000:.0f} ms")
            t_down, t_up = self.flap_port(h, p, gap)
            self.port_log += [(t_down, h, p, False), (t_up, h, p, True)]
            self.netlab("restore", h, p)  # address and carrier checked, as after any restore
            f.t_end = now()
        elif kind == "host-down":
            h = rng.randrange(self.hosts)
            f = Fault(kind, h, list(range(self.ports)), self.epoch, t0)
            for p in range(self.ports):
                self.port_down(h, p)
            hold = rng.uniform(0.5, self.hold_max)
            f.detail = f"hold {hold:.2f} s"
            f.revert_at = t0 + hold
            self.active.append(f)
        elif kind == "degrade":
            h, p = rng.choice(cand)
            rate = rng.choice(RATES)
            f = Fault(kind, h, [p], self.epoch, t0, rate)
            self.netlab("degrade", h, p, rate)
            self.degraded.add((h, p))
            f.revert_at = now() + rng.uniform(1.0, 4.0)
            self.active.append(f)
        else:  # peer-kill
            k = rng.randrange(self.hosts)
            f = Fault(kind, k, [], self.epoch, t0, "SIGKILL")
            self.faults.append(f)
            self.peer_kill(f, self.ranks[k])
            return True
        self.faults.append(f)
        return True

    def revert(self, f):
        if f.kind in ("port-down", "host-down"):
            for p in f.ports:
                self.port_up(f.host, p)
        elif f.kind == "degrade":
            p = f.ports[0]
            f.sent, f.shaped = self.tbf_stats(f.host, p)  # before the qdiscs go
            self.netlab("undegrade", f.host, p)
            self.degraded.discard((f.host, p))
        f.t_end = now()
        self.active.remove(f)

    def revert_due(self, force=False):
        """Reverts the faults whose time has come; True when one was."""
        due = [f for f in self.active if force or now() >= f.revert_at]
        for f in due:
            self.revert(f)
        return bool(due)

    def peer_kill(self, f, victim):
        """SIGKILLs one rank; the others must fail with an error within the bound."""
        bound = self.fatal_s + 5
        t_kill = now()
        os.kill(victim.pid, signal.SIGKILL)
        victim.killed_t = t_kill
        victim.proc.wait()
        victim.exit_t = now()
        took = {}
        for k in self.ranks:
            if k is victim:
                continue
            try:
                k.proc.wait(timeout=max(0.1, t_kill + bound - now()))
                k.exit_t = now()
                took[k.rank] = k.exit_t - t_kill
            except subprocess.TimeoutExpired:
                took[k.rank] = None
                self.violation(f"peer-kill of rank {victim.rank} (epoch {self.epoch}): rank "
                               f"{k.rank} still running after {bound:.0f} s (a hang)")
                k.proc.kill()
                k.proc.wait()
                k.exit_t = now()
        for k in self.ranks:
            k.close()
        f.t_end = now()
        f.fired = victim.proc.returncode == -signal.SIGKILL
        f.evidence = f"rank {victim.rank} ended by signal {-victim.proc.returncode}"
        for k in self.ranks:
            if k is not victim and (not k.result or k.result.get("ok") is not False):
                self.violation(f"peer-kill of rank {victim.rank}: survivor rank {k.rank} "
                               f"ended without a clear error: {k.result}")
        self.peer_kills.append((f, took))
        self.epoch_ends.append((self.epoch, f"peer-kill rank {victim.rank}"))

    # ---- checks ---------------------------------------------------------------------------
    def violation(self, what):
        log("VIOLATION: " + what)
        self.violations.append(what)

    def check_running(self):
        """Every rank of the running epoch must be alive and progressing."""
        t = now()
        for k in self.ranks:
            if not k.alive():
                self.violation(f"epoch {self.epoch} rank {k.rank} exited "
                               f"{k.proc.returncode} during the soak: {k.result}")
                self.end_epoch_by_kill(f"rank {k.rank} exited")
                for j in self.ranks:
                    j.close()
                return False
            if t - k.last_progress_t > self.hang_s:
                self.violation(f"epoch {self.epoch} rank {k.rank}: no progress for "
                               f"{t - k.last_progress_t:.1f} s (a hang); active faults: "
                               f"{[f.label() for f in self.active]}")
                self.end_epoch_by_kill("hang")
                for j in self.ranks:
                    j.close()
                return False
        return True

    def verify(self, f):
        """Decides from the plugin's own output whether a fault fired: for a port fault,
        the link monitor of the rank on that host logged every port going down after the
        fault began; how many paths on those ports failed over or were lost is recorded
        too (none when they had already left a port that an earlier fault hit and were
        not rebuilt yet). A degradation fired when its tbf held back or dropped packets."""
        if f.kind == "peer-kill" or f.fired is not None:
            return
        lo, hi = f.t0 - 0.01, f.t_end + self.a.settle
        ranks = [k for k in self.all_ranks if k.epoch == f.epoch]
        if f.kind == "degrade":
            dev = f"eth{f.ports[0]}"
            f.verdicts = sum(1 for k in ranks for (t, kind, g) in k.events
                             if kind == "degraded" and g[0] == dev and lo <= t <= hi)
            # Fired: the port's packets went through the limit. Whether it held any back
            # depends on the load the port carried then (none when its paths had moved).
            f.fired = f.sent > 0
            f.evidence = (f"{f.sent} packets through tbf, {f.shaped} held back or dropped; "
                          f"{f.verdicts} degraded verdicts")
            return
        host = ranks[f.host]
        with host.lock:
            evs = [(t, kind, g) for (t, kind, g) in host.events if lo <= t <= hi]
        missing = []
        f.acted = 0
        for p in f.ports:
            dev = f"eth{p}"
            downs = [t for t, kind, g in evs if kind == "link" and g[0] == dev and g[1] == "down"]
            if not downs:
                missing.append(f"no link-down event for {dev}")
            elif f.kind == "flap":
                ups = [t for t, kind, g in evs if kind == "link" and g[0] == dev and g[1] == "up"
                       and t >= downs[0]]
                f.down_ms = (ups[0] - downs[0]) * 1000 if ups else None
            f.acted += sum(1 for _, kind, g in evs
                           if kind in ("failover", "standby_lost", "path_lost") and g[0] == dev)
        f.fired = not missing
        f.evidence = "; ".join(missing) if missing else (
            f"link down seen by the plugin; {f.acted} path events on host {f.host}")

    # ---- main loop ------------------------------------------------------------------------
    def done(self):
        t = now() - self.t_start
        if self.a.faults and len(self.faults) >= self.a.faults:
            self.stop_reason = f"{len(self.faults)} faults injected"
        elif self.a.duration and t >= self.a.duration:
            self.stop_reason = f"duration {self.a.duration:.0f} s reached"
        elif self.a.max_wall and t >= self.a.max_wall:
            self.stop_reason = f"wall-time bound {self.a.max_wall:.0f} s reached"
        return bool(self.stop_reason)

    def run(self):
        log(f"lab {self.lab} ({self.hosts}x{self.ports}), seed {self.a.seed}, logs in "
            f"{self.workdir}")
        failures_to_start = 0
        running = self.start_epoch()
        next_fault = now() + 1.0
        last_report = now()
        while True:
            if not running:
                self.revert_due(force=True)
                if failures_to_start >= 3:
                    self.stop_reason = "three epochs in a row did not start"
                    break
                failures_to_start += 1
                running = self.start_epoch()
                next_fault = now() + 1.0
                continue
            failures_to_start = 0
            if self.revert_due():  # the lab gets a moment before the next fault
                next_fault = max(next_fault, now() + self.gap_rng.uniform(0.2, 1.2))
            if not self.check_running():
                running = False
                continue
            if self.done() and not self.active:
                break
            if not self.done() and now() >= next_fault:
                n = len(self.epoch_ends)
                if self.inject():
                    next_fault = now() + self.gap_rng.uniform(0.2, 1.2)
                    if len(self.epoch_ends) > n:  # a peer kill ended the epoch
                        self.revert_due(force=True)
                        running = self.start_epoch()
                        next_fault = now() + 1.0
            if now() - last_report > 60:
                last_report = now()
                log(f"{now() - self.t_start:.0f} s: {len(self.faults)} faults, epoch "
                    f"{self.epoch}, {len(self.violations)} violations")
            time.sleep(0.02)
        self.revert_due(force=True)
        if running:
            time.sleep(self.a.settle)  # the last faults' evidence and failbacks
            self.stop_epoch()
        for f in self.faults:
            self.verify(f)
        return self.report()

    # ---- report ---------------------------------------------------------------------------
    def classify_errors(self):
        """Splits the errors the ranks surfaced by whether a path to the failing comm's peer
        could have been alive: no path when the peer's process was gone, or every port of
        the peer or of the rank itself was down, at the error's time."""
        no_path, alive = [], []
        for k in self.all_ranks:
            res = k.result
            if not res or res.get("ok") is not False:
                continue
            t, peer = res.get("mono_s", 0), res.get("peer", -1)
            epoch_ranks = [j for j in self.all_ranks if j.epoch == k.epoch]
            why = None
            if 0 <= peer < len(epoch_ranks):
                q = epoch_ranks[peer]
                gone = q.killed_t or (q.result and q.result.get("ok") is False
                                      and q.result.get("mono_s"))
                if gone and gone <= t + 0.001:
                    why = f"peer rank {peer} was gone"
                elif self.isolated(k.rank, t) or self.isolated(peer, t):
                    why = "every port of one end was down"
            rec = {"epoch": k.epoch, "rank": k.rank, "peer": peer, "call": res.get("call"),
                   "error": res.get("error"), "stall_s": res.get("stall_s"), "why": why}
            (no_path if why else alive).append(rec)
        return no_path, alive

    def isolated(self, host, t):
        state = {p: True for p in range(self.ports)}
        for (tt, h, p, up) in self.port_log:
            if tt > t:
                break
            if h == host:
                state[p] = up
        return not any(state.values())

    def report(self):
        wall = now() - self.t_start
        per_kind = {k: {"injected": 0, "fired": 0} for k in KINDS}
        unfired = []
        for f in self.faults:
            per_kind[f.kind]["injected"] += 1
            if f.fired:
                per_kind[f.kind]["fired"] += 1
            else:
                unfired.append(f"{f.label()} (epoch {f.epoch}): {f.evidence}")
        events = {}
        first_ack = []
        unknown = []
        for k in self.all_ranks:
            for (_, kind, g) in k.events:
                events[kind] = events.get(kind, 0) + 1
                if kind == "replay_ack":
                    first_ack.append(float(g[0]))
            unknown += [f"epoch {k.epoch} rank {k.rank}: {w}" for _, w in k.unknown_warns]
        msgs = verified = wrong = 0
        for k in self.all_ranks:
            m, v, w = k.counters()
            msgs, verified, wrong = msgs + m, verified + v, wrong + w
        if wrong:
            self.violation(f"{wrong} wrong elements in all-reduce results")
        no_path, alive = self.classify_errors()
        for e in alive:
            self.violation(f"error while a path was alive: {e}")
        for u in unfired:
            self.violation(f"fault not seen to fire: {u}")
        # Largest stall: the longest wait of any rank without a completion, and the faults
        # active during it (errors at an epoch's end are timed separately, per peer kill);
        # by_kind keys are the kinds active together during a stall ("none": no fault).
        largest = {"seconds": 0.0}
        by_kind = {}
        for k in self.all_ranks:
            for (s, frm) in k.stalls:
                kinds = sorted({f.kind for f in self.faults if f.epoch == k.epoch
                                and f.t0 <= frm + s and frm <= (f.t_end or frm) + 0.5})
                key = "+".join(kinds) or "none"
                by_kind[key] = max(by_kind.get(key, 0.0), s)
                if s > largest["seconds"]:
                    largest = {"seconds": s, "epoch": k.epoch, "rank": k.rank,
                               "during": kinds or ["none"]}
        kill_times = sorted(s for (_, took) in self.peer_kills for s in took.values()
                            if s is not None)
        first_ack.sort()
        flaps = [f.down_ms for f in self.faults if f.kind == "flap" and f.down_ms is not None]
        port_faults = [f for f in self.faults if f.kind in ("port-down", "flap", "host-down")]
        rep = {
            "ok": not self.violations,
            "seed": self.a.seed,
            "lab": f"{self.hosts} hosts x {self.ports} ports",
            "workload": f"ring all-reduce, {self.a.bytes} per rank, slice {self.a.slice}, "
                        f"{self.ports} channels, --loop --yield",
            "fatal_timeout_ms": int(self.fatal_s * 1000),
            "wall_s": round(wall, 1),
            "stop_reason": self.stop_reason,
            "epochs": self.epoch,
            "faults_injected": len(self.faults),
            "faults_fired": sum(1 for f in self.faults if f.fired),
            "faults": per_kind,
            "failovers": events.get("failover", 0),
            "failbacks": events.get("failback", 0),
            "standby_paths_lost": events.get("standby_lost", 0),
            "receive_paths_lost": events.get("path_lost", 0),
            "connections_resumed": events.get("resumed", 0),
            "paths_rebuilt": events.get("rebuilt", 0),
            "link_events": events.get("link", 0),
            "degraded_verdicts": events.get("degraded", 0),
            "first_replay_ack_us": {
                "count": len(first_ack),
                "p50": first_ack[len(first_ack) // 2] if first_ack else None,
                "p99": first_ack[len(first_ack) * 99 // 100] if first_ack else None,
                "max": first_ack[-1] if first_ack else None},
            "flap_down_ms_max": round(max(flaps), 1) if flaps else None,
            "flaps_over_50ms": sum(1 for d in flaps if d > 50),
            "degrades_that_held_back_packets": sum(1 for f in self.faults
                                                   if f.kind == "degrade" and f.shaped > 0),
            "degraded_verdicts_on_degraded_ports": sum(f.verdicts for f in self.faults
                                                       if f.kind == "degrade"),
            "port_faults_without_path_event": sum(1 for f in port_faults
                                                  if f.fired and not f.acted),
            "messages": msgs,
            "bytes_verified": verified,
            "wrong_elements": wrong,
            "errors_no_path": len(no_path),
            "errors_path_alive": len(alive),
            "peer_kill_error_s_max": round(max(kill_times), 3) if kill_times else None,
            "peer_kill_error_s": {  # from the kill to each survivor's exit with its error
                "count": len(kill_times),
                "within_1s": sum(1 for s in kill_times if s <= 1.0),
                "p50": round(kill_times[len(kill_times) // 2], 3) if kill_times else None,
                "max": round(kill_times[-1], 3) if kill_times else None},
            "largest_stall_s": round(largest["seconds"], 3),
            "largest_stall": largest,
            "largest_stall_by_fault_s": {k: round(v, 3) for k, v in sorted(by_kind.items())},
            "unexpected_warns": unknown[:50],
            "unexpected_warn_count": len(unknown),
            "errors": no_path + alive,
            "violations": self.violations,
            "logs": self.workdir,
        }
        return rep


def print_summary(rep):
    w = sys.stdout.write
    w(f"soak: seed {rep['seed']}, {rep['lab']}, {rep['wall_s']} s, {rep['epochs']} epochs "
      f"({rep['stop_reason']})\n")
    w(f"  faults injected {rep['faults_injected']}, fired {rep['faults_fired']}: " +
      ", ".join(f"{k} {v['fired']}/{v['injected']}" for k, v in rep["faults"].items()) + "\n")
    w(f"  failovers {rep['failovers']}, failbacks {rep['failbacks']}, connections resumed "
      f"{rep['connections_resumed']}, standby paths lost {rep['standby_paths_lost']}, receive "
      f"paths lost {rep['receive_paths_lost']}, rebuilt {rep['paths_rebuilt']}\n")
    w(f"  messages (completed isend+irecv) {rep['messages']}, bytes verified "
      f"{rep['bytes_verified']}, wrong elements {rep['wrong_elements']}\n")
    w(f"  errors surfaced: while no path was alive {rep['errors_no_path']}, while a path was "
      f"alive {rep['errors_path_alive']}; peer kill -> survivors' error: "
      f"{rep['peer_kill_error_s']}\n")
    w(f"  largest stall {rep['largest_stall_s']} s during {rep['largest_stall'].get('during')}"
      f"; by fault: {rep['largest_stall_by_fault_s']}\n")
    w(f"  first replayed message acked after failover: {rep['first_replay_ack_us']}\n")
    w(f"  flaps: longest down {rep['flap_down_ms_max']} ms, {rep['flaps_over_50ms']} over 50 ms; "
      f"port faults with no path event on the port: {rep['port_faults_without_path_event']}; "
      f"unexpected WARN lines: {rep['unexpected_warn_count']}\n")
    w(f"  degradations that held back packets: {rep['degrades_that_held_back_packets']}, "
      f"degraded verdicts on those ports: {rep['degraded_verdicts_on_degraded_ports']}\n")
    for u in rep["unexpected_warns"][:5]:
        w(f"  unexpected WARN: {u[:200]}\n")
    for v in rep["violations"][:20]:
        w(f"  VIOLATION: {v}\n")
    w(f"soak: {'ok' if rep['ok'] else 'FAILED'}\n")
    sys.stdout.flush()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--faults", type=int, default=0)
    ap.add_argument("--duration", type=float, default=0)
    ap.add_argument("--max-wall", type=float, default=0)
    ap.add_argument("--report", default="")
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--netlab", required=True)
    ap.add_argument("--netbench", required=True)
    ap.add_argument("--plugin", required=True)
    ap.add_argument("--bytes", default="12M")
    ap.add_argument("--slice", default="256K")
    ap.add_argument("--settle", type=float, default=3.0)
    a = ap.parse_args()
    if not a.faults and not a.duration:
        a.faults = 1000
    soak = Soak(a)
    try:
        rep = soak.run()
    except BaseException:
        for k in soak.ranks:
            if k.alive():
                k.proc.kill()
        raise
    print_summary(rep)
    if a.report:
        with open(a.report, "w", encoding="utf-8") as f:
            json.dump(rep, f, indent=1)
            f.write("\n")
    return 0 if rep["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
