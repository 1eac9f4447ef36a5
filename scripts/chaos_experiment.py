#!/usr/bin/python3
"""What does a lost node cost? Elastic training against today's full restart.

Starts an hsgd-rendezvous and --nodes nodes (default 4; one hsgd-run each, one worker per node)
on this machine and trains the MLP example (apps/train_mlp), or with --model resnet20 a ResNet-20
(apps/train_resnet, one thread per worker), on Fashion-MNIST with local SGD (models averaged
over the whole world every 8 steps), three times:

  A  elastic (--nnodes 2:N, N = --nodes), no fault: the baseline.
  B  elastic (--nnodes 2:N) with --checkpoint-dir (its own) and --checkpoint-every K (K =
     --checkpoint-every; --no-elastic-checkpoints: none), a kill schedule: kill -9 of one node's
     hsgd-run and its workers, the first 20-40 s after the first step, then every 20-40 s
     (--kills of them, node chosen at random with --seed); the same hsgd-run command is started
     again --restart-delay s later. A restarted node joins with a peer's live state, not the
     checkpoint.
  C  fixed-size (--nnodes N) with --checkpoint-dir and --checkpoint-every K, the same kill
     schedule (same seed: the same nodes at the same seconds after the first step): the survivors
     restart the whole job, which resumes from the newest checkpoint once the killed node's
     hsgd-run is back.

Network (--network): in namespace mode (netns; the default when root and `ip netns add` works)
node slot K runs in its own network namespace, whose only link (a veth) leads to a bridge in a
further "switch" namespace that also holds hsgd-rendezvous's address; the namespaces (named
after this script's pid, subnet 10.200-249.x.0/24) are removed at the end, also on an error,
Ctrl-C or SIGTERM. There, one failure of the schedule (--link-down-at K, default the 2nd) is a
lost host instead of a kill: `ip -n NS link set eth0 down` in the node's namespace, and up
again --restart-delay s later. Its hsgd-run and worker live on: B's survivors drop the node
through the agents' heartbeat (--heartbeat-timeout 3) and a watcher aborts their collectives
(bound: the collective timeout, 20 s in an elastic job, + 2 s); once the link is back the
isolated worker, cut off, stops and its hsgd-run registers the node again. C's survivors' agents
find its heartbeat silent and restart the whole job, which the isolated hsgd-run joins once it
reaches the rendezvous server again. Reported as a "link down" failure, apart from the kills.
In loopback mode (--network loopback, or without root) everything runs on 127.0.0.1 and every
failure is a kill.

Why local SGD (--mode local-sgd --period 8): with one worker per node, `node` levels and a
gradient allreduce inside the node are empty, so a hierarchy like 2:node,8:world degenerates;
a fixed level like 4:2,16:world stops fitting when the job shrinks to 3 nodes (2 does not
divide 3, the level is dropped with a warning), so the schedule would change with the churn.
Averaging every 8 steps over `world` is the same schedule on 2, 3 or 4 nodes.

Every step line of the generation's rank 0 ("[train_mlp] step N loss L (generation G, W ranks)",
or "step N loss L" in a fixed-size job) is timestamped when this script reads it from the
hsgd-runs' piped stdout (one reader thread per hsgd-run); every node writes its own --metrics-out
file (one per incarnation, the only difference between the command of a node and its restart).
Per failure it reports the time from the kill to the survivors' first step of the next
generation (B) or after the restart (C), the steps thrown away, the time until the killed node
trains again, and worker-seconds wasted; per run the final test accuracy, the training
efficiency, and the checkpoints rank 0 reported ("checkpoint: step N -> DIR/step_N (...;
training stalled X ms)"): how many, and the median and max of X, the training thread's time
inside a save (the write itself runs in the background). Definitions are printed with the table
and stored in the JSON.

On a machine with fewer cores than workers, the survivors get the lost node's CPU: the
worker-steps per second of the whole machine hardly depend on how many workers run. Measured
wall-time figures (marked "shared cores") therefore only count the pauses and the lost work, not
the absent node's capacity; the "dedicated" figures model one core per worker: every step costs
A's median step time, an absent worker's slot is idle, and the pauses are the measured ones.

Writes under --out: chaos_experiment.json (raw numbers, events, sampled step lines), the .png
(train loss, smoothed, and test accuracy at epoch ends vs seconds since the first step, kills
as vertical lines, a link-down as a thick dash-dot line with the outage shaded) and prints the
table as Markdown. Logs of every process stay in --work.
Run with Debian's /usr/bin/python3 (matplotlib); about 6-7 minutes on 2 shared cores with the
defaults (more when other jobs load the machine).

  scripts/chaos_experiment.py --build build
  scripts/chaos_experiment.py --build build --quick       # smoke run, about 1.5 minutes
  scripts/chaos_experiment.py --build build --network loopback   # kills only, on 127.0.0.1
"""

import argparse
import json
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NODES = 4  # --nodes sets it before anything else runs
PERIOD = 8  # local SGD: the whole world averages every PERIOD steps
MODE = ["--mode", "local-sgd", "--period", str(PERIOD)]
# the workers' collective timeout (HSGD_TIMEOUT_MS, not set here: the defaults) by elastic: a
# link-down must cost the survivors at most this + 2 s
COLLECTIVE_TIMEOUT_S = {True: 20.0, False: 300.0}

STEP_RE = re.compile(r"(?:\[train_(?:mlp|resnet)\] |\]\s+)step (\d+) loss (\S+)"
                     r"(?: \(generation (\d+), (\d+) ranks\))?")
GEN_RE = re.compile(r"train_(?:mlp|resnet): generation (\d+): (.*)")
EPOCH_RE = re.compile(r"\]\s+(\d+)\s+(\d+)\s+([0-9.]+)\s+([0-9.]+)%\s+([0-9.]+)\s+([0-9.]+)%")
FINAL_RE = re.compile(r"final test accuracy: ([0-9.]+)%")
AGENT_GEN_RE = re.compile(r"hsgd-run: generation (\d+): (.*)")
# rank 0's line per checkpoint handed to the background writer
CHECKPOINT_RE = re.compile(r"checkpoint: step (\d+) -> \S+( on the preemption signal)? "
                           r"\(written in the background; training stalled ([0-9.]+) ms\)")


def parent_map():
    """pid -> parent pid of every process (from /proc)."""
    out = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        # the command name is in parentheses and may hold spaces
        out[int(entry)] = int(stat[stat.rfind(")") + 2:].split()[1])
    return out


def children_of(pid, parents=None):
    """Pids whose parent is pid (empty when pid is gone)."""
    parents = parent_map() if parents is None else parents
    return [c for c, p in parents.items() if p == pid]


def kill_pid(pid):
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


