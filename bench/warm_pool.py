#!/usr/bin/env python3
"""Cold against warm run_job on the test cluster, in one run.

Two servers over stdio, the same build and settings, calls interleaved:
one without pools (every run cold) and one with a busybox and a python pool
(`MCP_K8S_WARM_POOLS`). For `true` on busybox and `python3 -c pass` on
python, N calls each way. Before each warm call the script waits until the
pool has a ready pod (`describe_environment`), so every warm figure is a
hit; the hit count is checked afterwards and misses are reported.

Reports per series: end-to-end p50/p95 (request sent -> response read) and
the server's CPU per run (utime+stime from /proc, the warm server's
including its pools' upkeep while the series ran). Then runs
`bench/breakdown.py` for the cold breakdown, unless --no-breakdown.

With --docker the same on the Docker backend against the test dockerd
(`tests/docker/up`, or the daemon DOCKER_HOST names), network `none` both
ways, the binary as its own runner; no breakdown.

A benchmark, not a test: it prints figures and asserts nothing.
Usage: bench/warm_pool.py [--runs N] [--bin PATH] [--no-breakdown] [--docker]
Needs `tests/cluster/up` (or `tests/docker/up`) and `tests/build-project-image` first.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import run_job  # noqa: E402  (the shared MCP-over-stdio client)

CLUSTER = os.environ.get("MCP_K8S_TEST_CLUSTER_DIR", "/var/lib/mcp-k8s-test-cluster")
BUSYBOX = "mcp-k8s-test.local/busybox:1.35"
PYTHON = "mcp-k8s-test.local/python:3.11"
HERE = os.path.dirname(os.path.abspath(__file__))
CASES = [
    ("true", "busybox", BUSYBOX, ["true"]),
    ("python3 -c pass", "python", PYTHON, ["python3", "-c", "pass"]),
]


DOCKER_HOST = os.environ.get("DOCKER_HOST") or "unix:///var/lib/mcp-k8s-test-docker/docker.sock"


class Server(run_job.Server):
    """bench/run_job.py's server, with both images allowed and the fence wait
    (on Kubernetes), or on the Docker backend."""

    def __init__(self, binary, extra, docker=False):
        settings = {"MCP_K8S_ALLOWED_IMAGES": f"{BUSYBOX},{PYTHON}"}
        if docker:
            settings.update({"MCP_K8S_BACKEND": "docker", "MCP_K8S_DOCKER_HOST": DOCKER_HOST, "MCP_K8S_RUNNER_BINARY": os.path.abspath(binary)})
        else:
            settings["MCP_K8S_AWAIT_NETWORK_POLICY"] = "1"
        settings.update(extra)
        super().__init__(binary, 4, settings)

    def tool(self, name, arguments):
        return self.request("tools/call", {"name": name, "arguments": arguments})["result"]["structuredContent"]

    def pools(self):
        return {pool["name"]: pool for pool in self.tool("describe_environment", {})["warm_pools"]}

    def close(self):
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


percentile = run_job.percentile


def timed_run(server, image, command):
    started = time.monotonic()
    result = server.tool("run_job", {"image": image, "command": command})
    elapsed = time.monotonic() - started
    if result["status"] != "succeeded":
        raise SystemExit(f"run failed: {result['status']} {result.get('reason')}: {result.get('message')}")
    return elapsed


def await_ready(server, pool, deadline_s=120):
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        if server.pools()[pool]["ready"] >= 1:
            return
        time.sleep(0.1)
    raise SystemExit(f"pool {pool} had no ready pod within {deadline_s} s")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--bin", default=os.path.join(HERE, "..", "target", "x86_64-unknown-linux-musl", "release", "mcp-k8s-ephemeral-job"))
    parser.add_argument("--no-breakdown", action="store_true")
    parser.add_argument("--docker", action="store_true", help="on the Docker backend (network none), no breakdown")
    args = parser.parse_args()
    network = "none" if args.docker else "open"
    pools = [
        {"name": "busybox", "image": BUSYBOX, "network": network, "size": 2},
        {"name": "python", "image": PYTHON, "network": network, "size": 2},
    ]
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as file:
        json.dump(pools, file)
        pools_file = file.name
    cold = Server(args.bin, {"MCP_K8S_NETWORK_DEFAULT": network}, args.docker)
    warm = Server(args.bin, {"MCP_K8S_NETWORK_DEFAULT": network, "MCP_K8S_WARM_POOLS": pools_file}, args.docker)
    try:
        for name, pool, image, command in CASES:
            samples = {"cold": [], "warm": []}
            cpu = {"cold": 0.0, "warm": 0.0}
            hits_before = warm.pools()[pool]["hits"]
            for _ in range(args.runs):
                for kind, server in (("cold", cold), ("warm", warm)):
                    if kind == "warm":
                        await_ready(warm, pool)
                    before = server.cpu_seconds()
                    samples[kind].append(timed_run(server, image, command))
                    cpu[kind] += server.cpu_seconds() - before
            hits = warm.pools()[pool]["hits"] - hits_before
            for kind in ("cold", "warm"):
                latencies = samples[kind]
                print(
                    f"{kind:4} {name:16}: {len(latencies)} runs, p50 {percentile(latencies, 0.5) * 1000:.0f} ms, "
                    f"p95 {percentile(latencies, 0.95) * 1000:.0f} ms, max {max(latencies) * 1000:.0f} ms, "
                    f"server CPU {cpu[kind] / len(latencies) * 1000:.1f} ms/run"
                )
            print(f"     {name:16}: warm hits {hits} of {args.runs} (misses ran cold and are in the warm figures)")
    finally:
        cold.close()
        warm.close()
        os.unlink(pools_file)
    if not args.no_breakdown and not args.docker:
        sys.stdout.flush()
        subprocess.run([sys.executable, os.path.join(HERE, "breakdown.py"), "--runs", "10", "--bin", args.bin, "--case", "true"], check=False)


if __name__ == "__main__":
    main()
