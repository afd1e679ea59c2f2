#!/usr/bin/env python3
"""Cold execute_code against cold run_job of the same interpreter doing nothing.

One server over stdio (no warm pools), calls interleaved, N rounds of:
  - execute_code, python, `pass` (its language's image and limits, its
    default network mode);
  - run_job `python3 -c pass` on the same image, with the same limits and
    network mode (what execute_code costs on top of the run itself);
  - run_job `python3 -c pass` with the run_job default network (`open`),
    for the difference the network mode makes.
Reports p50/p95 end to end (request sent -> response read) per series and
the execute_code overhead at p50 (goal: at most 150 ms over run_job).

On the test cluster by default (with the fence wait on, as in the tests),
with --docker on the Docker backend. A benchmark, not a test: it prints
figures and asserts nothing.
Usage: bench/execute_code.py [--runs N] [--bin PATH] [--docker]
Needs `tests/cluster/up` (or `tests/docker/up`) and `tests/build-project-image` first.
"""
import argparse
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import warm_pool  # noqa: E402  (its server: both images allowed, either backend)

HERE = os.path.dirname(os.path.abspath(__file__))
LIMITS = {"cpu": "250m", "memory": "128Mi"}


def timed(server, tool, arguments):
    started = time.monotonic()
    result = server.tool(tool, arguments)
    elapsed = time.monotonic() - started
    status = result.get("status")
    if status not in ("succeeded", "success"):
        raise SystemExit(f"{tool} failed: {json.dumps(result)[:400]}")
    return elapsed


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--bin", default=os.path.join(HERE, "..", "target", "x86_64-unknown-linux-musl", "release", "mcp-k8s-ephemeral-job"))
    parser.add_argument("--docker", action="store_true", help="on the Docker backend")
    args = parser.parse_args()
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as languages:
        json.dump({"python": {"image": warm_pool.PYTHON, **LIMITS}}, languages)
    server = warm_pool.Server(args.bin, {"MCP_K8S_LANGUAGES": languages.name}, args.docker)
    try:
        network = server.tool("describe_environment", {})["network"]["execute_code_default"]
        series = {
            f"execute_code python pass (network {network})": ("execute_code", {"language": "python", "entrypoint_code": "pass"}),
            f"run_job python3 -c pass (network {network})": (
                "run_job",
                {"image": warm_pool.PYTHON, "command": ["python3", "-c", "pass"], "limits": LIMITS, "network": network},
            ),
            "run_job python3 -c pass (network open)": (
                "run_job",
                {"image": warm_pool.PYTHON, "command": ["python3", "-c", "pass"], "limits": LIMITS, "network": "open"},
            ),
        }
        samples = {name: [] for name in series}
        for _ in range(args.runs):
            for name, (tool, arguments) in series.items():
                samples[name].append(timed(server, tool, arguments))
    finally:
        server.close()
        os.unlink(languages.name)
    backend = "Docker" if args.docker else "Kubernetes"
    print(f"{backend}, {args.runs} cold calls per series, interleaved")
    p50 = {}
    for name, values in samples.items():
        values.sort()
        p50[name] = warm_pool.percentile(values, 0.5)
        print(f"  {name}: p50 {p50[name] * 1000:.0f} ms, p95 {warm_pool.percentile(values, 0.95) * 1000:.0f} ms")
    names = list(series)
    print(f"  execute_code over run_job, same network, p50: {(p50[names[0]] - p50[names[1]]) * 1000:+.0f} ms (goal: at most +150 ms)")


if __name__ == "__main__":
    main()