class Netns:
    """The nodes' network in namespace mode: node slot K in its own network namespace, whose
    only link (NODE_DEV, a veth) leads to a bridge in a further "switch" namespace; the bridge
    holds the rendezvous server's address, which never goes down. Names and the /24 subnet
    derive from this script's pid (unique per run; nothing is sent outside these namespaces).
    remove() deletes every namespace create() made, also after a partial create()."""

    NODE_DEV = "eth0"

    def __init__(self):
        pid = os.getpid()
        self.switch = f"hsgdchaos{pid}sw"
        self.nodes = [f"hsgdchaos{pid}n{k}" for k in range(NODES)]
        # 10.200-249.x.0/24: apart from the end-to-end tests' 10.100-199 range
        self.subnet = f"10.{200 + pid % 50}.{pid % 250}"
        self.server_addr = f"{self.subnet}.254"
        self.created = []

    @staticmethod
    def ip(*argv):
        r = subprocess.run(["ip", *argv], capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"ip {' '.join(argv)}: {r.stderr.strip()}")

    def create(self):
        sw = self.switch
        self.ip("netns", "add", sw)
        self.created.append(sw)
        self.ip("-n", sw, "link", "set", "lo", "up")
        self.ip("-n", sw, "link", "add", "br0", "type", "bridge")
        self.ip("-n", sw, "addr", "add", f"{self.server_addr}/24", "dev", "br0")
        self.ip("-n", sw, "link", "set", "br0", "up")
        for k, ns in enumerate(self.nodes):
            self.ip("netns", "add", ns)
            self.created.append(ns)
            self.ip("-n", ns, "link", "set", "lo", "up")
            self.ip("-n", ns, "link", "add", self.NODE_DEV, "type", "veth", "peer", "name",
                    f"port{k}", "netns", sw)
            self.ip("-n", sw, "link", "set", f"port{k}", "master", "br0", "up")
            self.ip("-n", ns, "addr", "add", f"{self.subnet}.{k + 1}/24", "dev", self.NODE_DEV)
            self.ip("-n", ns, "link", "set", self.NODE_DEV, "up")

    def link(self, slot, up):
        """ip -n NS link set NODE_DEV up|down: node slot's only link to the others."""
        self.ip("-n", self.nodes[slot], "link", "set", self.NODE_DEV, "up" if up else "down")

    def remove(self):
        for ns in reversed(self.created):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        self.created = []

    def exec_argv(self, ns):
        """`ip netns exec NS` execs the program: the Popen pid is the program's."""
        return ["ip", "netns", "exec", ns]


def network_or_loopback(choice):
    """A created Netns, or None for loopback, and why (printed)."""
    if choice == "loopback":
        return None, "loopback (--network loopback)"
    if os.geteuid() != 0:
        if choice == "netns":
            sys.exit("chaos_experiment: --network netns needs root")
        return None, "loopback (not root: no network namespaces, no link-down failure)"
    net = Netns()
    try:
        net.create()
    except RuntimeError as e:
        net.remove()
        if choice == "netns":
            sys.exit(f"chaos_experiment: cannot create the network namespaces: {e}")
        return None, f"loopback (network namespaces unavailable: {e}; no link-down failure)"
    except BaseException:
        net.remove()  # interrupted while creating them
        raise
    return net, (f"network namespaces {net.nodes[0][:-1]}0-{NODES - 1} on a bridge in "
                 f"{net.switch}, subnet {net.subnet}.0/24, rendezvous at {net.server_addr}")


class Proc:
    """One child process; its stdout+stderr go to a log and, line by line, to on_line."""

    def __init__(self, label, argv, log_path, on_line):
        self.label = label
        self.argv = argv
        self.log_path = log_path
        self.log = open(log_path, "w")
        self.popen = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      stdin=subprocess.DEVNULL, text=True, bufsize=1)
        self.pid = self.popen.pid
        self.workers = set()  # every child pid seen, killed at the end if still there
        self.thread = threading.Thread(target=self._read, args=(on_line,), daemon=True)
        self.thread.start()

    def _read(self, on_line):
        for line in self.popen.stdout:
            t = time.monotonic()
            self.log.write(f"{t:.3f} {line}")
            self.log.flush()
            on_line(t, self, line.rstrip("\n"))
        self.log.close()

    def poll_workers(self, parents=None):
        if self.popen.poll() is None:
            self.workers.update(children_of(self.pid, parents))

    def kill_all(self):
        """kill -9 of this process and its workers, as a node that dies."""
        self.poll_workers()
        victims = [self.pid] + children_of(self.pid)
        for pid in victims:
            kill_pid(pid)
        return victims

    def stop(self, timeout=10):
        self.poll_workers()
        if self.popen.poll() is None:
            kill_pid(self.pid)
        for pid in sorted(self.workers):
            if is_our_worker(pid):
                kill_pid(pid)
        try:
            self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pass
        self.thread.join(timeout=timeout)


