#!/usr/bin/env python3
"""Peak RSS of the static release build under hostile load, no cluster.

Each case starts a fresh server over HTTP against a fake Kubernetes API
served by this script (plain HTTP on loopback: `fast` answers at once,
`slow` after --slow-s seconds, `never` reads the request and never
answers), drives it with N concurrent clients, and prints one markdown
row per case and concurrency: the server's peak RSS (VmHWM), its RSS and
threads at the end, and what the clients got back.

Cases:
- `outputs` (needs the test Docker engine, tests/docker/up): one run_job
  writes 8 MiB of random stdout into MCP_K8S_OUTPUTS_DIR, then N clients
  each read 8 pieces of 1 MiB of it (resources/read of its job:// link).
- `never`: an API that never answers; N clients x 10 describe_environment.
- `slow-sites`: 200 sites whose API answers after --slow-s; N clients x 2
  describe_environment.
- `idle-sites`: 800 sites (one shared kubeconfig), no calls: RSS and
  threads once every site is connected and the server has settled.
- `inflight`: 256 run_job calls in flight on an API that answers after
  --inflight-delay-s and whose watches never deliver a pod
  (N is ignored; it is always 256 calls on 32 connections).

Usage: bench/memory.py [--bin PATH] [--cases a,b] [--levels 8,32,128]
Default binary: target/x86_64-unknown-linux-musl/release/mcp-k8s-ephemeral-job
(`cargo build --release --target x86_64-unknown-linux-musl`).
A benchmark, not a test: it prints figures and asserts nothing.
"""
import argparse
import http.client
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import run_job  # noqa: E402  (its /proc reader)

DOCKER_SOCKET = "/var/lib/mcp-k8s-test-docker/docker.sock"
DOCKER_BUSYBOX = "mcp-k8s-test.local/busybox:1.35"
BIN = "target/x86_64-unknown-linux-musl/release/mcp-k8s-ephemeral-job"
INITIALIZE = {"jsonrpc": "2.0", "id": 0, "method": "initialize",
              "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "bench", "version": "1"}}}
EMPTY_LIST = json.dumps({"kind": "List", "apiVersion": "v1", "metadata": {"resourceVersion": "1"}, "items": []}).encode()


class FakeApi:
    """A Kubernetes API that lists nothing, on loopback, one thread per
    connection. `mode`: fast, slow (answers after `delay`), never."""

    def __init__(self, mode, delay=0.0):
        self.mode, self.delay = mode, delay
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(4096)
        self.port = self.listener.getsockname()[1]
        self.held = []
        self.posts = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn):
        reader = conn.makefile("rb")
        try:
            while True:
                head = []
                while True:
                    line = reader.readline()
                    if not line:
                        return
                    if line in (b"\r\n", b"\n"):
                        break
                    head.append(line.decode("latin-1"))
                length = 0
                for line in head[1:]:
                    name, _, value = line.partition(":")
                    if name.strip().lower() == "content-length":
                        length = int(value.strip())
                body = reader.read(length) if length else b""
                target = head[0].split()[1] if head else "/"
                if self.mode == "never" or "watch=" in target:
                    self.held.append(conn)
                    while reader.read(4096):
                        pass
                    return
                if self.mode == "slow":
                    time.sleep(self.delay)
                answer = body if head[0].startswith("POST") and body else EMPTY_LIST
                if head[0].startswith("POST"):
                    self.posts += 1
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(answer) + answer)
        except OSError:
            return
        finally:
            conn.close()

    def kubeconfig(self, directory):
        path = os.path.join(directory, f"kubeconfig-{self.port}")
        with open(path, "w") as file:
            file.write(f"""apiVersion: v1
kind: Config
clusters: [{{name: fake, cluster: {{server: "http://127.0.0.1:{self.port}"}}}}]
users: [{{name: fake, user: {{token: bench}}}}]
contexts: [{{name: fake, context: {{cluster: fake, user: fake}}}}]
current-context: fake
""")
        return path

    def env(self, directory):
        return {"MCP_K8S_KUBECONFIG": self.kubeconfig(directory), "MCP_K8S_BACKEND": "kubernetes"}

    def close(self):
        self.listener.close()
        for conn in self.held:
            conn.close()


class Server:
    """The server under test over HTTP on an ephemeral loopback port."""

    def __init__(self, binary, env):
        full = {"PATH": os.environ.get("PATH", ""), "MCP_K8S_TRANSPORT": "http", "MCP_K8S_ADDR": "127.0.0.1:0",
                "MCP_K8S_LAZY_BACKEND": "1", "MCP_K8S_ALLOWED_IMAGES": "busybox:1.36", "MCP_K8S_LOG_LEVEL": "info"}
        full.update(env)
        self.process = subprocess.Popen([binary], env=full, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.PIPE, text=True)
        self.proc = self.process  # for run_job.Server.status_kib
        self.addr = None
        self.lines = []
        while self.addr is None:
            line = self.process.stderr.readline()
            if not line:
                raise RuntimeError("the server stopped before listening: " + "".join(self.lines[-5:]))
            self.lines.append(line)
            try:
                log = json.loads(line)
            except ValueError:
                continue
            if log.get("msg") == "listening":
                self.addr = log["addr"]
        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self):
        for _ in self.process.stderr:
            pass

    def status(self, field):
        """A figure of the server's /proc status (VmHWM, Threads...)."""
        return run_job.Server.status_kib(self, field)

    def close(self):
        self.process.kill()
        self.process.wait()


