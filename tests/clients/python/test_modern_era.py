"""The Python SDK 2.3 client in the stateless 2026-07-28 era: pinned
(`mode="2026-07-28"`) and by its default `auto` probe, which must now pick
it, over stdio and Streamable HTTP. Then two server processes answering one
client's consecutive requests, a task (`run_job`, `execute_code`) created on
one read on the other.

run_job and the tasks need the test cluster (tests/cluster/up) and the
runner image (`tests/build-project-image`, `MCP_K8S_PROJECT_IMAGE`).
"""

import json
import os
import tempfile
import time
import urllib.error
import urllib.request
from contextlib import asynccontextmanager

import anyio
import httpx2
import pytest
from mcp.client import Client
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client

from conftest import HttpServer, binary, busybox_image, cluster_env

MODERN = "2026-07-28"
TRANSPORTS = ["stdio", "streamable-http"]
MODES = [MODERN, "auto"]
CANCEL_LOG = {"stdio": "call cancelled by client", "streamable-http": "call cancelled: the client closed its stream"}


@pytest.fixture(scope="module")
def modern_http_server():
    server = HttpServer(cluster_env())
    yield server
    server.stop()


@asynccontextmanager
async def connect(transport: str, http_server, mode: str, **client_options):
    """A connected client plus a function returning the server's log entries."""
    if transport == "stdio":
        with tempfile.NamedTemporaryFile("w+", suffix=".log") as errlog:
            env = {"PATH": os.environ.get("PATH", ""), "MCP_K8S_TEST_TOOLS": "1", **cluster_env()}
            params = StdioServerParameters(command=binary(), args=[], env=env)

            def logs():
                errlog.flush()
                with open(errlog.name) as file:
                    return [json.loads(line) for line in file if line.strip()]

            async with Client(stdio_client(params, errlog=errlog), mode=mode, **client_options) as client:
                yield client, logs
    else:
        async with Client(f"{http_server.base}/mcp", mode=mode, **client_options) as client:
            yield client, http_server.logs


def run(coroutine_function):
    anyio.run(coroutine_function)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_the_modern_era_is_chosen_and_lists_tools(transport, mode, modern_http_server):
    async def scenario():
        async with connect(transport, modern_http_server, mode) as (client, _):
            assert client.protocol_version == MODERN
            tools = {tool.name for tool in (await client.list_tools()).tools}
            assert {"describe_environment", "run_job", "submit_job", "test_sleep"} <= tools

    run(scenario)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_run_job(transport, mode, modern_http_server):
    async def scenario():
        async with connect(transport, modern_http_server, mode) as (client, _):
            with anyio.fail_after(120):
                result = await client.call_tool("run_job", {"image": busybox_image(), "command": ["sh", "-c", "echo modern"]})
            assert result.is_error is False, result.content
            assert result.structured_content["exit_code"] == 0
            assert result.structured_content["stdout"] == "modern\n"

    run(scenario)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_progress(transport, mode, modern_http_server):
    async def scenario():
        updates = []

        async def on_progress(progress, total, message):
            updates.append((progress, total, message))

        async with connect(transport, modern_http_server, mode) as (client, _):
            result = await client.call_tool("test_sleep", {"seconds": 0.6, "progress_every_ms": 150}, progress_callback=on_progress)
            assert result.structured_content == {"slept_ms": 600}
            assert [update[0] for update in updates] == [150, 300, 450, 600]
            assert updates[0][2] == "slept 150 of 600 ms"

    run(scenario)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_cancel(transport, mode, modern_http_server):
    """stdio sends notifications/cancelled; over HTTP the client closes the
    request's stream, which is this era's cancel."""

    async def scenario():
        async with connect(transport, modern_http_server, mode) as (client, logs):
            count = lambda: sum(1 for entry in logs() if entry.get("msg") == CANCEL_LOG[transport])  # noqa: E731
            before = count()
            with anyio.move_on_after(1.5) as scope:
                await client.call_tool("test_sleep", {"seconds": 30})
            assert scope.cancelled_caught
            assert (await client.call_tool("describe_environment", {})).is_error is False
            deadline = time.monotonic() + 5
            while count() == before:
                assert time.monotonic() < deadline, "the server never saw the cancellation"
                await anyio.sleep(0.05)

    run(scenario)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_an_is_error_result(transport, mode, modern_http_server):
    async def scenario():
        async with connect(transport, modern_http_server, mode) as (client, _):
            result = await client.call_tool("test_sleep", {"seconds": "soon"})
            assert result.is_error is True
            assert result.content[0].text == "argument `seconds` must be a number, not a string"

    run(scenario)


@pytest.mark.parametrize("mode", MODES)
def test_the_bearer_token(mode):
    server = HttpServer({"MCP_K8S_AUTH_TOKEN": "pytest-token"})
    url = f"{server.base}/mcp"

    async def with_token():
        async with httpx2.AsyncClient(headers={"Authorization": "Bearer pytest-token"}) as http_client:
            async with Client(streamable_http_client(url, http_client=http_client), mode=mode) as client:
                assert client.protocol_version == MODERN
                assert (await client.call_tool("describe_environment", {})).is_error is False

    async def without_token():
        async with Client(url, mode=mode) as client:
            await client.list_tools()

    try:
        run(with_token)
        with pytest.raises(BaseException):
            run(without_token)
    finally:
        server.stop()