def is_our_worker(pid):
    """pid still runs one of the programs we start (not a reused pid)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = f.read()
    except OSError:
        return False
    return b"train_mlp" in cmd or b"train_resnet" in cmd or b"hsgd-run" in cmd


class Stalled(RuntimeError):
    """A run made no progress within its bound; its logs are kept."""


class Run:
    """One job (A, B or C): its processes, the events read from them, the kills."""

    def __init__(self, name, args, work, elastic, kills, attempt=0, net=None):
        self.name = name
        self.net = net  # Netns, or None: loopback
        self.args = args
        self.dir = os.path.join(work, name if attempt == 0 else f"{name}.retry{attempt}")
        os.makedirs(self.dir, exist_ok=True)
        self.elastic = elastic
        self.kill_plan = kills  # [(seconds after the first step, node)]
        # C always; B unless --no-elastic-checkpoints; A never (the baseline)
        self.writes_checkpoints = name == "C" or (name == "B" and not args.no_elastic_checkpoints)
        self.lock = threading.Lock()
        self.steps = []  # (t, step, loss, generation, world, node label)
        self.gens = []  # (t, generation, text)
        self.agent_gens = []  # (t, node label, generation, text)
        self.epochs = []  # (t, epoch, steps, test accuracy)
        self.checkpoints = []  # (t, step, training thread's stall in ms, on preemption, label)
        self.final_acc = None
        self.other = []  # (t, label, line) of restarts, resumes, errors
        self.kills = []  # dicts, one per failure: "kind" is "kill" or "link down"
        self.procs = []
        self.nodes = [None] * NODES  # current Proc per node slot
        self.incarnation = [0] * NODES
        self.t_first = None
        self.rdzv = None

    def on_line(self, t, proc, line):
        if line.startswith(" "):
            # hsgd-run's report of a failed rank quotes its last lines, indented: not new output
            with self.lock:
                self.other.append((t, proc.label, line))
            return
        with self.lock:
            m = STEP_RE.search(line)
            if m:
                gen = int(m.group(3)) if m.group(3) else None
                world = int(m.group(4)) if m.group(4) else NODES
                self.steps.append((t, int(m.group(1)), float(m.group(2)), gen, world,
                                   proc.label))
                if self.t_first is None:
                    self.t_first = t
                return
            m = GEN_RE.search(line)
            if m:
                self.gens.append((t, int(m.group(1)), m.group(2)))
                return
            m = AGENT_GEN_RE.search(line)
            if m:
                self.agent_gens.append((t, proc.label, int(m.group(1)), m.group(2)))
                return
            m = EPOCH_RE.search(line)
            if m:
                self.epochs.append((t, int(m.group(1)), int(m.group(2)), float(m.group(6))))
                return
            m = FINAL_RE.search(line)
            if m:
                self.final_acc = float(m.group(1))
                return
            m = CHECKPOINT_RE.search(line)
            if m:
                self.checkpoints.append((t, int(m.group(1)), float(m.group(3)),
                                         m.group(2) is not None, proc.label))
                return
            if re.search(r"resum|restart|attempt|error|Error|FAIL|fail|lost", line):
                self.other.append((t, proc.label, line))

    def token_file(self):
        """The job's token (TLS keys, docs/security.md) in a 0600 file: never on a command line."""
        path = os.path.join(self.dir, "token")
        if not os.path.exists(path):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(os.urandom(32).hex())
        return path

    def start_rendezvous(self):
        log = os.path.join(self.dir, "rdzv.log")
        security = ["--token-file", self.token_file()]
        if self.net is None:
            argv = [self.args.rdzv_bin, "--host", "127.0.0.1", "--port", "0"] + security
        else:
            argv = self.net.exec_argv(self.net.switch) + [
                self.args.rdzv_bin, "--host", self.net.server_addr, "--port", "0"] + security
        self.rdzv = Proc("rdzv", argv, log, lambda *_: None)
        self.procs.append(self.rdzv)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            with open(log) as f:
                m = re.search(r"^\S+ listening on (\S+)", f.read(), re.M)
            if m:
                return m.group(1)
            time.sleep(0.1)
        raise RuntimeError(f"hsgd-rendezvous did not start: see {log}")

    def node_argv(self, endpoint, slot):
        a = self.args
        nnodes = f"2:{NODES}" if self.elastic else str(NODES)
        metrics = os.path.join(self.dir, f"metrics.node{slot}.{self.incarnation[slot]}.jsonl")
        argv = [a.run_bin, "--nnodes", nnodes, "--nproc-per-node", "1", "--rdzv-endpoint",
                endpoint, "--rdzv-id", f"chaos-{self.name}", "--heartbeat-timeout", "3",
                "--rdzv-last-call", "1", "--max-restarts", str(a.max_restarts),
                "--token-file", self.token_file(), "--",
                a.train_bin, "--data-dir", a.data_dir, "--epochs", str(a.epochs), "--log-every",
                "1", "--seed", str(a.seed), "--metrics-out", metrics] + MODE + a.model_flags
        if a.train_subset:
            argv += ["--train-subset", str(a.train_subset)]
        if self.writes_checkpoints:
            argv += ["--checkpoint-dir", os.path.join(self.dir, "checkpoints"),
                     "--checkpoint-every", str(a.checkpoint_every)]
        return argv

    def start_node(self, endpoint, slot):
        label = f"node{slot}.{self.incarnation[slot]}"
        argv = self.node_argv(endpoint, slot)
        if self.net is not None:
            argv = self.net.exec_argv(self.net.nodes[slot]) + argv
        proc = Proc(label, argv,
                    os.path.join(self.dir, f"{label}.log"), self.on_line)
        self.procs.append(proc)
        self.nodes[slot] = proc
        return proc

    def execute(self):
        """Runs the job and its kill schedule; returns when every node's hsgd-run exited."""
        a = self.args
        self.loadavg = [read_loadavg()]
        if self.net is not None:
            for slot in range(NODES):
                self.net.link(slot, up=True)
        endpoint = self.start_rendezvous()
        for slot in range(NODES):
            self.start_node(endpoint, slot)
        t_start = time.monotonic()
        plan = list(self.kill_plan)
        pending_restarts = []  # (time, slot)
        pending_links = []  # (time, slot, the failure's event): links to bring up
        failure_no = 0  # entries of the schedule taken so far
        last_scan = 0.0
        while True:
            now = time.monotonic()
            if now - last_scan > 0.5:
                parents = parent_map()
                for p in self.procs:
                    p.poll_workers(parents)
                last_scan = now
            if now - t_start > a.run_timeout:
                raise Stalled(f"run {self.name}: not finished after {a.run_timeout} s "
                              f"(logs in {self.dir})")
            with self.lock:
                t_first = self.t_first
                t_last = self.steps[-1][0] if self.steps else t_start
                max_step = max((s[1] for s in self.steps), default=0)
                gen_now = max((s[3] for s in self.steps if s[3] is not None), default=None)
                world = self.steps[-1][4] if self.steps else NODES
            if now - t_last > a.stall_timeout:
                raise Stalled(f"run {self.name}: no step line for {now - t_last:.0f} s after "
                              f"step {max_step} (logs in {self.dir})")
            if plan and t_first is not None and now >= t_first + plan[0][0]:
                _, slot = plan.pop(0)
                failure_no += 1
                kind = "link down" if failure_no == a.link_down_at else "kill"
                proc = self.nodes[slot]
                if proc.popen.poll() is None and kind == "kill":
                    victims = proc.kill_all()
                    self.kills.append({"t": now, "kind": kind, "slot": slot,
                                       "label": proc.label, "pids": victims,
                                       "step_at_kill": max_step, "generation_at_kill": gen_now,
                                       "world_at_kill": world})
                    print(f"  [{self.name}] {now - t_first:6.1f} s: kill -9 {proc.label} "
                          f"(pids {victims}) at step {max_step}", flush=True)
                    try:
                        proc.popen.wait(timeout=10)
                    except subprocess.TimeoutExpired:
                        pass
                    self.incarnation[slot] += 1
                    pending_restarts.append((now + a.restart_delay, slot))
                elif proc.popen.poll() is None:
                    # A lost host: its processes live on, nothing reaches them until the link
                    # is back (--restart-delay s later); then it rejoins by itself.
                    self.net.link(slot, up=False)
                    self.kills.append({"t": now, "kind": kind, "slot": slot,
                                       "label": proc.label, "pid": proc.pid,
                                       "netns": self.net.nodes[slot],
                                       "step_at_kill": max_step, "generation_at_kill": gen_now,
                                       "world_at_kill": world})
                    print(f"  [{self.name}] {now - t_first:6.1f} s: link down: {proc.label} "
                          f"({self.net.nodes[slot]} {Netns.NODE_DEV}) at step {max_step}",
                          flush=True)
                    pending_links.append((now + a.restart_delay, slot, self.kills[-1]))
                else:
                    print(f"  [{self.name}] {kind} of node {slot} skipped: its hsgd-run has "
                          f"exited", flush=True)
            for item in list(pending_links):
                if now >= item[0]:
                    pending_links.remove(item)
                    self.net.link(item[1], up=True)
                    item[2]["t_up"] = now
                    with self.lock:
                        self.other.append((now, self.nodes[item[1]].label,
                                           "link up by chaos_experiment"))
                    print(f"  [{self.name}] {now - t_first:6.1f} s: link up: "
                          f"{self.nodes[item[1]].label}", flush=True)
            for item in list(pending_restarts):
                if now >= item[0]:
                    pending_restarts.remove(item)
                    p = self.start_node(endpoint, item[1])
                    with self.lock:
                        self.other.append((now, p.label, "restarted by chaos_experiment"))
                    print(f"  [{self.name}] {now - t_first:6.1f} s: started {p.label}",
                          flush=True)
            running = [p for p in self.nodes if p.popen.poll() is None]
            if not running and not pending_restarts and not pending_links:
                break
            time.sleep(0.05)
        for p in self.nodes:
            p.thread.join(timeout=10)
        self.loadavg.append(read_loadavg())
        self.exit_codes = {p.label: p.popen.returncode for p in self.procs if p is not self.rdzv}

    def stop_all(self):
        for p in self.procs:
            p.stop()
        if self.net is not None:
            for slot in range(NODES):
                try:
                    self.net.link(slot, up=True)
                except RuntimeError:
                    pass


def read_loadavg():
    """The 1-minute load average of the machine (other jobs share its cores)."""
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])


def tail_lines(run, n=6):
    """The last warnings of every node of a run, for the report of a stall."""
    out = []
    for p in run.procs:
        try:
            with open(p.log_path) as f:
                lines = [l.rstrip() for l in f if "warning" in l or "error" in l]
        except OSError:
            continue
        out += [f"{p.label}: {l[:400]}" for l in lines[-n:]]
    return out


def sampled_steps(run):
    """Rank 0's step lines as strings, thinned for the JSON."""
    keep = set(range(0, len(run.steps), 20))
    for k in run.kills:
        i = next((j for j, s in enumerate(run.steps) if s[0] > k["t"]), len(run.steps))
        keep.update(range(max(0, i - 5), min(len(run.steps), i + 10)))
    return [f"{s[0] - run.t_first:.3f} {s[1]} {s[2]} {s[3]} {s[4]} {s[5]}"
            for j, s in enumerate(run.steps) if j in keep]


