#!/usr/bin/env python3
"""Where a cold run_job's time goes, on the test cluster.

Sequential run_job calls through MCP (stdio), each timed on this machine's
clock, which the server, the kubelet and the runner share (one node):
- request sent and response read: this script;
- Job and pod objects as an admin watch of the namespace sees them, each
  event stamped when it arrives (ms; the API's own timestamps have 1 s
  resolution): Job added, pod added, pod scheduled (nodeName), each init
  container's running/terminated, the main container's running/terminated;
- the command's start and end: the runner's clock (the result's
  `started_at`/`finished_at`, ms).

Prints, per case, the p50 of each step's time since the request was sent
and of the gap from the previous step, in time order. A container's
"running" is when the API first showed it: the kubelet reports container
states at its next status pass (PLEG relist, every second), so that step
often comes after the runner's own clock saw the command end. A benchmark, not a test: it asserts
nothing. Cases: `true`, `echo hello`, 1 MiB of stdout.

Usage: bench/breakdown.py [--runs N] [--bin PATH] [--case NAME ...]
Runner image: $MCP_K8S_PROJECT_IMAGE (default the `:dev` one).
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

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import run_job  # noqa: E402  (the MCP stdio client)

CASES = {
    "true": ["true"],
    "echo hello": ["echo", "hello"],
    "1 MiB stdout": ["head", "-c", "1048576", "/dev/zero"],
}
LABEL_RUN_ID = "mcp-k8s-ephemeral-job/run-id"


class Watch:
    """An admin watch of one resource in the jobs namespace; remembers, per
    run id, when each fact was first seen (this machine's clock)."""

    def __init__(self, path, facts_of):
        kubectl = os.environ.get("KUBECTL", "/var/cache/mcp-k8s-test-cluster/bin/kubectl")
        self.facts_of = facts_of
        self.seen = {}
        self.lock = threading.Lock()
        self.proc = subprocess.Popen(
            [kubectl, "--kubeconfig", f"{run_job.CLUSTER}/admin.kubeconfig", "get", "--raw", path],
            stdout=subprocess.PIPE,
            text=True,
            bufsize=1,
        )
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            now = time.time()
            try:
                event = json.loads(line)
            except ValueError:
                continue
            obj = event.get("object", {})
            run_id = obj.get("metadata", {}).get("labels", {}).get(LABEL_RUN_ID)
            if not run_id:
                continue
            with self.lock:
                facts = self.seen.setdefault(run_id, {})
                for fact in self.facts_of(event["type"], obj):
                    facts.setdefault(fact, now)

    def facts(self, run_id):
        with self.lock:
            return dict(self.seen.get(run_id, {}))

    def close(self):
        self.proc.terminate()


def job_facts(kind, job):
    if kind == "ADDED":
        yield "job added"


def pod_facts(kind, pod):
    if kind == "ADDED":
        yield "pod added"
    if pod.get("spec", {}).get("nodeName"):
        yield "scheduled"
    status = pod.get("status", {})
    for key, prefix in (("initContainerStatuses", "init "), ("containerStatuses", "")):
        for container in status.get(key, []):
            state = container.get("state", {})
            if "running" in state or "terminated" in state:
                yield f"{prefix}{container['name']} running"
            if "terminated" in state:
                yield f"{prefix}{container['name']} done"
    if kind == "DELETED":
        yield "pod deleted"


def parse_time(text):
    if not text:
        return None
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=timezone.utc).timestamp()


def one_run(server, command):
    sent = time.time()
    response = server.request("tools/call", {"name": "run_job", "arguments": {"image": run_job.BUSYBOX, "command": command}})
    answered = time.time()
    result = response["result"]["structuredContent"]
    if result["status"] != "succeeded":
        raise SystemExit(f"run failed: {result['status']} {result.get('reason')}: {result.get('message')}")
    timings = result["timings"]
    steps = {"command start": parse_time(timings.get("started_at")), "command end": parse_time(timings.get("finished_at"))}
    return result["run_id"], sent, answered, steps


ORDER = [
    "job added",
    "pod added",
    "scheduled",
    "init prepare running",
    "init prepare done",
    "prepare running",
    "prepare done",
    "main running",
    "command start",
    "command end",
    "response",
    "main done",
    "pod deleted",
]


def run_case(server, pods, jobs, name, command, runs):
    samples = []
    cpu_before = server.cpu_seconds()
    for _ in range(runs):
        run_id, sent, answered, steps = one_run(server, command)
        samples.append((run_id, sent, answered, steps))
    cpu_ms = (server.cpu_seconds() - cpu_before) / runs * 1000
    time.sleep(3)  # let the watches see the ends and deletions
    rows = {}
    for run_id, sent, answered, steps in samples:
        facts = {**jobs.facts(run_id), **pods.facts(run_id), **{k: v for k, v in steps.items() if v}, "response": answered}
        for step, at in facts.items():
            rows.setdefault(step, []).append((at - sent) * 1000)
    print(f"\n{name}: {runs} runs, server CPU {cpu_ms:.0f} ms per run; ms since the request was sent (p50; gap = from the previous step's p50)")
    print(f"  {'step':<24}{'p50':>8}{'gap':>8}{'min':>8}{'max':>8}")
    previous = 0.0
    # In time order: the API shows a container's start only at the
    # kubelet's next status pass, often after the runner's own clock saw
    # the command end.
    names = sorted(rows, key=lambda step: (statistics.median(rows[step]), ORDER.index(step) if step in ORDER else len(ORDER)))
    for step in names:
        values = rows[step]
        p50 = statistics.median(values)
        print(f"  {step:<24}{p50:>8.0f}{p50 - previous:>8.0f}{min(values):>8.0f}{max(values):>8.0f}")
        previous = p50
    return statistics.median(rows["response"])


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--bin", default=os.path.join(os.path.dirname(__file__), "..", "target", "release", "mcp-k8s-ephemeral-job"))
    parser.add_argument("--case", action="append", choices=sorted(CASES), help="default: all")
    args = parser.parse_args()
    if not os.path.exists(f"{run_job.CLUSTER}/server.kubeconfig"):
        sys.exit("no test cluster: run tests/cluster/up and tests/build-project-image first")
    namespace = "mcp-ephemeral"
    selector = "labelSelector=app.kubernetes.io%2Fmanaged-by%3Dmcp-k8s-ephemeral-job"
    pods = Watch(f"/api/v1/namespaces/{namespace}/pods?watch=1&{selector}", pod_facts)
    jobs = Watch(f"/apis/batch/v1/namespaces/{namespace}/jobs?watch=1&{selector}", job_facts)
    server = run_job.Server(args.bin, 1)
    print(f"runner image {run_job.RUNNER}")
    one_run(server, ["true"])  # warm-up: connection, image in the page cache
    summary = {}
    for name in args.case or list(CASES):
        summary[name] = run_case(server, pods, jobs, name, CASES[name], args.runs)
    print("\nend-to-end p50: " + ", ".join(f"{name} {ms / 1000:.2f} s" for name, ms in summary.items()))
    server.close()
    pods.close()
    jobs.close()


if __name__ == "__main__":
    main()
