#!/usr/bin/env python3
"""Benchmark of run_job through the MCP interface (stdio) on the test cluster.

N sequential and M concurrent calls of `true` on the busybox image, then N
sequential `echo hello`. Reports:
- end-to-end latency p50/p95 (request sent -> response read);
- the result's own timings: time to answer (`answer_ms`) and, for `echo`,
  time to first output (`first_output_ms`), both from the server taking the
  call, the figures hosted sandboxes publish;
- the server's own overhead: end-to-end time minus the pod's lifecycle as
  the API recorded it (Job creationTimestamp -> main container finishedAt),
  which is what the cluster itself spent; timestamps have 1 s resolution, so
  per-run overhead is noisy and only the median is meaningful;
- server CPU time per job (utime+stime of the server process, /proc);
- peak RSS of the server (VmHWM).

A benchmark, not a test: it prints figures and asserts nothing.
Usage: bench/run_job.py [--sequential N] [--concurrent M] [--bin PATH]
Needs `tests/cluster/up` and `tests/build-project-image` first.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from datetime import datetime, timezone

CLUSTER = os.environ.get("MCP_K8S_TEST_CLUSTER_DIR", "/var/lib/mcp-k8s-test-cluster")
BUSYBOX = "mcp-k8s-test.local/busybox:1.35"
RUNNER = os.environ.get("MCP_K8S_PROJECT_IMAGE") or "mcp-k8s-test.local/mcp-k8s-ephemeral-job:dev"
CLK_TCK = os.sysconf("SC_CLK_TCK")


class Server:
    def __init__(self, binary, max_concurrent, extra=None, stderr=None):
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "MCP_K8S_KUBECONFIG": f"{CLUSTER}/server.kubeconfig",
            "MCP_K8S_ALLOWED_IMAGES": BUSYBOX,
            "MCP_K8S_RUNNER_IMAGE": RUNNER,
            "MCP_K8S_DEFAULT_CPU": "50m",
            "MCP_K8S_DEFAULT_MEMORY": "64Mi",
            "MCP_K8S_MAX_CONCURRENT": str(max_concurrent),
            "MCP_K8S_LOG_LEVEL": "warning",
        }
        env.update(extra or {})
        self.proc = subprocess.Popen([binary], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, text=True, bufsize=1, stderr=stderr)
        self.lock = threading.Lock()
        self.waiters = {}
        self.next_id = 1
        threading.Thread(target=self._read, daemon=True).start()
        self.request("initialize", {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "bench", "version": "1"}})
        self._send({"jsonrpc": "2.0", "method": "notifications/initialized"})

    def _send(self, message):
        with self.lock:
            self.proc.stdin.write(json.dumps(message) + "\n")
            self.proc.stdin.flush()

    def _read(self):
        for line in self.proc.stdout:
            message = json.loads(line)
            waiter = self.waiters.get(message.get("id"))
            if waiter is not None:
                waiter[1].append(message)
                waiter[0].set()

    def request(self, method, params):
        with self.lock:
            request_id = self.next_id
            self.next_id += 1
        event = threading.Event()
        self.waiters[request_id] = (event, [])
        self._send({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params})
        event.wait()
        return self.waiters.pop(request_id)[1][0]

    def cpu_seconds(self):
        with open(f"/proc/{self.proc.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLK_TCK

    def status_kib(self, field):
        """A kB figure of the server's /proc status: VmRSS, VmHWM."""
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
        return 0

    def peak_rss_kib(self):
        return self.status_kib("VmHWM")

    def close(self):
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


def parse_time(text):
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=timezone.utc).timestamp() if text else None


def one_run(server, command=("true",)):
    started = time.monotonic()
    response = server.request("tools/call", {"name": "run_job", "arguments": {"image": BUSYBOX, "command": list(command)}})
    elapsed = time.monotonic() - started
    result = response["result"]["structuredContent"]
    if result["status"] != "succeeded":
        raise SystemExit(f"run failed: {result['status']} {result.get('reason')}: {result.get('message')}")
    timings = result["timings"]
    created, finished = parse_time(timings.get("created_at")), parse_time(timings.get("finished_at"))
    cluster_time = finished - created if created and finished else None
    return elapsed, cluster_time, timings.get("answer_ms"), timings.get("first_output_ms")


def percentile(values, fraction):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(fraction * (len(ordered) - 1))))]


def report(name, samples, cpu, runs):
    latencies = [s[0] for s in samples]
    overheads = [s[0] - s[1] for s in samples if s[1] is not None]
    print(f"{name}: {runs} runs")
    print(f"  end-to-end p50 {percentile(latencies, 0.5):.2f} s, p95 {percentile(latencies, 0.95):.2f} s, max {max(latencies):.2f} s")
    if overheads:
        print(f"  server overhead (end-to-end minus Job created->container finished, 1 s timestamps): median {statistics.median(overheads):.2f} s")
    for label, index in (("time to answer (timings.answer_ms)", 2), ("time to first output (timings.first_output_ms)", 3)):
        values = [s[index] for s in samples if s[index] is not None]
        if values:
            print(f"  {label}: p50 {percentile(values, 0.5)} ms, p95 {percentile(values, 0.95)} ms")
    print(f"  server CPU per job: {cpu / runs * 1000:.1f} ms")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sequential", type=int, default=10)
    parser.add_argument("--concurrent", type=int, default=5)
    parser.add_argument("--bin", default=os.path.join(os.path.dirname(__file__), "..", "target", "release", "mcp-k8s-ephemeral-job"))
    args = parser.parse_args()
    if not os.path.exists(f"{CLUSTER}/server.kubeconfig"):
        sys.exit("no test cluster: run tests/cluster/up and tests/build-project-image first")

    server = Server(args.bin, max(args.concurrent, 1))
    one_run(server)  # warm-up: image already loaded, agent connected
    cpu_before = server.cpu_seconds()
    samples = [one_run(server) for _ in range(args.sequential)]
    report("sequential", samples, server.cpu_seconds() - cpu_before, args.sequential)

    cpu_before = server.cpu_seconds()
    samples = []
    lock = threading.Lock()

    def worker():
        sample = one_run(server)
        with lock:
            samples.append(sample)

    wall = time.monotonic()
    threads = [threading.Thread(target=worker) for _ in range(args.concurrent)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall = time.monotonic() - wall
    report(f"concurrent x{args.concurrent}", samples, server.cpu_seconds() - cpu_before, args.concurrent)
    print(f"  wall time for the batch: {wall:.2f} s")

    cpu_before = server.cpu_seconds()
    samples = [one_run(server, ("echo", "hello")) for _ in range(args.sequential)]
    report("sequential echo hello", samples, server.cpu_seconds() - cpu_before, args.sequential)
    print(f"peak RSS of the server: {server.peak_rss_kib() / 1024:.1f} MiB")
    server.close()


if __name__ == "__main__":
    main()