def plan_kills(args):
    rng = random.Random(args.seed)
    plan, t = [], 0.0
    for _ in range(args.kills):
        t += rng.uniform(*args.kill_interval)
        plan.append((round(t, 1), rng.randrange(NODES)))
    return plan


# ---- analysis ----

def step_facts(run):
    """Unique steps in order of first appearance and the repeats (a step number seen again)."""
    seen, repeats, executed = {}, [], 0
    for s in run.steps:
        executed += 1
        if s[1] in seen:
            repeats.append(s)
        else:
            seen[s[1]] = s
    return seen, repeats, executed


def median_gap(run):
    ts = [s[0] for s in run.steps]
    gaps = [b - a for a, b in zip(ts, ts[1:]) if b > a]
    return statistics.median(gaps) if gaps else float("nan")


def evaluation_gap(run):
    """Median seconds of rank 0's step-line gaps that hold an epoch line: an epoch's evaluation
    (with the step before it) in a run without faults."""
    ts = sorted(s[0] for s in run.steps)
    evaluations = [e[0] for e in run.epochs]
    gaps = [b - a for a, b in zip(ts, ts[1:]) if any(a < e <= b for e in evaluations)]
    return statistics.median(gaps) if gaps else 0.0


def pauses(run, t0, t1, normal, failed, eval_gap):
    """Seconds of rank 0's step-line gaps in [t0, t1] beyond 5x the normal step time; the
    failed node's lines (failed(s)) count at the failure (t0): a killed node's were written
    before it, an isolated node's are not the survivors' progress. A gap with an epoch line in
    it holds the epoch's evaluation, which the unfaulted run has too (eval_gap, its typical
    gap): only what exceeds that is a pause (a failure may stall the job across an epoch's
    end). Returns (pauses, evaluations)."""
    ts = sorted(min(s[0], t0) if failed(s) else s[0] for s in run.steps)
    evaluations = [e[0] for e in run.epochs]
    total = evaluating = 0.0
    prev = max([t for t in ts if t <= t0], default=t0)
    for t in ts:
        if t <= t0:
            continue
        if t > t1:
            break
        gap = t - prev
        if gap > 5 * normal:
            if any(prev < e <= t for e in evaluations):
                evaluating += min(gap, eval_gap)
                total += max(0.0, gap - eval_gap - normal)
            else:
                total += gap - normal
        prev = t
    return total, evaluating


def analyse_failures(run, base, ws_s):
    """One dict per kill; base is the analysis of the unfaulted run A, ws_s the run's own
    seconds per worker-step before its first kill."""
    t_step = base["step_s"]  # A's median seconds per step (NODES workers)
    out = []
    kills = run.kills
    for i, k in enumerate(kills):
        t_kill = k["t"]
        t_next_kill = kills[i + 1]["t"] if i + 1 < len(kills) else float("inf")
        dead = k["label"]
        link = k.get("kind") == "link down"
        g0 = k["generation_at_kill"]
        t_up = k.get("t_up") or float("inf")

        def failed(s):
            """A line of the failed node that is not the survivors' progress: a killed node's
            (read after the kill, written before it: the pipe), an isolated node's until its
            link is back (its steps of the old generation, alone)."""
            if s[5] != dead:
                return False
            return not link or s[0] < t_up or (s[3] is not None and g0 is not None
                                                and s[3] <= g0)

        def before(s):
            """A line written before the failure (an isolated node's are read at once)."""
            return s[0] <= t_kill or (not link and s[5] == dead)

        after = [s for s in run.steps if t_kill < s[0] < t_next_kill and not failed(s)]
        # the job's step at the failure: rank 0's last step line written before it (C may be
        # recomputing steps after an earlier restart: not the highest step ever printed)
        at_kill = ([s[1] for s in run.steps if before(s)] or [0])[-1]
        k["step_at_kill"] = at_kill
        f = {"kill_s": t_kill - run.t_first, "kind": k.get("kind", "kill"), "node": dead,
             "step_at_kill": at_kill}
        if link:
            f["link_up_s"] = t_up - run.t_first if t_up != float("inf") else None
            f["isolated_node_steps_alone"] = sorted(
                {s[1] for s in run.steps if s[5] == dead and t_kill < s[0] < t_up})
        first = after[0] if after else None
        f["kill_to_first_step_line_s"] = first[0] - t_kill if first else None
        if run.elastic:
            lost = next((g for g in run.gens if g[0] > t_kill and "lost node" in g[2]), None)
            newgen = next((s for s in after if s[3] is not None and s[3] > g0), None)
            if link:
                # the isolated hsgd-run registers its node again (node ids are HOST-PID-N)
                join = next((g for g in run.gens if g[0] > t_kill and "joined node" in g[2]
                             and f"-{k['pid']}-" in g[2]), None)
            else:
                join = next((g for g in run.gens if g[0] > t_kill and g[0] < t_next_kill
                             and "joined node" in g[2]), None)
            old = [s for s in after if newgen is None or s[0] < newgen[0]]
            f["kill_to_lost_generation_s"] = lost[0] - t_kill if lost else None
            if newgen is None and link and lost is None:
                # an outage the job rode out (no generation dropped the node): the survivors'
                # first step that needed the averaging the outage held up
                boundary = at_kill + (-(at_kill - 1) % PERIOD or PERIOD)
                rode = next((s for s in after if s[1] >= boundary), None)
                f["rode_out_outage"] = True
                f["kill_to_survivors_step_s"] = rode[0] - t_kill if rode else None
            else:
                f["kill_to_survivors_step_s"] = newgen[0] - t_kill if newgen else None
            f["survivors_steps_before_new_generation"] = len(old)
            f["kill_to_node_back_s"] = join[0] - t_kill if join else None
            f["join_generation"] = join[1] if join else None
            f["join_text"] = join[2] if join else None
            f["lost_text"] = lost[2] if lost else None
            m = re.search(r"\((\d+) bytes\)", join[2]) if join else None
            f["join_state_bytes"] = int(m.group(1)) if m else None
            m = re.search(r"agreement ([0-9.]+) ms", join[2]) if join else None
            f["join_agreement_ms"] = float(m.group(1)) if m else None
            # rank 0's repeats in the window: the elastic contract says none
            window_steps = [s[1] for s in after]
            done = {s[1] for s in run.steps if before(s)}
            # steps that no rank 0 printed: the survivors' local steps after the loss of the
            # node that ran rank 0, up to the averaging that failed
            f["rank0_unprinted_steps"] = (newgen[1] - at_kill - 1 - len(old)) if newgen else None
            f["survivors"] = (old[0][4] if old else k["world_at_kill"]) - 1
            f["rank0_repeated_steps"] = sum(1 for s in window_steps if s in done) + (
                len(window_steps) - len(set(window_steps)))
            # the killed worker's local steps since its last world averaging (steps 1, 9, 17,
            # ...: the averager counts its calls from 0); it was at about rank 0's step. An
            # isolated worker trains on alone up to the averaging that cannot complete: all of
            # a period's local steps are lost.
            f["killed_worker_local_steps_lost"] = (PERIOD - 1 if link
                                                   else (k["step_at_kill"] - 1) % PERIOD)
            f["steps_thrown_away"] = f["rank0_repeated_steps"]
            t_back = join[0] if join else None
        else:
            # the first repeated step number after the kill is the resumed one + 1
            prev_max = k["step_at_kill"]
            hi = prev_max
            resume = None
            for s in after:
                if s[1] <= hi:
                    resume = s
                    break
                hi = s[1]
            if resume is None:
                # no step again: the survivors stopped at a step boundary with a checkpoint
                # (their agent's SIGTERM, when no collective held them); the restart's first
                # step comes after the agents' "restarting all nodes"
                t_restart = next((o[0] for o in run.other
                                  if t_kill < o[0] < t_next_kill and "restarting all" in o[2]),
                                 None)
                resume = next((s for s in after if t_restart and s[0] > t_restart), None)
                hi = max([s[1] for s in after if resume and s[0] < resume[0]] + [prev_max])
            f["steps_after_kill_before_restart"] = hi - prev_max
            f["resumed_from_step"] = resume[1] - 1 if resume else None
            f["kill_to_survivors_step_s"] = resume[0] - t_kill if resume else None
            f["kill_to_node_back_s"] = f["kill_to_survivors_step_s"]
            f["steps_thrown_away"] = max(0, prev_max - (resume[1] - 1)) if resume else None
            f["steps_recomputed"] = hi - (resume[1] - 1) if resume else None
            recovered = next((s for s in after if resume and s[0] >= resume[0] and s[1] > hi),
                             None)
            f["kill_to_progress_recovered_s"] = recovered[0] - t_kill if recovered else None
            t_back = resume[0] if resume else None
        # Worker-seconds wasted, two ways.
        # shared cores (measured): the NODES worker slots' seconds from the kill until the node is
        # back, minus what A needed for the useful worker-steps done in that window.
        if t_back is not None:
            win = [s for s in after if s[0] <= t_back]
            if run.elastic:
                useful = (sum(s[4] for s in win) - f["killed_worker_local_steps_lost"]
                          + (f["rank0_unprinted_steps"] or 0) * f["survivors"])
            else:
                # steps before the resume are lost unless the checkpoint resumed from holds
                # them (survivors that stopped at a step boundary); the resume is a repeat
                kept = f["resumed_from_step"]
                useful = sum(s[4] for s in win if s[0] < t_back and s[1] <= kept)
            # dedicated cores (modelled): survivors idle during the pauses, the killed node's
            # slot idle until it is back, lost or recomputed steps at A's step time
            # the pause ends at the survivors' first step after it (B: the step after the
            # generation line)
            t_resumed = t_kill + (f["kill_to_survivors_step_s"] or 0)
            pause, evaluating = pauses(run, t_kill, max(t_back, t_resumed), base["step_s"],
                                       failed, base["evaluation_gap_s"])
            f["evaluation_s_in_window"] = evaluating
            f["wasted_worker_s_shared"] = (NODES * (t_back - t_kill - evaluating)
                                           - useful * ws_s)
            if run.elastic:
                n_surv = f["survivors"]
                f["pause_s"] = pause
                f["wasted_worker_s_dedicated"] = (
                    n_surv * pause + (t_back - t_kill)
                    + f["killed_worker_local_steps_lost"] * t_step)
            else:
                f["pause_s"] = pause
                f["wasted_worker_s_dedicated"] = (NODES * pause
                                                  + NODES * f["steps_recomputed"] * t_step)
            # the same less the killed node's own absence until its hsgd-run is started again
            # (the restart delay): a failure costs that under any recovery; what is left is what
            # the recovery itself wastes (C: the survivors idle meanwhile, B: they train on)
            f["wasted_worker_s_recovery"] = (f["wasted_worker_s_dedicated"]
                                             - run.args.restart_delay)
        if link:
            bound = COLLECTIVE_TIMEOUT_S[run.elastic] + 2
            f["bound_s"] = bound
            v = f.get("kill_to_survivors_step_s")
            f["within_bound"] = v is not None and v <= bound
        out.append(f)
    return out


