#!/usr/bin/env python3
"""Warm execute_code with Python started ahead, against warm without it.

Two servers over stdio, the same build, languages file and network,
calls interleaved; each has one warm pool of one sandbox that fits
`execute_code` python (the profile's image, CPU and memory):
  - "plain": a pool of that shape (the sandbox waits; Python starts at the
    call, then imports what the program imports);
  - "preload": the same pool with `"language": "python"`, whose profile
    preloads asyncio, email, http.client, json and decimal (Python started
    and those imported before the call).
For two programs (one that imports those modules, and `pass`), N calls
each way. Before each call the script waits until the pool has a ready
sandbox, so every figure is a warm hit (checked with the hit counts), then
--settle seconds more (default 1): a pool reports a sandbox ready when
its container runs, and the interpreter it starts ahead needs a moment
more for its imports (a call that comes sooner waits for them); an
agent's calls come seconds apart. --settle 0 shows the tight case.
Reports end-to-end p50/p95 (request sent -> response read) per series.

On the test cluster by default, with --docker on the Docker backend.
A benchmark, not a test: it prints figures and asserts nothing.
Usage: bench/preload.py [--runs N] [--bin PATH] [--docker] [--settle S]
Needs `tests/cluster/up` (or `tests/docker/up`) and `tests/build-project-image` first.
"""
import argparse
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import execute_code  # noqa: E402  (a timed call that must succeed)
import warm_pool  # noqa: E402  (its server: both images allowed, either backend)

HERE = os.path.dirname(os.path.abspath(__file__))
LIMITS = {"cpu": "500m", "memory": "128Mi"}
MODULES = ["asyncio", "email", "http.client", "json", "decimal"]
PROGRAMS = {
    "imports the five modules": "import asyncio, email, http.client, json, decimal\n",
    "pass": "pass\n",
}


def timed(server, code):
    return execute_code.timed(server, "execute_code", {"language": "python", "entrypoint_code": code})


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--bin", default=os.path.join(HERE, "..", "target", "x86_64-unknown-linux-musl", "release", "mcp-k8s-ephemeral-job"))
    parser.add_argument("--docker", action="store_true", help="on the Docker backend")
    parser.add_argument("--settle", type=float, default=1.0, help="seconds between a sandbox's readiness and the call")
    args = parser.parse_args()
    folder = tempfile.mkdtemp(prefix="bench-preload-")
    languages = os.path.join(folder, "languages.json")
    with open(languages, "w") as out:
        json.dump({"python": {"image": warm_pool.PYTHON, **LIMITS, "preload": MODULES}}, out)
    files = {}
    for kind, extra in (("plain", {"image": warm_pool.PYTHON, **LIMITS}), ("preload", {"language": "python"})):
        files[kind] = os.path.join(folder, f"{kind}.json")
        with open(files[kind], "w") as out:
            json.dump([{"name": f"bench-{kind}", "network": "none", "size": 1, "max_idle_s": 600, **extra}], out)
    base = {"MCP_K8S_LANGUAGES": languages, "MCP_K8S_NETWORK_DEFAULT": "none"}
    servers = {kind: warm_pool.Server(args.bin, {**base, "MCP_K8S_WARM_POOLS": path}, args.docker) for kind, path in files.items()}
    samples = {(program, kind): [] for program in PROGRAMS for kind in servers}
    try:
        for _ in range(args.runs):
            for program, code in PROGRAMS.items():
                for kind, server in servers.items():
                    warm_pool.await_ready(server, f"bench-{kind}")
                    time.sleep(args.settle)
                    samples[(program, kind)].append(timed(server, code))
        hits = {kind: server.pools()[f"bench-{kind}"]["hits"] for kind, server in servers.items()}
    finally:
        for server in servers.values():
            server.close()
    backend = "Docker" if args.docker else "Kubernetes"
    print(f"{backend}, warm execute_code python, {args.runs} calls per series, interleaved, {args.settle} s after ready; hits {hits}")
    for program in PROGRAMS:
        p50 = {}
        for kind in servers:
            values = sorted(samples[(program, kind)])
            p50[kind] = warm_pool.percentile(values, 0.5)
            print(f"  {program}, {kind}: p50 {p50[kind] * 1000:.0f} ms, p95 {warm_pool.percentile(values, 0.95) * 1000:.0f} ms")
        print(f"  {program}: preload - plain at p50 {(p50['preload'] - p50['plain']) * 1000:+.0f} ms")


if __name__ == "__main__":
    main()
