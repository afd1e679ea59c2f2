"""The official MCP Python SDK (2.x) against the server over stdio,
Streamable HTTP and legacy HTTP+SSE.

These are the handshake era's tests: clients run in `mode="legacy"` (the
`initialize` handshake, as every client that does not speak 2026-07-28
uses). The default `auto` mode now chooses 2026-07-28: test_modern_era.py.
"""

import json
import os
import tempfile
import time
from contextlib import asynccontextmanager

import anyio
import httpx2
import pytest
from mcp.client import Client
from mcp.client.sse import sse_client
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client

from conftest import binary

TRANSPORTS = ["stdio", "streamable-http", "sse"]


@asynccontextmanager
async def connect(transport: str, http_server, **client_options):
    """A connected client plus a function returning the server's log entries."""
    client_options.setdefault("mode", "legacy")
    if transport == "stdio":
        with tempfile.NamedTemporaryFile("w+", suffix=".log") as errlog:
            # The SDK passes the child only an allow-list of variables, so the
            # environment is given explicitly.
            # python:3.12-slim is the built-in python profile's image: a
            # language runs only when its image is allowed.
            # No backend: MCP_K8S_LAZY_BACKEND lets it serve anyway.
            env = {
                "PATH": os.environ.get("PATH", ""),
                "MCP_K8S_TEST_TOOLS": "1",
                "MCP_K8S_LAZY_BACKEND": "1",
                "MCP_K8S_ALLOWED_IMAGES": "python:3.12-slim",
            }
            params = StdioServerParameters(command=binary(), args=[], env=env)

            def logs():
                errlog.flush()
                with open(errlog.name) as file:
                    return [json.loads(line) for line in file if line.strip()]

            async with Client(stdio_client(params, errlog=errlog), **client_options) as client:
                yield client, logs
    elif transport == "streamable-http":
        async with Client(f"{http_server.base}/mcp", **client_options) as client:
            yield client, http_server.logs
    else:
        async with Client(sse_client(f"{http_server.base}/sse"), **client_options) as client:
            yield client, http_server.logs


def run(coroutine_function):
    anyio.run(coroutine_function)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_initialize_and_list_tools(transport, http_server):
    async def scenario():
        async with connect(transport, http_server) as (client, _):
            assert client.protocol_version == "2025-11-25"
            assert client.server_info.name == "mcp-k8s-ephemeral-job"
            assert client.server_capabilities.tools is not None
            tools = {tool.name: tool for tool in (await client.list_tools()).tools}
            assert {"describe_environment", "test_sleep"} <= set(tools)
            describe = tools["describe_environment"]
            assert describe.annotations.read_only_hint is True
            assert describe.output_schema["type"] == "object"

    run(scenario)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_call_a_tool(transport, http_server):
    async def scenario():
        async with connect(transport, http_server) as (client, _):
            result = await client.call_tool("describe_environment", {})
            assert result.is_error is False
            assert result.structured_content["namespace"] == "mcp-ephemeral"
            assert result.structured_content["timeout_s"] == {"default": 60, "max": 600}
            assert json.loads(result.content[0].text) == result.structured_content
            await client.send_ping()

    run(scenario)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_progress_notifications(transport, http_server):
    async def scenario():
        updates = []

        async def on_progress(progress, total, message):
            updates.append((progress, total, message, time.monotonic()))

        async with connect(transport, http_server) as (client, _):
            result = await client.call_tool("test_sleep", {"seconds": 0.6, "progress_every_ms": 150}, progress_callback=on_progress)
            assert result.structured_content == {"slept_ms": 600}
            assert [update[0] for update in updates] == [150, 300, 450, 600]
            assert all(update[1] == 600 for update in updates)
            assert updates[0][2] == "slept 150 of 600 ms"
            # Delivered as they happened, not in one burst at the end.
            assert updates[-1][3] - updates[0][3] > 0.3

    run(scenario)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_log_notifications_follow_set_level(transport, http_server):
    async def scenario():
        messages = []

        async def on_log(params):
            messages.append((params.level, params.data))

        async with connect(transport, http_server, logging_callback=on_log) as (client, _):
            await client.call_tool("test_sleep", {"seconds": 0})
            await client.set_logging_level("error")
            await client.call_tool("test_sleep", {"seconds": 0.01})
        assert messages == [("info", "sleeping 0 ms")]

    run(scenario)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_cancel_a_call(transport, http_server):
    async def scenario():
        async with connect(transport, http_server) as (client, logs):
            before = sum(1 for entry in logs() if entry.get("msg") == "call cancelled by client")
            started = time.monotonic()
            with anyio.move_on_after(0.5) as scope:
                await client.call_tool("test_sleep", {"seconds": 30})
            assert scope.cancelled_caught
            # The session is still usable and the server stopped the work.
            result = await client.call_tool("describe_environment", {})
            assert result.is_error is False
            deadline = time.monotonic() + 5
            while sum(1 for entry in logs() if entry.get("msg") == "call cancelled by client") == before:
                assert time.monotonic() < deadline, "the server never saw the cancellation"
                await anyio.sleep(0.05)
            finished = [entry for entry in logs() if entry.get("msg") == "tool call finished" and entry.get("status") == "cancelled"]
            assert finished, "the cancelled call did not stop"
            assert time.monotonic() - started < 10

    run(scenario)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_bad_arguments_come_back_as_is_error(transport, http_server):
    async def scenario():
        async with connect(transport, http_server) as (client, _):
            result = await client.call_tool("test_sleep", {"seconds": "soon"})
            assert result.is_error is True
            assert result.structured_content is None
            assert result.content[0].text == "argument `seconds` must be a number, not a string"

    run(scenario)


