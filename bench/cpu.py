"""CPU time for the server benchmarks, read from /proc: the server under test (its process and every
descendant), the load generator (this process), everything else on the machine, and a check that the
machine is quiet before a level starts.

Linux only and dependency-free: these are the files psutil reads there. The benchmarks run the
server and the load generator on the same 2 cores, so a third party's CPU use moves every figure;
each level records how much there was instead of trusting that there was none.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def _stat(pid: int) -> list[str] | None:
    """Fields of /proc/PID/stat after the command name (field 3 onwards), or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except OSError:
        return None
    return text[text.rindex(")") + 2 :].split()


def _comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return "?"


def _all_pids() -> list[int]:
    return [int(d) for d in os.listdir("/proc") if d.isdigit()]


def _cpu_seconds(fields: list[str], with_reaped_children: bool) -> float:
    # utime, stime are fields 14, 15 of stat; cutime, cstime (waited-for children) 16, 17.
    ticks = int(fields[11]) + int(fields[12])
    if with_reaped_children:
        ticks += int(fields[13]) + int(fields[14])
    return ticks / CLOCK_TICKS


def process_tree(pid: int) -> list[int]:
    """pid and all its live descendants."""
    children: dict[int, list[int]] = {}
    for p in _all_pids():
        fields = _stat(p)
        if fields is not None:
            children.setdefault(int(fields[1]), []).append(p)
    tree, todo = [], [pid]
    while todo:
        p = todo.pop()
        tree.append(p)
        todo.extend(children.get(p, []))
    return tree


def tree_cpu_seconds(pid: int) -> float:
    """CPU seconds used so far by pid and its descendants, the exited ones it waited for included
    (a worker process that ends during a level still counts)."""
    total = 0.0
    for p in process_tree(pid):
        fields = _stat(p)
        if fields is not None:
            total += _cpu_seconds(fields, with_reaped_children=True)
    return total


def thread_cpu_seconds(pid: int) -> dict[int, float]:
    """CPU seconds used so far by each live thread of pid, by thread id."""
    out = {}
    try:
        tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                text = f.read()
        except OSError:
            continue
        out[tid] = _cpu_seconds(text[text.rindex(")") + 2 :].split(), with_reaped_children=False)
    return out


def machine_cpu_seconds() -> float:
    """Busy CPU seconds of the whole machine since boot, all cores (idle and iowait excluded)."""
    with open("/proc/stat") as f:
        values = [int(v) for v in f.readline().split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (values + [0] * 8)[:8]
    return (user + nice + system + irq + softirq + steal) / CLOCK_TICKS


def loadavg_1m() -> float:
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])


@dataclass
class CpuMeter:
    """CPU used during a window, in cores (1.0 = one core busy for the whole window): the server's
    process tree, this process (the load generator), and everything else on the machine."""

    server_pid: int
    _start: tuple[float, float, float, float] | None = field(default=None, repr=False)

    def _sample(self) -> tuple[float, float, float, float]:
        return time.perf_counter(), tree_cpu_seconds(self.server_pid), time.process_time(), machine_cpu_seconds()

    def start(self) -> None:
        self._start = self._sample()

    def stop(self) -> dict[str, float]:
        t1, server1, client1, machine1 = self._sample()
        t0, server0, client0, machine0 = self._start
        wall = t1 - t0
        server, client, machine = (server1 - server0) / wall, (client1 - client0) / wall, (machine1 - machine0) / wall
        return {
            "server_cpu_cores": server,
            "client_cpu_cores": client,
            "other_cpu_cores": max(0.0, machine - server - client),
            "window_s": wall,
        }


def other_cpu(exclude_pids: set[int], seconds: float = 1.0, top: int = 3) -> dict:
    """CPU used over `seconds` by every process outside `exclude_pids` (in cores), with the busiest few.

    Counts each process's own time only: a process that starts and ends inside the window is missed,
    so the machine-wide figure (busy minus the excluded processes) is reported too, and is the one to trust."""

    def snapshot() -> dict[int, float]:
        out = {}
        for p in _all_pids():
            fields = _stat(p)
            if fields is not None:
                out[p] = _cpu_seconds(fields, with_reaped_children=False)
        return out

    excluded = set()
    for pid in exclude_pids:
        excluded.update(process_tree(pid))
    t0, m0, before = time.perf_counter(), machine_cpu_seconds(), snapshot()
    time.sleep(seconds)
    t1, m1, after = time.perf_counter(), machine_cpu_seconds(), snapshot()
    wall = t1 - t0
    used = {p: (after[p] - before[p]) / wall for p in after if p in before}
    ours = sum(v for p, v in used.items() if p in excluded)
    busiest = sorted(((v, p) for p, v in used.items() if p not in excluded and v > 0.01), reverse=True)[:top]
    return {
        "other_cpu_cores": max(0.0, (m1 - m0) / wall - ours),
        "ours_cpu_cores": ours,
        "loadavg_1m": loadavg_1m(),
        "busiest": [{"pid": p, "name": _comm(p), "cpu_cores": round(v, 3)} for v, p in busiest],
    }


def wait_until_quiet(
    exclude_pids: set[int], max_other_cores: float, policy: str, max_wait_s: float, sample_s: float = 1.0, log=print
) -> dict:
    """Check the machine before a measurement: how much CPU processes other than ours use.

    policy: "warn" measures anyway and says so; "wait" re-checks until the machine is quiet or
    max_wait_s has passed (then measures anyway, flagged busy); "refuse" raises RuntimeError at once.
    The returned record (with busy: true/false and waited_s) goes into the results."""
    t0 = time.perf_counter()
    while True:
        check = other_cpu(exclude_pids, sample_s)
        check["busy"] = check["other_cpu_cores"] > max_other_cores
        check["waited_s"] = round(max(0.0, time.perf_counter() - t0 - sample_s), 1)  # beyond the one check
        if not check["busy"]:
            return check
        who = (
            ", ".join(f"{b['name']} ({b['pid']}) {b['cpu_cores']:.2f}" for b in check["busiest"])
            or "short-lived processes"
        )
        message = (
            f"machine busy: {check['other_cpu_cores']:.2f} cores used by other processes "
            f"(limit {max_other_cores:.2f}; load average {check['loadavg_1m']:.2f}): {who}"
        )
        if policy == "refuse":
            raise RuntimeError(message + " (--busy refuse)")
        if policy == "warn" or time.perf_counter() - t0 >= max_wait_s:
            log(f"WARNING {message}; measuring anyway, the level is flagged busy")
            return check
        log(f"{message}; waiting")
        time.sleep(2.0)