def checkpoint_facts(run):
    """The checkpoints rank 0 reported: how many, at which steps, and the training thread's stall
    per save (median, max; ms). None where the run writes none."""
    if not run.writes_checkpoints:
        return {"checkpoint_every": None, "checkpoints_saved": None}
    stalls = [c[2] for c in run.checkpoints]
    return {"checkpoint_every": run.args.checkpoint_every,
            "checkpoints_saved": len(run.checkpoints),
            "checkpoints_on_preemption": sum(1 for c in run.checkpoints if c[3]),
            "checkpoint_steps": [c[1] for c in run.checkpoints],
            "checkpoint_stall_ms_median": statistics.median(stalls) if stalls else None,
            "checkpoint_stall_ms_max": max(stalls) if stalls else None}


def analyse(run, base=None):
    seen, repeats, executed = step_facts(run)
    t_last = run.steps[-1][0] if run.steps else run.t_first
    wall = t_last - run.t_first if run.steps else None
    r = {"name": run.name, "elastic": run.elastic, "final_test_accuracy": run.final_acc,
         "steps": max(seen) if seen else 0, "step_lines": executed, "repeated_step_lines":
         len(repeats), "train_wall_s": wall, "step_s": median_gap(run),
         "evaluation_gap_s": evaluation_gap(run),
         "generations": len({g[1] for g in run.gens}), "exit_codes": run.exit_codes,
         "kill_plan": run.kill_plan, "loadavg_start_end": run.loadavg}
    r.update(checkpoint_facts(run))
    # useful worker-steps: every unique step times the world that ran it
    useful = sum(s[4] for s in seen.values())
    r["worker_steps"] = useful
    # the run's own pace before its first fault: the machine's other jobs change it from run
    # to run
    t_end = run.kills[0]["t"] if run.kills else t_last
    before = [s for s in seen.values() if s[0] <= t_end]
    r["worker_steps_per_s_before_first_kill"] = (
        sum(s[4] for s in before) / (t_end - run.t_first) if t_end > run.t_first else None)
    if base is None:
        r["worker_step_s"] = wall / useful if useful else None  # A: seconds per worker-step
        r["failures"] = []
        r["efficiency_shared"] = 1.0
        r["efficiency_shared_own_pace"] = 1.0
        r["efficiency_dedicated"] = 1.0
        return r
    own_ws_s = 1.0 / r["worker_steps_per_s_before_first_kill"]
    failures = analyse_failures(run, base, own_ws_s)
    r["failures"] = failures
    lost_local = sum(f.get("killed_worker_local_steps_lost", 0) for f in failures)
    unprinted = [(f.get("rank0_unprinted_steps") or 0, f.get("survivors", 0)) for f in failures]
    useful += sum(n * w for n, w in unprinted) - lost_local
    executed += sum(n for n, _ in unprinted)
    r["rank0_unprinted_steps"] = sum(n for n, _ in unprinted)
    r["useful_worker_steps"] = useful
    # shared cores: useful worker-steps over what A does in the same wall time
    r["efficiency_shared"] = useful / (wall / base["worker_step_s"]) if wall else None
    r["efficiency_shared_own_pace"] = useful / (wall / own_ws_s) if wall else None
    # dedicated cores: every executed step at A's step time, plus the measured pauses; every
    # slot counts as capacity, an absent node's too
    t_ded = executed * base["step_s"] + sum(f.get("pause_s", 0) for f in failures)
    r["dedicated_wall_s"] = t_ded
    r["efficiency_dedicated"] = useful / (NODES * t_ded / base["step_s"])
    return r


def fmt(v, spec=".1f"):
    if v is None:
        return "-"
    if isinstance(v, float) and v != v:
        return "nan"
    return format(v, spec)