class Client:
    """One MCP session on its own connection."""

    def __init__(self, addr, timeout=120):
        host, port = addr.rsplit(":", 1)
        self.conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
        self.session = None
        self.next_id = 1
        answer, headers = self._post(INITIALIZE)
        self.session = headers.get("mcp-session-id")
        self._post({"jsonrpc": "2.0", "method": "notifications/initialized"})

    def _post(self, message):
        headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
        if self.session:
            headers["Mcp-Session-Id"] = self.session
            headers["MCP-Protocol-Version"] = "2025-11-25"
        self.conn.request("POST", "/mcp", json.dumps(message), headers)
        response = self.conn.getresponse()
        body = response.read()
        # A connection per request: the server may close an idle one.
        self.conn.close()
        got = {name.lower(): value for name, value in response.getheaders()}
        if not body:
            return None, got
        if got.get("content-type", "").startswith("text/event-stream"):
            # The last event's data lines, joined as SSE says.
            events = [event for event in body.decode().replace("\r\n", "\n").split("\n\n") if "data:" in event]
            lines = events[-1].split("\n") if events else []
            body = "\n".join(line[5:].lstrip(" ") for line in lines if line.startswith("data:")) or "null"
        return json.loads(body), got

    def request(self, method, params):
        self.next_id += 1
        answer, _ = self._post({"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params})
        return answer


def clients_at_once(server, count, work):
    """`count` clients, each its own session, run `work(client)` together;
    returns how many calls came back with a result or a tool error."""
    results, lock = {"ok": 0, "error": 0}, threading.Lock()
    ready = threading.Barrier(count + 1)

    def one():
        try:
            client = Client(server.addr)
        except Exception:
            ready.wait()
            with lock:
                results["error"] += 1
            return
        ready.wait()
        try:
            outcome = work(client)
        except Exception as error:
            print(f"a client failed: {error!r}", file=sys.stderr)
            outcome = (0, 1)
        with lock:
            results["ok"] += outcome[0]
            results["error"] += outcome[1]

    threads = [threading.Thread(target=one) for _ in range(count)]
    for thread in threads:
        thread.start()
    ready.wait()
    for thread in threads:
        thread.join()
    return results


def describe_times(times):
    def work(client):
        ok = error = 0
        for _ in range(times):
            answer = client.request("tools/call", {"name": "describe_environment", "arguments": {}})
            if answer and "result" in answer:
                ok += 1
            else:
                error += 1
        return ok, error
    return work


def row(case, level, server, results, note=""):
    peak = server.status("VmHWM") / 1024
    rss = server.status("VmRSS") / 1024
    threads = server.status("Threads")
    print(f"| {case} | {level} | {peak:.1f} | {rss:.1f} | {threads} | {results} | {note} |", flush=True)


def sites_file(directory, count, name="sites.json"):
    """`count` sites that take the server's kubeconfig and backend: short
    entries, so 800 fit in the 64 KiB the file may hold."""
    sites = [{"name": f"s{index}"} for index in range(count)]
    path = os.path.join(directory, name)
    with open(path, "w") as file:
        json.dump(sites, file, separators=(",", ":"))
    return path, os.path.getsize(path)


def case_never(binary, level, directory):
    api = FakeApi("never")
    server = Server(binary, api.env(directory))
    try:
        results = clients_at_once(server, level, describe_times(10))
        row("API never answers, 10 describe_environment each", level, server, results)
    finally:
        server.close()
        api.close()


def case_slow_sites(binary, level, directory, delay):
    api = FakeApi("slow", delay)
    path, _ = sites_file(directory, 200)
    server = Server(binary, {"MCP_K8S_SITES": path, **api.env(directory)})
    try:
        results = clients_at_once(server, level, describe_times(2))
        row(f"200 sites answering after {delay:g} s, 2 describe_environment each", level, server, results)
    finally:
        server.close()
        api.close()


def case_idle_sites(binary, directory, settle):
    api = FakeApi("fast")
    path, size = sites_file(directory, 800)
    started = time.monotonic()
    server = Server(binary, {"MCP_K8S_SITES": path, **api.env(directory)})
    listening = time.monotonic() - started
    try:
        time.sleep(settle)
        row("800 idle sites", 0, server, "-", f"sites file {size} bytes, listening after {listening:.1f} s")
    finally:
        server.close()
        api.close()


def case_inflight(binary, directory, delay, calls=256, connections=32):
    api = FakeApi("slow", delay)
    env = {**api.env(directory), "MCP_K8S_MAX_CONCURRENT": "1000", "MCP_K8S_MAX_QUEUED": "1000"}
    server = Server(binary, env)
    base_threads = server.status("Threads")
    del api.held[:]
    per_connection = calls // connections
    try:
        def work(client):
            # Each call on a connection of its own would need 256 sockets:
            # fire them as POSTs without waiting, on `per_connection`
            # connections each.
            for call in range(per_connection):
                sock = socket.create_connection(tuple(server.addr.rsplit(":", 1)[0:1]) + (int(server.addr.rsplit(":", 1)[1]),))
                body = json.dumps({"jsonrpc": "2.0", "id": call + 1, "method": "tools/call",
                                   "params": {"name": "run_job", "arguments": {"image": "busybox:1.36", "command": ["true"]}}})
                sock.sendall((f"POST /mcp HTTP/1.1\r\nHost: {server.addr}\r\nContent-Type: application/json\r\n"
                              f"Accept: application/json, text/event-stream\r\nMcp-Session-Id: {client.session}\r\n"
                              f"MCP-Protocol-Version: 2025-11-25\r\nContent-Length: {len(body)}\r\n\r\n{body}").encode())
                api.held.append(sock)
            return per_connection, 0
        clients_at_once(server, connections, work)
        # Every call's Job (and Secret, if any) created: all are in flight.
        deadline = time.monotonic() + 300
        while api.posts < calls and time.monotonic() < deadline:
            time.sleep(0.5)
            print(f"objects created: {api.posts}, threads {server.status('Threads')}", file=sys.stderr, end="\r")
        time.sleep(2)
        row(f"run_job calls in flight, API answering after {delay:g} s, no pod ever", calls, server,
            f"{api.posts} objects created", f"{base_threads} threads before")
    finally:
        server.close()
        api.close()


def case_outputs(binary, level, directory, reads=8):
    """On the test Docker engine: one run writes 8 MiB of random stdout
    into the output store, then `level` clients each read `reads` 1 MiB
    pieces of it."""
    store = tempfile.mkdtemp(prefix="outputs-", dir=directory)
    env = {"MCP_K8S_BACKEND": "docker", "MCP_K8S_DOCKER_HOST": f"unix://{DOCKER_SOCKET}", "MCP_K8S_RUNNER_BINARY": os.path.abspath(binary),
           "MCP_K8S_ALLOWED_IMAGES": DOCKER_BUSYBOX, "MCP_K8S_OUTPUTS_DIR": store}
    server = Server(binary, env)
    try:
        command = ["head", "-c", str(8 << 20), "/dev/urandom"]
        ran = Client(server.addr).request("tools/call", {"name": "run_job", "arguments": {"image": DOCKER_BUSYBOX, "command": command, "network": "none"}})
        uri = ran["result"]["structuredContent"]["links"][0]["uri"]
        before = server.status("VmHWM") / 1024
        # The run's own peak is not the reads': start the peak again
        # (proc(5), clear_refs: 5 resets VmHWM to the current RSS).
        with open(f"/proc/{server.process.pid}/clear_refs", "w") as clear:
            clear.write("5")

        def work(client):
            ok = error = 0
            for piece in range(reads):
                answer = client.request("resources/read", {"uri": f"{uri}?offset={piece << 20}&length={1 << 20}"})
                if answer and answer.get("result", {}).get("contents", [{}])[0].get("_meta", {}).get("length") == 1 << 20:
                    ok += 1
                else:
                    error += 1
            return ok, error
        results = clients_at_once(server, level, work)
        row(f"stored output, {reads} reads of 1 MiB each", level, server, results, f"the run before them: peak {before:.1f} MiB")
    finally:
        server.close()
        shutil.rmtree(store, ignore_errors=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bin", default=BIN)
    parser.add_argument("--cases", default="outputs,never,slow-sites,idle-sites,inflight")
    parser.add_argument("--levels", default="8,32,128")
    parser.add_argument("--slow-s", type=float, default=3.0)
    parser.add_argument("--inflight-delay-s", type=float, default=0.5)
    parser.add_argument("--settle-s", type=float, default=5.0)
    args = parser.parse_args()
    levels = [int(level) for level in args.levels.split(",")]
    print("| case | clients | peak RSS MiB | RSS at the end MiB | threads at the end | calls answered | note |")
    print("|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory(prefix="bench-memory-") as directory:
        for case in args.cases.split(","):
            if case == "never":
                for level in levels:
                    case_never(args.bin, level, directory)
            elif case == "slow-sites":
                for level in levels:
                    case_slow_sites(args.bin, level, directory, args.slow_s)
            elif case == "idle-sites":
                case_idle_sites(args.bin, directory, args.settle_s)
            elif case == "inflight":
                case_inflight(args.bin, directory, args.inflight_delay_s)
            elif case == "outputs":
                for level in levels:
                    case_outputs(args.bin, level, directory)
            else:
                sys.exit(f"unknown case {case}")


if __name__ == "__main__":
    main()
