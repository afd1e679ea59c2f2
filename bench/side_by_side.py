#!/usr/bin/env python3
"""This server and the original Go server (v0.7.1), side by side on the test cluster.

Both servers run over stdio with the same settings where they share them
(50m CPU and 64Mi per job, the busybox image, `MCP_K8S_MAX_CONCURRENT`),
and get the same `run_job` calls, interleaved: in each round every case is
sent to one server and then the other, the first one alternating between
rounds, so a slow moment of the node falls on both. Cases: `true`,
`echo hello`, 1 MiB of stdout, one artifact (a file the command writes in
its workdir), and 5 concurrent `true`. Reports per case p50 and p95 of
the end-to-end time and the ratio this/original, the server CPU per `true`
(the server's own utime+stime over each call), and idle and peak RSS.

The original runs in its own namespace, `mcp-original`, with Pod Security
`baseline` (its pods do not set runAsNonRoot) and the RBAC it uses
(bench/original/namespace.yaml; pods/exec for its artifact sidecar),
under a ServiceAccount token. This server runs in `mcp-ephemeral` as the
tests run it, with its defaults (network `open`, no warm pool: the cold
path).

With --throughput SECONDS, then runs per minute at the namespace quota:
each namespace gets a ResourceQuota of `--concurrent` pods (the servers'
`MCP_K8S_MAX_CONCURRENT` is the same number), and each server in turn is
kept busy for SECONDS by twice that many callers sending `true` back to
back; it reports the runs that succeeded per minute and any that did not.

A benchmark, not a test: it prints figures and asserts nothing beyond
every answer being right.
Usage: bench/side_by_side.py --original BIN [--rounds N] [--bin PATH] [--throughput SECONDS]
  BIN: bench/original/build SOURCE_DIR builds it (the source: tag v0.7.1
  of github.com/inhuman/mcp-k8s-ephemeral-job).
Needs `tests/cluster/up` and `tests/build-project-image` first.
"""
import argparse
import base64
import json
import os
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from run_job import BUSYBOX, CLUSTER, Server, percentile  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
NAMESPACE = "mcp-original"
ONE_MIB = 1024 * 1024

CASES = {
    "true": {"command": ["true"], "check": lambda r: r["exit_code"] == 0},
    "echo hello": {"command": ["echo", "hello"], "check": lambda r: "hello" in r["stdout"]},
    "1 MiB of stdout": {
        # 1 MiB exactly: both servers' default output cap, so neither truncates.
        "command": ["sh", "-c", f"head -c {ONE_MIB} /dev/zero | tr '\\0' a"],
        "check": lambda r: r["stdout"].count("a") == ONE_MIB,
    },
    "one artifact": {
        "command": ["sh", "-c", "echo result > out.txt"],
        "check": lambda r: any(
            (a.get("name") or a.get("path") or "").endswith("out.txt") and base64.b64decode(a.get("content_b64") or "") == b"result\n" for a in r["artifacts"]
        ),
    },
}


def kubectl(*args, stdin=None):
    """The test cluster's kubectl, as admin (tests/cluster/lib.sh)."""
    script = f'. "{REPO}/tests/cluster/lib.sh" && kubectl_admin "$@"'
    done = subprocess.run(["bash", "-c", script, "kubectl", *args], input=stdin, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"kubectl {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout


def original_kubeconfig(path):
    """A kubeconfig for the original's ServiceAccount, with a 2-hour token."""
    with open(os.path.join(HERE, "original", "namespace.yaml")) as f:
        kubectl("apply", "-f", "-", stdin=f.read())
    token = kubectl("-n", NAMESPACE, "create", "token", "mcp-original-server", "--duration=2h").strip()
    server = kubectl("config", "view", "--raw", "--minify", "-o", "jsonpath={.clusters[0].cluster.server}")
    ca = kubectl("config", "view", "--raw", "--minify", "-o", "jsonpath={.clusters[0].cluster.certificate-authority-data}")
    if not ca:
        ca_file = kubectl("config", "view", "--raw", "--minify", "-o", "jsonpath={.clusters[0].cluster.certificate-authority}")
        with open(ca_file, "rb") as f:
            ca = base64.b64encode(f.read()).decode()
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "test", "cluster": {"server": server, "certificate-authority-data": ca}}],
        "users": [{"name": "original", "user": {"token": token}}],
        "contexts": [{"name": "original", "context": {"cluster": "test", "user": "original", "namespace": NAMESPACE}}],
        "current-context": "original",
    }
    with open(path, "w") as f:
        json.dump(config, f)
    os.chmod(path, 0o600)


def call(server, case):
    """One run_job call: end-to-end seconds and server CPU seconds; exits on a wrong answer."""
    cpu_before = server.cpu_seconds()
    started = time.monotonic()
    response = server.request("tools/call", {"name": "run_job", "arguments": {"image": BUSYBOX, "command": CASES[case]["command"]}})
    elapsed = time.monotonic() - started
    cpu = server.cpu_seconds() - cpu_before
    result = response.get("result", {}).get("structuredContent") or {}
    if result.get("status") != "succeeded" or not CASES[case]["check"](result):
        summary = {key: result.get(key) for key in ("status", "reason", "message", "exit_code")}
        sys.exit(f"{server.label}: {case}: wrong answer: {summary or response}")
    return elapsed, cpu


def concurrent(server, n_calls):
    """n_calls `true` at once: each call's end-to-end seconds."""
    samples, lock = [], threading.Lock()

    def one():
        elapsed, _ = call(server, "true")
        with lock:
            samples.append(elapsed)

    threads = [threading.Thread(target=one) for _ in range(n_calls)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return samples


QUOTA = "mcp-bench-quota"


def quota(namespace, pods):
    """A ResourceQuota of `pods` pods in `namespace` (None: removed)."""
    if pods is None:
        kubectl("-n", namespace, "delete", "resourcequota", QUOTA, "--ignore-not-found")
        return
    body = {"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": QUOTA, "namespace": namespace}, "spec": {"hard": {"pods": str(pods)}}}
    kubectl("apply", "-f", "-", stdin=json.dumps(body))