def table(results):
    a, b, c = results["A"], results["B"], results["C"]
    lines = ["| | A: elastic, no fault | B: elastic, kills | C: fixed size + checkpoints, kills |",
             "|---|---|---|---|"]

    def row(name, fa, fb, fc):
        lines.append(f"| {name} | {fa} | {fb} | {fc} |")

    def failures(r, kind="kill"):
        return [f for f in r["failures"] if f.get("kind", "kill") == kind]

    def per_failure(r, key, spec=".1f", kind="kill"):
        vals = [f.get(key) for f in failures(r, kind)]
        return ", ".join(fmt(v, spec) for v in vals) if vals else "-"

    def mean(r, key):
        vals = [f.get(key) for f in failures(r) if f.get(key) is not None]
        return sum(vals) / len(vals) if vals else None

    row("final test accuracy (%)", fmt(a["final_test_accuracy"], ".2f"),
        fmt(b["final_test_accuracy"], ".2f"), fmt(c["final_test_accuracy"], ".2f"))
    row("steps (rank 0) / step lines incl. repeats", f"{a['steps']} / {a['step_lines']}",
        f"{b['steps']} / {b['step_lines']}", f"{c['steps']} / {c['step_lines']}")
    row("training wall time, first to last step (s)", fmt(a["train_wall_s"]),
        fmt(b["train_wall_s"]), fmt(c["train_wall_s"]))
    row("pace before the first kill (worker-steps/s) / load average at start, end",
        *(f"{fmt(r['worker_steps_per_s_before_first_kill'], '.0f')} / "
          f"{', '.join(fmt(x) for x in r['loadavg_start_end'])}" for r in (a, b, c)))
    row("kills (s after the first step: node)", "-",
        ", ".join(f"{f['kill_s']:.0f}: {f['node']}" for f in failures(b)) or "-",
        ", ".join(f"{f['kill_s']:.0f}: {f['node']}" for f in failures(c)) or "-")
    row("kill -> survivors' first step of the next generation / after the restart (s)", "-",
        per_failure(b, "kill_to_survivors_step_s"), per_failure(c, "kill_to_survivors_step_s"))
    row("kill -> rank 0's first step line, any (s)", "-",
        per_failure(b, "kill_to_first_step_line_s"), per_failure(c, "kill_to_first_step_line_s"))
    row("steps thrown away (B: rank 0's repeats; C: step at the kill - step resumed from)", "-",
        per_failure(b, "steps_thrown_away", "d"), per_failure(c, "steps_thrown_away", "d"))
    row("steps done by the survivors that no rank 0 printed (B)", "-",
        per_failure(b, "rank0_unprinted_steps", "d"), "-")
    row("killed worker's local steps lost (B) / steps recomputed incl. those after the kill (C)",
        "-", per_failure(b, "killed_worker_local_steps_lost", "d"),
        per_failure(c, "steps_recomputed", "d"))
    row("kill -> killed node training again (s)", "-", per_failure(b, "kill_to_node_back_s"),
        per_failure(c, "kill_to_node_back_s"))
    row("state sent to the joiner (bytes) / agreement (ms)", "-",
        ", ".join(f"{fmt(f.get('join_state_bytes'), 'd')} / {fmt(f.get('join_agreement_ms'))}"
                  for f in failures(b)) or "-", "-")
    row("wasted worker-s per failure, shared cores (measured)", "-",
        *(f"{per_failure(r, 'wasted_worker_s_shared')} "
          f"(mean {fmt(mean(r, 'wasted_worker_s_shared'))})" for r in (b, c)))
    row("wasted worker-s per failure, one core per worker (modelled)", "-",
        f"{per_failure(b, 'wasted_worker_s_dedicated')} "
        f"(mean {fmt(mean(b, 'wasted_worker_s_dedicated'))})",
        f"{per_failure(c, 'wasted_worker_s_dedicated')} "
        f"(mean {fmt(mean(c, 'wasted_worker_s_dedicated'))})")
    row("wasted worker-s per failure, one core per worker, less the killed node's restart "
        "delay (modelled)", "-",
        f"{per_failure(b, 'wasted_worker_s_recovery')} "
        f"(mean {fmt(mean(b, 'wasted_worker_s_recovery'))})",
        f"{per_failure(c, 'wasted_worker_s_recovery')} "
        f"(mean {fmt(mean(c, 'wasted_worker_s_recovery'))})")

    if failures(b, "link down") or failures(c, "link down"):
        def down(key, spec=".1f"):
            return [per_failure(r, key, spec, "link down") for r in (b, c)]

        row("link down (s after the first step: node; back up at s)", "-",
            *(", ".join(f"{f['kill_s']:.0f}: {f['node']}; {fmt(f.get('link_up_s'), '.0f')}"
                        for f in failures(r, "link down")) or "-" for r in (b, c)))
        row("link down -> survivors' first step of the next generation / after the restart "
            "(s) (bound: the collective timeout + 2 s)", "-",
            *(", ".join(f"{fmt(f.get('kill_to_survivors_step_s'))} "
                        f"({'within' if f.get('within_bound') else 'NOT within'} "
                        f"{fmt(f.get('bound_s'), '.0f')})"
                        for f in failures(r, "link down")) or "-" for r in (b, c)))
        row("link down: steps thrown away (as for kills)", "-", *down("steps_thrown_away", "d"))
        row("link down: isolated worker's local steps lost (B) / steps recomputed (C)", "-",
            per_failure(b, "killed_worker_local_steps_lost", "d", "link down"),
            per_failure(c, "steps_recomputed", "d", "link down"))
        row("link down -> node training again (s)", "-", *down("kill_to_node_back_s"))
        row("link down: wasted worker-s, shared cores (measured)", "-",
            *down("wasted_worker_s_shared"))
        row("link down: wasted worker-s, one core per worker (modelled)", "-",
            *down("wasted_worker_s_dedicated"))
        row("link down: wasted worker-s, one core per worker, less the outage of "
            "--restart-delay s (modelled)", "-", *down("wasted_worker_s_recovery"))

    def ratio(key):
        mb, mc = mean(b, key), mean(c, key)
        return fmt(mc / mb, ".1f") + "x" if mb and mc is not None else "-"

    row("C's waste per failure / B's (means): shared, one core per worker, less the delay", "-",
        f"{ratio('wasted_worker_s_shared')}, {ratio('wasted_worker_s_dedicated')}, "
        f"{ratio('wasted_worker_s_recovery')}", "-")
    row("training efficiency, shared cores, vs A's pace (measured)", "1.00",
        fmt(b["efficiency_shared"], ".2f"), fmt(c["efficiency_shared"], ".2f"))
    row("training efficiency, shared cores, vs the run's own pace before the first kill", "1.00",
        fmt(b["efficiency_shared_own_pace"], ".2f"), fmt(c["efficiency_shared_own_pace"], ".2f"))
    row("training efficiency, one core per worker (modelled)", "1.00",
        fmt(b["efficiency_dedicated"], ".2f"), fmt(c["efficiency_dedicated"], ".2f"))

    def saved(r):
        if r["checkpoints_saved"] is None:
            return "-"
        pre = r["checkpoints_on_preemption"]
        return (f"{r['checkpoints_saved']} (every {r['checkpoint_every']} steps"
                + (f"; {pre} on the preemption signal)" if pre else ")"))

    def stall(r):
        if not r["checkpoints_saved"]:
            return "-"
        return (f"{fmt(r['checkpoint_stall_ms_median'])} / "
                f"{fmt(r['checkpoint_stall_ms_max'])}")

    row("checkpoints saved (rank 0's lines)", *(saved(r) for r in (a, b, c)))
    row("training stalled per save, median / max (ms)", *(stall(r) for r in (a, b, c)))
    return "\n".join(lines)