def test_legacy_mode_skips_the_probe(http_server):
    async def scenario():
        async with connect("streamable-http", http_server, mode="legacy") as (client, _):
            assert client.protocol_version == "2025-11-25"

    run(scenario)


def test_auth_token_over_streamable_http(http_server_with_token):
    url = f"{http_server_with_token.base}/mcp"

    async def with_token():
        async with httpx2.AsyncClient(headers={"Authorization": "Bearer pytest-token"}) as http_client:
            async with Client(streamable_http_client(url, http_client=http_client)) as client:
                assert (await client.call_tool("describe_environment", {})).is_error is False

    async def without_token():
        async with Client(url) as client:
            await client.list_tools()

    run(with_token)
    with pytest.raises(BaseException):
        run(without_token)


def test_auth_token_over_legacy_sse(http_server_with_token):
    async def scenario():
        transport = sse_client(f"{http_server_with_token.base}/sse", headers={"X-MCP-AUTH": "pytest-token"})
        async with Client(transport) as client:
            assert (await client.call_tool("describe_environment", {})).is_error is False

    run(scenario)


def test_a_long_call_outlives_httpx_default_read_timeout(http_server):
    """A plain `httpx2.AsyncClient` (the way to add
    headers or auth) reads with httpx's default 5 s timeout, and the server
    used to send nothing until an 8 s call ended. Now the answer becomes an
    event stream with keepalive comments, so the defaults are enough."""
    url = f"{http_server.base}/mcp"

    async def scenario():
        async with httpx2.AsyncClient() as http_client:
            async with Client(streamable_http_client(url, http_client=http_client)) as client:
                # Bounded so that a hang fails instead of stalling the suite.
                with anyio.fail_after(30):
                    result = await client.call_tool("test_sleep", {"seconds": 8})
                assert result.is_error is False
                assert result.structured_content == {"slept_ms": 8000}

    run(scenario)


# ---------------------------------------------------------------------------
# execute_code: isolator's tool through the real SDK. A bad call
# needs no cluster; the runs use the test cluster when `tests/cluster/up`
# has left one, and say loudly that they were left out otherwise.

CLUSTER_DIR = os.environ.get("MCP_K8S_TEST_CLUSTER_DIR", "/var/lib/mcp-k8s-test-cluster")
PROJECT_IMAGE = os.environ.get("MCP_K8S_PROJECT_IMAGE") or "mcp-k8s-test.local/mcp-k8s-ephemeral-job:dev"


def test_execute_code_with_no_source_is_an_is_error_result():
    async def scenario():
        async with connect("stdio", None) as (client, _):
            tools = {tool.name: tool for tool in (await client.list_tools()).tools}
            assert "python" in tools["execute_code"].input_schema["properties"]["language"]["enum"]
            result = await client.call_tool("execute_code", {"language": "python"})
            assert result.is_error is True
            assert result.structured_content is None
            assert result.content[0].text.startswith("`language` needs `entrypoint_code`")

    run(scenario)


@asynccontextmanager
async def cluster_client():
    kubeconfig = os.path.join(CLUSTER_DIR, "server.kubeconfig")
    if not os.path.exists(kubeconfig):
        pytest.skip(f"LEFT OUT: no test cluster at {CLUSTER_DIR} (run tests/cluster/up)")
    with tempfile.NamedTemporaryFile("w", suffix=".json") as languages:
        json.dump({"python": {"image": "mcp-k8s-test.local/python:3.11", "cpu": "500m", "memory": "128Mi"}}, languages)
        languages.flush()
        env = {
            "PATH": os.environ.get("PATH", ""),
            "MCP_K8S_KUBECONFIG": kubeconfig,
            "MCP_K8S_RUNNER_IMAGE": PROJECT_IMAGE,
            "MCP_K8S_LANGUAGES": languages.name,
            "MCP_K8S_DEFAULT_CPU": "50m",
            "MCP_K8S_DEFAULT_MEMORY": "64Mi",
        }
        async with Client(stdio_client(StdioServerParameters(command=binary(), args=[], env=env))) as client:
            yield client


def test_execute_code_hello_world_and_a_failure_on_the_cluster():
    async def scenario():
        async with cluster_client() as client:
            hello = await client.call_tool("execute_code", {"language": "python", "entrypoint_code": "print('hello, world')"})
            assert hello.is_error is False
            assert hello.content[0].text == "--- stdout ---\nhello, world\n\n--- stderr ---\n"
            assert hello.structured_content["status"] == "succeeded"
            # isError with structuredContent (the run result): the SDK
            # accepts it and keeps both.
            failed = await client.call_tool("execute_code", {"language": "python", "entrypoint_code": "import sys\nsys.exit(3)"})
            assert failed.is_error is True
            assert failed.content[0].text.startswith("Execution Failed (error): ")
            assert failed.structured_content["exit_code"] == 3

    run(scenario)
