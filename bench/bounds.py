#!/usr/bin/env python3
"""Two bounds figures, through MCP over stdio on the test cluster:

- `rss`: the server's peak RSS (VmHWM) before and after one run_job whose
  command writes a 9 MiB artifact of random bytes (returned as base64);
- `cancel`: ten background jobs, then ten cancel_job calls at once: how long
  each took to answer, and how long until fetch_job had every result.

A benchmark, not a test: it prints figures and asserts little.
Usage: bench/bounds.py rss|cancel [--bin PATH] [--runner IMAGE]
Needs `tests/cluster/up` and `tests/build-project-image` first; measure the
release build (`target/x86_64-unknown-linux-musl/release/...`) for figures
comparable with docs/benchmarks.md.
"""
import argparse
import os
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import run_job  # noqa: E402  (the stdio client of the other benchmark)

PYTHON = "mcp-k8s-test.local/python:3.11"


def call(server, name, arguments):
    return server.request("tools/call", {"name": name, "arguments": arguments})["result"]


def peak_rss(server):
    before = server.peak_rss_kib()
    code = "import os; open('big.bin', 'wb').write(os.urandom(9 * 1024 * 1024))"
    result = call(server, "run_job", {"image": PYTHON, "command": ["python3", "-c", code]})["structuredContent"]
    artifacts = [(a["path"], a["size"], a["content_b64"] is not None) for a in result["artifacts"]]
    print(f"run: {result['status']}, artifacts {artifacts}")
    print(f"peak RSS: {before} KiB before the call, {server.peak_rss_kib()} KiB after")


def cancel_latency(server):
    tokens = []
    for _ in range(10):
        submitted = call(server, "submit_job", {"image": run_job.BUSYBOX, "command": ["sh", "-c", "echo up; sleep 300"]})
        tokens.append(submitted["structuredContent"]["job_token"])
    for token in tokens:
        while "up" not in (call(server, "fetch_job", {"job_token": token, "wait_s": 2})["structuredContent"].get("stdout") or ""):
            pass
    latencies = []

    def cancel(token):
        started = time.monotonic()
        call(server, "cancel_job", {"job_token": token})
        latencies.append(time.monotonic() - started)

    threads = [threading.Thread(target=cancel, args=(token,)) for token in tokens]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    print("cancel_job answered after (s):", sorted(round(latency, 2) for latency in latencies))
    started = time.monotonic()
    statuses = set()
    for token in tokens:
        while True:
            view = call(server, "fetch_job", {"job_token": token, "wait_s": 30})["structuredContent"]
            if view["status"] == "done":
                statuses.add(view["result"]["status"])
                break
    print(f"every result fetched {time.monotonic() - started:.1f} s later: {sorted(statuses)}")
    print("the Jobs are kept for MCP_K8S_RESULT_TTL_S; delete them with kubectl if you like")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=["rss", "cancel"])
    parser.add_argument("--bin", default="target/x86_64-unknown-linux-musl/release/mcp-k8s-ephemeral-job")
    parser.add_argument("--runner", default=run_job.RUNNER)
    args = parser.parse_args()
    # run_job.Server reads these when it starts the server.
    run_job.RUNNER = args.runner
    busybox = run_job.BUSYBOX
    run_job.BUSYBOX = f"{busybox},{PYTHON}"
    server = run_job.Server(args.bin, 20)
    run_job.BUSYBOX = busybox
    try:
        peak_rss(server) if args.what == "rss" else cancel_latency(server)
    finally:
        server.close()


if __name__ == "__main__":
    main()