DEFINITIONS = """\
Definitions (N: the nodes, --nodes; times are when this script read the line from the
hsgd-runs' stdout):
- survivors' step: B: rank 0's first step line of a generation newer than the one at the kill;
  C: rank 0's first step line after the restart (a step number seen before).
- steps thrown away: B: step numbers rank 0 prints again (the elastic contract: 0); C: the
  highest step at the kill minus the checkpoint step resumed from. C also recomputes the steps
  the survivors made between the kill and the restart ("recomputed").
- killed node training again: B: rank 0's generation line that reports a joined node; C: the
  first step after the restart (every node trains again).
- wasted worker-s, shared cores: N x (seconds from the kill until the killed node trains again,
  less the epoch evaluations in them) minus the run's own seconds per worker-step before its first kill x the useful worker-steps
  done in that window (each step
  counts its world size; B subtracts the killed worker's local steps since its last averaging).
  The survivors use the absent node's core, so this counts only pauses and lost work.
- wasted worker-s, one core per worker (model): B: N - 1 survivors x the pauses in rank 0's steps
  (gaps > 5x A's median step, less one step; a gap with an epoch's evaluation in it counts only
  beyond A's median such gap) + the killed slot from the kill until it joins + its lost local
  steps x A's step time; C: N x the pauses + N x the recomputed steps x A's step.
  Both include the script's restart delay in the killed node's absence. "Less the delay"
  subtracts it once (the killed slot's own absence, which no recovery avoids): what is left is
  the waste of the recovery itself. With N nodes, counting the delay caps the ratio C/B near N
  (B wastes at least the delay, C at most N times it plus the restart).
- training efficiency: useful worker-steps (unique steps x their world size, less lost local
  steps) over the worker-steps an unfaulted run makes in the same time; shared cores: in the
  measured wall time at A's pace, or at the run's own pace before its first kill (the other
  jobs on the machine change the pace from run to run); one core per worker: in (step lines
  incl. repeats x A's median step + the pauses).
- checkpoints saved: rank 0's "checkpoint: step N -> DIR/step_N" lines (a save's write runs in
  the background; C counts the saves of every restart, and those on its agents' SIGTERM);
  training stalled: the time rank 0's training thread spent inside a save, as it reports."""

LINK_DOWN_DEFINITION = """\
- link down (namespace mode): the node's only link is set down for --restart-delay s instead of
  a kill; its processes live on. The same definitions, from the link going down: the survivors'
  step must come within the collective timeout + 2 s; "training again" is B's generation line
  that reports the node's return (its hsgd-run registers it again once its workers, cut off,
  stopped), C's first step after the restart. The isolated worker's lines until the link is
  back are not the survivors' progress; it trains on alone up to the averaging that cannot
  complete, so B counts a whole period's local steps (PERIOD - 1) as lost."""


