#!/usr/bin/env python3
"""Calls in an open sandbox against one-shot runs, on one server.

For `true` on busybox and `python3 -c pass` on python: one sandbox is
opened per image (`open_sandbox`), then N calls run in it (`run_job` with
`sandbox`), interleaved with N one-shot `run_job` calls of the same command
on the same server. Reports end-to-end p50/p95 (request sent -> response
read) per series, and the open itself.

On the test cluster by default, with --docker on the Docker backend (the
test dockerd, network `none`). A benchmark, not a test: it prints figures
and asserts nothing.
Usage: bench/sandbox_calls.py [--runs N] [--bin PATH] [--docker]
Needs `tests/cluster/up` (or `tests/docker/up`) and `tests/build-project-image` first.
"""
import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import warm_pool  # noqa: E402  (its server: both images allowed, either backend)

HERE = os.path.dirname(os.path.abspath(__file__))


def timed(server, tool, arguments):
    started = time.monotonic()
    result = server.tool(tool, arguments)
    elapsed = time.monotonic() - started
    if result.get("status") not in (None, "succeeded"):
        raise SystemExit(f"{tool} failed: {result.get('status')} {result.get('reason')}: {result.get('message')}")
    return elapsed, result


def ms(seconds):
    return f"{seconds * 1000:.0f} ms"


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--bin", default=os.path.join(HERE, "..", "target", "x86_64-unknown-linux-musl", "release", "mcp-k8s-ephemeral-job"))
    parser.add_argument("--docker", action="store_true", help="on the Docker backend (network none)")
    args = parser.parse_args()
    network = "none" if args.docker else "open"
    server = warm_pool.Server(args.bin, {"MCP_K8S_NETWORK_DEFAULT": network}, args.docker)
    backend = "Docker" if args.docker else "Kubernetes"
    print(f"{backend}, {args.runs} calls per series")
    try:
        for name, _pool, image, command in warm_pool.CASES:
            opened_in, opened = timed(server, "open_sandbox", {"image": image})
            sandbox = opened["sandbox"]
            samples = {"in the sandbox": [], "one-shot": []}
            try:
                for _ in range(args.runs):
                    samples["in the sandbox"].append(timed(server, "run_job", {"sandbox": sandbox, "command": command})[0])
                    samples["one-shot"].append(timed(server, "run_job", {"image": image, "command": command})[0])
            finally:
                server.tool("close_sandbox", {"sandbox": sandbox})
            print(f"  {name}: open_sandbox {ms(opened_in)}")
            for kind, values in samples.items():
                p50, p95 = warm_pool.percentile(values, 0.5), warm_pool.percentile(values, 0.95)
                print(f"    {kind:>15}: p50 {ms(p50)}, p95 {ms(p95)}")
    finally:
        server.close()


if __name__ == "__main__":
    main()