def throughput(server, callers, seconds):
    """`callers` threads sending `true` back to back for `seconds`: the runs
    that succeeded, and the others' (status, reason) counts."""
    done, others, lock = [0], {}, threading.Lock()
    stop_at = time.monotonic() + seconds

    def caller():
        while time.monotonic() < stop_at:
            response = server.request("tools/call", {"name": "run_job", "arguments": {"image": BUSYBOX, "command": ["true"]}})
            result = response.get("result", {}).get("structuredContent") or {}
            with lock:
                if result.get("status") == "succeeded":
                    done[0] += 1
                else:
                    key = (result.get("status"), result.get("reason") or str(response.get("error", ""))[:80])
                    others[key] = others.get(key, 0) + 1

    started = time.monotonic()
    threads = [threading.Thread(target=caller) for _ in range(callers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return done[0], others, time.monotonic() - started


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--original", required=True, help="the original's binary (bench/original/build)")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--concurrent", type=int, default=5)
    parser.add_argument("--bin", default=os.path.join(REPO, "target", "release", "mcp-k8s-ephemeral-job"))
    parser.add_argument("--throughput", type=int, default=0, help="seconds per server of runs per minute at the quota (0: skip)")
    args = parser.parse_args()
    if not os.path.exists(f"{CLUSTER}/server.kubeconfig"):
        sys.exit("no test cluster: run tests/cluster/up and tests/build-project-image first")

    kubeconfig = os.path.join(REPO, "target", "original", "kubeconfig")
    os.makedirs(os.path.dirname(kubeconfig), exist_ok=True)
    original_kubeconfig(kubeconfig)
    shared = {"MCP_K8S_MAX_CONCURRENT": str(max(args.concurrent, 1))}
    # The original logs every call at info on stderr; both logs are dropped.
    this = Server(args.bin, args.concurrent, shared, stderr=subprocess.DEVNULL)
    this.label = "this"
    original = Server(
        args.original,
        args.concurrent,
        dict(shared, MCP_K8S_KUBECONFIG=kubeconfig, MCP_K8S_NAMESPACE=NAMESPACE, MCP_K8S_SIDECAR_IMAGE=BUSYBOX),
        stderr=subprocess.DEVNULL,
    )
    original.label = "original"
    servers = (this, original)
    idle = {server.label: server.status_kib("VmRSS") for server in servers}
    for server in servers:  # warm-up: the image is on the node, the connections are open
        call(server, "true")

    times = {(server.label, case): [] for server in servers for case in list(CASES) + [f"{args.concurrent} concurrent"]}
    cpu_per_true = {server.label: [] for server in servers}
    for round_idx in range(args.rounds):
        order = servers if round_idx % 2 == 0 else servers[::-1]
        for case in CASES:
            for server in order:
                elapsed, cpu = call(server, case)
                times[(server.label, case)].append(elapsed)
                if case == "true":
                    cpu_per_true[server.label].append(cpu)
        for server in order:
            times[(server.label, f"{args.concurrent} concurrent")].extend(concurrent(server, args.concurrent))

    n_answers = sum(len(samples) for samples in times.values())
    print(f"side by side: {args.rounds} rounds, calls interleaved, {n_answers}/{n_answers} answers right")
    print(f"{'case':<18} {'original p50':>12} {'this p50':>9} {'ratio':>6}   {'original p95':>12} {'this p95':>9}")
    for case in list(CASES) + [f"{args.concurrent} concurrent"]:
        mine, theirs = times[("this", case)], times[("original", case)]
        p50, p50_original = percentile(mine, 0.5), percentile(theirs, 0.5)
        print(
            f"{case:<18} {p50_original:>11.2f}s {p50:>8.2f}s {p50 / p50_original:>5.2f}x   "
            f"{percentile(theirs, 0.95):>11.2f}s {percentile(mine, 0.95):>8.2f}s"
        )
    cpu_mine, cpu_theirs = (sum(cpu_per_true[label]) / len(cpu_per_true[label]) * 1000 for label in ("this", "original"))
    print(f"{'server CPU per true':<18} {cpu_theirs:>10.0f}ms {cpu_mine:>7.0f}ms {cpu_mine / cpu_theirs:>5.2f}x")
    peak = {server.label: server.status_kib("VmHWM") for server in servers}
    print(
        f"{'RSS idle':<18} {idle['original'] / 1024:>9.1f}MiB {idle['this'] / 1024:>6.1f}MiB {idle['this'] / idle['original']:>5.2f}x"
    )
    print(
        f"{'RSS peak':<18} {peak['original'] / 1024:>9.1f}MiB {peak['this'] / 1024:>6.1f}MiB {peak['this'] / peak['original']:>5.2f}x"
    )
    if args.throughput > 0:
        namespaces = {"this": "mcp-ephemeral", "original": NAMESPACE}
        print(f"runs per minute at a quota of {args.concurrent} pods, {2 * args.concurrent} callers, {args.throughput} s each")
        for server in servers:
            namespace = namespaces[server.label]
            quota(namespace, args.concurrent)
            try:
                succeeded, others, elapsed = throughput(server, 2 * args.concurrent, args.throughput)
            finally:
                quota(namespace, None)
            print(f"  {server.label:<9} {succeeded / elapsed * 60:>6.1f} runs/min ({succeeded} in {elapsed:.0f} s); not succeeded: {others or 'none'}")
    for server in servers:
        server.close()


if __name__ == "__main__":
    main()