def plot(runs, results, path, model="MLP", netns=False):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("plot skipped: matplotlib is missing (run with /usr/bin/python3; Debian's "
              "python3-matplotlib)", file=sys.stderr)
        return False
    colors = {"A": "tab:blue", "B": "tab:orange", "C": "tab:red"}
    labels = {"A": "A: elastic, no fault", "B": "B: elastic, kill -9 of a node",
              "C": "C: fixed size, full restart from checkpoints"}
    if netns:
        labels["B"] = "B: elastic, kill -9 of a node or its link down"
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(10, 8), sharex=True)
    for name, run in runs.items():
        if not run.steps:
            continue
        t0 = run.t_first
        xs = [s[0] - t0 for s in run.steps]
        ys = [s[2] for s in run.steps]
        w = 25
        smooth = [sum(ys[max(0, i - w + 1):i + 1]) / len(ys[max(0, i - w + 1):i + 1])
                  for i in range(len(ys))]
        # no line across a pause of more than a second: the run made no step there
        px, py = [], []
        for i, (x, y) in enumerate(zip(xs, smooth)):
            if i and x - xs[i - 1] > 1.0:
                px.append(float("nan"))
                py.append(float("nan"))
            px.append(x)
            py.append(y)
        ax1.plot(px, py, color=colors[name], label=labels[name], lw=1)
        ex = [e[0] - t0 for e in run.epochs]
        ey = [e[3] for e in run.epochs]
        ax2.plot(ex, ey, "o-", color=colors[name], label=labels[name], ms=3)
        # B and C fail at the same seconds: B's lines in the upper half of each panel, C's in
        # the lower half
        half = {"ymin": 0.5} if name == "B" else {"ymax": 0.5}
        kills = [k for k in run.kills if k.get("kind", "kill") == "kill"]
        for i, k in enumerate(kills):
            for ax in (ax1, ax2):
                ax.axvline(k["t"] - t0, color=colors[name], ls="--" if name == "B" else ":",
                           lw=1, **half,
                           label=f"{name}: kills" if (i == 0 and ax is ax1) else None)
        # a link-down: a thick dash-dot line where it went down, the outage shaded
        downs = [k for k in run.kills if k.get("kind") == "link down"]
        for i, k in enumerate(downs):
            up = k.get("t_up") or k["t"]
            for ax in (ax1, ax2):
                first = i == 0 and ax is ax1
                ax.axvline(k["t"] - t0, color=colors[name], ls="-.", lw=2.2, **half,
                           label=f"{name}: link down ({up - k['t']:.0f} s, shaded)"
                           if first else None)
                ax.axvspan(k["t"] - t0, up - t0, color=colors[name], alpha=0.15, lw=0, **half)
    ax1.set_ylabel("train loss (rank 0, mean of 25 steps)")
    ax1.set_yscale("log")
    ax1.legend(fontsize=8)
    ax1.grid(alpha=0.3)
    ax2.set_ylabel("test accuracy at epoch ends (%)")
    ax2.set_xlabel("seconds since the run's first step")
    lo = min((e[3] for r in runs.values() for e in r.epochs), default=0)
    ax2.set_ylim(max(lo - 1, 0), None)
    ax2.grid(alpha=0.3)
    ax2.legend(fontsize=8)
    where = "in network namespaces" if netns else "on loopback"
    fig.suptitle(f"Chaos experiment: {NODES} nodes x 1 worker {where}, {model} on Fashion-MNIST, "
                 f"local SGD period {PERIOD}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return True


def main():
    # the title and the three runs; the rest of the docstring is in the script
    p = argparse.ArgumentParser(description="\n\n".join(__doc__.split("\n\n")[:3]),
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--build", default="build", help="build directory (default build)")
    p.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist")
    p.add_argument("--model", choices=["mlp", "resnet20"], default="mlp",
                   help="mlp: apps/train_mlp (default); resnet20: apps/train_resnet --model "
                   "resnet20 on Fashion-MNIST, one thread per worker, --batch-size images per "
                   "step (results as chaos_experiment_resnet20.*)")
    p.add_argument("--batch-size", type=int, default=32, help="resnet20: images per step and "
                   "worker (default 32)")
    p.add_argument("--epochs", type=int, default=None, help="default: 40 (mlp), 8 (resnet20)")
    p.add_argument("--train-subset", type=int, default=None, help="0: all 60000 examples "
                   "(default: 0 for mlp, 12000 for resnet20)")
    p.add_argument("--nodes", type=int, default=4, help="nodes of one worker each (default 4; "
                   "other counts write chaos_experiment[_MODEL]_<N>nodes.*)")
    p.add_argument("--kills", type=int, default=3, help="failures of runs B and C (default 3)")
    p.add_argument("--kill-interval", type=float, nargs=2, default=[20.0, 40.0],
                   metavar=("MIN", "MAX"), help="seconds between kills (the first after the "
                   "first step), uniform")
    p.add_argument("--restart-delay", type=float, default=5.0, help="seconds from a kill to "
                   "the node's restart, and from a link-down to the link's return (default 5)")
    p.add_argument("--network", choices=["auto", "netns", "loopback"], default="auto",
                   help="netns: every node in its own network namespace behind a bridge, and "
                   "one failure is a link-down (needs root); loopback: all on 127.0.0.1, kills "
                   "only; auto (default): netns when root and `ip netns add` works, else "
                   "loopback")
    p.add_argument("--link-down-at", type=int, default=None, metavar="K", help="namespace "
                   "mode: the K-th failure of the schedule takes the node's link down instead "
                   "of a kill (default 2; --quick 1; 0: none)")
    p.add_argument("--max-restarts", type=int, default=5, help="hsgd-run --max-restarts "
                   "(default 5)")
    p.add_argument("--checkpoint-every", type=int, default=100, metavar="K", help="runs B "
                   "and C: steps between checkpoints (default 100)")
    p.add_argument("--no-elastic-checkpoints", action="store_true", help="run B writes no "
                   "checkpoints (C always does)")
    p.add_argument("--seed", type=int, default=1, help="kill schedule and training seed")
    p.add_argument("--runs", default="A,B,C", help="subset of A,B,C to run (A is needed)")
    p.add_argument("--run-timeout", type=float, default=600.0, help="seconds per run")
    p.add_argument("--stall-timeout", type=float, default=60.0, help="a run without a step "
                   "line for this long (from its start or its last step) is stopped, reported "
                   "and tried again")
    p.add_argument("--attempts", type=int, default=2, help="tries of a run that stalls")
    p.add_argument("--out", default=os.path.join(ROOT, "docs", "results"), help="where the "
                   "JSON and the plot go (default docs/results)")
    p.add_argument("--work", default=None, help="directory of the logs (default: a new one "
                   "under /tmp, kept)")
    p.add_argument("--quick", action="store_true", help="smoke run: 12000 examples, 16 epochs "
                   "(resnet20: 4000, 3), 1 kill after 4-6 s, restart delay 2 s (namespace mode: a "
                   "link-down after 4-6 s, a kill 4-6 s later, delay 4 s), checkpoints every 40 "
                   "steps; results under the work directory")
    args = p.parse_args()
    if not 2 <= args.nodes <= 16:
        p.error(f"--nodes {args.nodes} is not in [2, 16]")
    global NODES
    NODES = args.nodes
    resnet = args.model == "resnet20"
    if args.epochs is None:
        args.epochs = 8 if resnet else 40
    if args.train_subset is None:
        args.train_subset = 12000 if resnet else 0
    if args.quick:
        args.train_subset, args.epochs = (4000, 3) if resnet else (12000, 16)
        args.kills = 1
        args.kill_interval, args.restart_delay, args.checkpoint_every = [4.0, 6.0], 2.0, 40
        args.run_timeout, args.stall_timeout = 180.0, 40.0
    if args.link_down_at is None:
        args.link_down_at = 1 if args.quick else 2
    build = os.path.abspath(args.build)
    args.run_bin = os.path.join(build, "apps", "hsgd-run", "hsgd-run")
    args.rdzv_bin = os.path.join(build, "apps", "hsgd-rendezvous", "hsgd-rendezvous")
    program = "train_mlp" if args.model == "mlp" else "train_resnet"
    args.train_bin = os.path.join(build, "apps", program, program)
    args.model_flags = [] if args.model == "mlp" else [
        "--model", "resnet20", "--dataset", "fashion-mnist", "--batch-size",
        str(args.batch_size), "--lr", "0.05", "--threads", "1", "--max-eval", "2000"]
    for b in (args.run_bin, args.rdzv_bin, args.train_bin):
        if not os.access(b, os.X_OK):
            sys.exit(f"chaos_experiment: {b} is missing; build it or pass --build")
    work = args.work or tempfile.mkdtemp(prefix="hsgd-chaos.")
    os.makedirs(work, exist_ok=True)
    out = os.path.join(work, "results") if args.quick else args.out
    os.makedirs(out, exist_ok=True)
    print(f"chaos_experiment: logs in {work}", flush=True)
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    signal.signal(signal.SIGHUP, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    net, network = network_or_loopback(args.network)
    try:
        experiment(args, work, out, net, network)
    finally:
        # every run's processes are stopped by then (Run.stop_all in a finally)
        if net is not None:
            net.remove()
            print(f"chaos_experiment: removed the network namespaces of {net.switch[:-2]}",
                  flush=True)


def experiment(args, work, out, net, network):
    """Runs A, B and C as --runs says, writes the JSON and the plot, prints the table."""
    print(f"chaos_experiment: network: {network}", flush=True)
    if net is None:
        args.link_down_at = 0
    elif args.quick:
        # the link-down and a kill; an outage longer than the heartbeat timeout (3 s)
        args.kills, args.restart_delay = 2, 4.0

    plan = plan_kills(args)
    runs, results, incidents = {}, {}, []
    started = time.monotonic()
    for name in args.runs.split(","):
        elastic = name in ("A", "B")
        kills = [] if name == "A" else plan
        for attempt in range(args.attempts):
            run = Run(name, args, work, elastic, kills, attempt, net)
            runs[name] = run
            down = (f" (failure {args.link_down_at} a link-down)"
                    if kills and 0 < args.link_down_at <= len(kills) else "")
            size = f"elastic 2:{NODES}" if elastic else f"fixed size {NODES}"
            print(f"run {name}: {size}, kills {kills}{down}, logs in {run.dir}", flush=True)
            t = time.monotonic()
            try:
                run.execute()
                break
            except Stalled as e:
                # A hang is a result: it is reported and kept, and the run is tried again.
                print(f"run {name}: STALLED: {e}", flush=True)
                incidents.append({"run": name, "attempt": attempt, "error": str(e),
                                  "logs": run.dir, "generations_seen": len(run.agent_gens),
                                  "last_lines": tail_lines(run)})
            finally:
                run.stop_all()
        else:
            sys.exit(f"chaos_experiment: run {name} stalled {args.attempts} times; logs in "
                     f"{work}")
        print(f"run {name}: {time.monotonic() - t:.0f} s, exit codes {run.exit_codes}, final "
              f"accuracy {run.final_acc}", flush=True)
        results[name] = analyse(run, results.get("A"))
    total = time.monotonic() - started

    raw = {"date": time.strftime("%Y-%m-%d"), "command": " ".join(sys.argv), "work": work,
           "seconds": total, "settings": {k: v for k, v in vars(args).items()},
           "network": network,
           "mode": MODE + args.model_flags, "results": results, "incidents": incidents,
           "events": {n: {"kills": r.kills, "generations": r.gens, "agent_generations":
                          r.agent_gens, "epochs": r.epochs, "other": r.other[:200],
                          "checkpoints (time, step, stall ms, on preemption, node)":
                          r.checkpoints,
                          "t_first": r.t_first,
                          "step lines (every 20th, and 5 before and 10 after each kill): "
                          "seconds since the first step, step, loss, generation, world, node":
                          sampled_steps(r)}
                      for n, r in runs.items()}}
    stem = "chaos_experiment" if args.model == "mlp" else f"chaos_experiment_{args.model}"
    if NODES != 4:
        stem += f"_{NODES}nodes"
    with open(os.path.join(out, stem + ".json"), "w") as f:
        json.dump(raw, f, indent=1, default=str)
    for inc in incidents:
        print(f"\nINCIDENT: run {inc['run']} attempt {inc['attempt']}: {inc['error']}; "
              f"{inc['generations_seen']} hsgd-run generation lines; last warnings:")
        for line in inc["last_lines"][-8:]:
            print(f"  {line}")
    if all(n in results for n in "ABC"):
        print()
        print(table(results))
        print()
        print(DEFINITIONS)
        if any(k.get("kind") == "link down" for r in runs.values() for k in r.kills):
            print(LINK_DOWN_DEFINITION)
    drew = plot(runs, results, os.path.join(out, stem + ".png"),
                "MLP" if args.model == "mlp" else "ResNet-20", net is not None)
    print(f"\nwrote {out}/{stem}.json" + (" and .png" if drew else "") +
          f"; {total:.0f} s in all; logs in {work}")


if __name__ == "__main__":
    main()