# --- two replicas, one client ----------------------------------------------

TASKS = "io.modelcontextprotocol/tasks"


def post(server: HttpServer, request_id: int, method: str, params: dict, extensions: bool = False) -> dict:
    """One 2026-07-28 request, headers derived from the body as the spec
    says; answers the JSON-RPC response (also for 4xx)."""
    capabilities = {"extensions": {TASKS: {}}} if extensions else {}
    params = {
        **params,
        "_meta": {"io.modelcontextprotocol/protocolVersion": MODERN, "io.modelcontextprotocol/clientCapabilities": capabilities},
    }
    headers = {"Content-Type": "application/json", "Accept": "application/json", "MCP-Protocol-Version": MODERN, "Mcp-Method": method}
    name = params.get("name") or params.get("taskId")
    if name:
        headers["Mcp-Name"] = name
    body = json.dumps({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}).encode()
    request = urllib.request.Request(f"{server.base}/mcp", data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as error:
        return json.loads(error.read())


def test_two_servers_answer_one_clients_consecutive_requests_and_share_tasks(cluster_http_servers):
    first, second = cluster_http_servers
    # Consecutive requests alternate between the replicas: no session ties
    # a client to one of them.
    discovered = post(first, 1, "server/discover", {})["result"]
    assert discovered["capabilities"]["extensions"][TASKS] == {}
    assert post(second, 2, "tools/list", {})["result"]["tools"][0]["name"] == "describe_environment"
    assert post(first, 3, "tools/call", {"name": "describe_environment", "arguments": {}})["result"]["isError"] is False

    arguments = {"image": busybox_image(), "command": ["sh", "-c", "echo from-a-task"]}
    created = post(first, 4, "tools/call", {"name": "run_job", "arguments": arguments}, extensions=True)["result"]
    assert created["resultType"] == "task" and created["status"] == "working", created
    assert isinstance(created["ttlMs"], int) and isinstance(created["pollIntervalMs"], int)
    task_id = created["taskId"]

    task = wait_for_task((first, second), task_id, first_request_id=5)
    assert task["status"] == "completed", task
    assert task["result"]["isError"] is False
    assert task["result"]["structuredContent"]["stdout"] == "from-a-task\n"
    # Read on the replica that did not create it, too.
    again = post(second, 80, "tasks/get", {"taskId": task_id}, extensions=True)["result"]
    assert again["status"] == "completed" and again["result"]["structuredContent"]["exit_code"] == 0

    # Without the extension: an ordinary result, and tasks/get is refused.
    plain = post(second, 90, "tools/call", {"name": "run_job", "arguments": arguments})["result"]
    assert plain["resultType"] == "complete" and plain["structuredContent"]["stdout"] == "from-a-task\n"
    refused = post(first, 91, "tasks/get", {"taskId": task_id})
    assert refused["error"]["code"] == -32021


def wait_for_task(replicas: tuple[HttpServer, HttpServer], task_id: str, first_request_id: int) -> dict:
    """Polls `tasks/get`, alternating between the replicas, until the task
    is no longer working; answers the last task."""
    deadline = time.monotonic() + 120
    request_id = first_request_id
    while True:
        replica = replicas[request_id % 2]
        task = post(replica, request_id, "tasks/get", {"taskId": task_id}, extensions=True)["result"]
        request_id += 1
        if task["status"] != "working":
            return task
        assert time.monotonic() < deadline, f"task still working: {task}"
        time.sleep(task["pollIntervalMs"] / 1000)


def test_execute_code_is_a_task_read_on_the_other_replica(cluster_http_servers):
    first, second = cluster_http_servers
    arguments = {"language": "python", "entrypoint_code": "print('from a task')"}
    created = post(second, 1, "tools/call", {"name": "execute_code", "arguments": arguments}, extensions=True)["result"]
    assert created["resultType"] == "task" and created["status"] == "working", created
    task = wait_for_task((first, second), created["taskId"], first_request_id=2)
    assert task["status"] == "completed", task
    assert task["result"]["isError"] is False
    assert task["result"]["content"][0]["text"] == "--- stdout ---\nfrom a task\n\n--- stderr ---\n", task


def test_a_task_cancelled_on_one_replica_reads_cancelled_on_the_other(cluster_http_servers):
    first, second = cluster_http_servers
    arguments = {"image": busybox_image(), "command": ["sleep", "60"]}
    created = post(first, 1, "tools/call", {"name": "run_job", "arguments": arguments}, extensions=True)["result"]
    task_id = created["taskId"]
    assert post(second, 2, "tasks/cancel", {"taskId": task_id}, extensions=True)["result"] == {"resultType": "complete"}
    deadline = time.monotonic() + 60
    while True:
        task = post(first, 3, "tasks/get", {"taskId": task_id}, extensions=True)["result"]
        if task["status"] != "working":
            break
        assert time.monotonic() < deadline, f"task still working: {task}"
        time.sleep(0.5)
    assert task["status"] == "cancelled", task
