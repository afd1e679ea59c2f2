"""Fixtures: the server binary under test, and an HTTP server process.

The binary comes from $MCP_K8S_BIN, else target/debug of this repository;
nothing is built here.
"""

import json
import os
import pathlib
import subprocess
import tempfile
import time

import pytest

REPO = pathlib.Path(__file__).resolve().parents[3]


def binary() -> str:
    path = os.environ.get("MCP_K8S_BIN") or str(REPO / "target" / "debug" / "mcp-k8s-ephemeral-job")
    if not os.access(path, os.X_OK):
        pytest.exit(f"server binary not found at {path}; build it or set MCP_K8S_BIN", returncode=2)
    return path


class HttpServer:
    """The binary serving HTTP on an ephemeral loopback port; its JSON logs
    go to a file the tests can read."""

    def __init__(self, extra_env: dict[str, str]):
        self.log = tempfile.NamedTemporaryFile("w+", suffix=".log", delete=False)
        env = {
            "PATH": os.environ.get("PATH", ""),
            "MCP_K8S_TRANSPORT": "http",
            "MCP_K8S_ADDR": "127.0.0.1:0",
            "MCP_K8S_TEST_TOOLS": "1",
            # Many of these servers have no backend: they serve anyway
            # (a server with none otherwise refuses to start).
            "MCP_K8S_LAZY_BACKEND": "1",
            **extra_env,
        }
        self.process = subprocess.Popen([binary()], env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=self.log)
        self.addr = self._wait_for_listening()
        self.base = f"http://{self.addr}"

    def _wait_for_listening(self) -> str:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            for entry in self.logs():
                if entry.get("msg") == "listening":
                    return entry["addr"]
            time.sleep(0.05)
        raise RuntimeError("the server did not log `listening` within 10 s")

    def logs(self) -> list[dict]:
        with open(self.log.name) as file:
            return [json.loads(line) for line in file if line.strip()]

    def stop(self) -> None:
        """Stops the server; a second call does nothing."""
        if self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=15)
        if os.path.exists(self.log.name):
            os.unlink(self.log.name)


@pytest.fixture(scope="module")
def http_server():
    server = HttpServer({})
    yield server
    server.stop()


@pytest.fixture(scope="module")
def http_server_with_token():
    server = HttpServer({"MCP_K8S_AUTH_TOKEN": "pytest-token"})
    yield server
    server.stop()


CLUSTER_DIR = pathlib.Path(os.environ.get("MCP_K8S_TEST_CLUSTER_DIR") or "/var/lib/mcp-k8s-test-cluster")


def cluster_env() -> dict[str, str]:
    """The settings that connect a server to the test cluster, as the Rust
    cluster tests give them (tests/support/cluster.rs, `server_env`). Fails
    loudly without a cluster: run_job needs one."""
    kubeconfig = CLUSTER_DIR / "server.kubeconfig"
    values = cluster_values()
    project_image = os.environ.get("MCP_K8S_PROJECT_IMAGE") or "mcp-k8s-test.local/mcp-k8s-ephemeral-job:dev"
    return {
        "MCP_K8S_KUBECONFIG": str(kubeconfig),
        "MCP_K8S_ALLOWED_IMAGES": values.get("IMAGE_BUSYBOX", "mcp-k8s-test.local/busybox:1.35"),
        "MCP_K8S_RUNNER_IMAGE": project_image,
        "MCP_K8S_DEFAULT_CPU": "50m",
        "MCP_K8S_DEFAULT_MEMORY": "64Mi",
    }


def cluster_values() -> dict[str, str]:
    """The test cluster's `env` file (images, namespace); fails loudly
    without a cluster."""
    if not (CLUSTER_DIR / "server.kubeconfig").exists():
        pytest.fail(f"no test cluster at {CLUSTER_DIR}: run `tests/cluster/up` first (run_job needs it)")
    return dict(line.split("=", 1) for line in (CLUSTER_DIR / "env").read_text().splitlines() if "=" in line)


def busybox_image() -> str:
    return cluster_env()["MCP_K8S_ALLOWED_IMAGES"]


@pytest.fixture(scope="module")
def cluster_http_servers():
    """Two server processes on the same cluster: replicas behind one name,
    with a python profile so execute_code runs too."""
    python_image = cluster_values().get("IMAGE_PYTHON", "mcp-k8s-test.local/python:3.11")
    with tempfile.NamedTemporaryFile("w", suffix=".json") as languages:
        json.dump({"python": {"image": python_image, "cpu": "500m", "memory": "128Mi"}}, languages)
        languages.flush()
        env = {**cluster_env(), "MCP_K8S_LANGUAGES": languages.name}
        servers = [HttpServer(env), HttpServer(env)]
        yield servers
        for server in servers:
            server.stop()
