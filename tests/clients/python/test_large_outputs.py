"""Outputs too large for a context, through the official Python SDK: a
large stdout and file, linked from the result and read back in ranges,
hashed against what the command wrote: 50 MB and 30 MB, on the test
Docker engine and on the cluster. Two servers share the output folder
(replicas); one is restarted between the run and its reads.

On the cluster the runner holds the bytes in its pod and the server fetches
them through the API server, past the container log, which the kubelet
rotates at 10 MiB (the test cluster keeps that default on purpose).
"""

import base64
import hashlib
import os
import pathlib
import tempfile

import anyio
import pytest
from mcp.client import Client
from mcp.client.sse import sse_client
from mcp.shared.exceptions import MCPError

from conftest import REPO, HttpServer, cluster_env

BUSYBOX = "mcp-k8s-test.local/busybox:1.35"
# The default piece: a 1 MiB piece is 1.4 MB in base64, over the SDK's
# 1 MiB limit for an event, and an answer that takes over a second is sent
# as an event (a loaded machine's reads can).
PIECE = 512 << 10
# The last number `seq` writes (`seq 1 6500000` writes 50,888,896 bytes;
# Python writes the same here) and the file's size.
SIZES = (6_500_000, 30_000_000)


def expected_stdout_hash(last: int) -> tuple[str, int]:
    digest = hashlib.sha256()
    size = 0
    for start in range(1, last + 1, 100_000):
        chunk = "".join(f"{number}\n" for number in range(start, min(start + 100_000, last + 1))).encode()
        digest.update(chunk)
        size += len(chunk)
    return digest.hexdigest(), size


def docker_env() -> dict[str, str]:
    runner = REPO / "target" / "x86_64-unknown-linux-musl" / "release" / "mcp-k8s-ephemeral-job"
    if not runner.is_file():
        pytest.fail(f"no static runner at {runner}: run tests/build-project-image")
    host = os.environ.get("DOCKER_HOST") or "unix:///var/lib/mcp-k8s-test-docker/docker.sock"
    if not pathlib.Path(host.removeprefix("unix://")).exists():
        pytest.fail(f"no test Docker engine at {host}: run tests/docker/up")
    return {
        "MCP_K8S_BACKEND": "docker",
        "MCP_K8S_DOCKER_HOST": host,
        "MCP_K8S_RUNNER_BINARY": str(runner),
        "MCP_K8S_ALLOWED_IMAGES": BUSYBOX,
        "MCP_K8S_DEFAULT_CPU": "500m",
        "MCP_K8S_DEFAULT_MEMORY": "64Mi",
    }


def backend_env(backend: str, outputs: str) -> dict[str, str]:
    env = cluster_env() if backend == "kubernetes" else docker_env()
    # 256 KiB of each stream and of files inline: the SDK refuses a
    # server-sent event over 1 MiB, and a result carries its JSON twice
    # (structured, text).
    return {**env, "MCP_K8S_OUTPUTS_DIR": outputs, "MCP_K8S_MAX_OUTPUT_BYTES": "262144", "MCP_K8S_MAX_ARTIFACT_BYTES": "262144"}


async def read_whole(client: Client, uri: str) -> tuple[str, int, int]:
    """Pages through a stored output by explicit ranges; returns its
    SHA-256, its size and the number of pieces."""
    digest = hashlib.sha256()
    offset, pieces, size = 0, 0, None
    while size is None or offset < size:
        result = await client.read_resource(f"{uri}?offset={offset}")
        content = result.contents[0]
        data = content.text.encode() if hasattr(content, "text") else base64.b64decode(content.blob)
        meta = content.meta or {}
        assert meta["offset"] == offset and len(data) == meta["length"] <= PIECE, meta
        size = meta["size"]
        digest.update(data)
        offset += len(data)
        pieces += 1
    return digest.hexdigest(), offset, pieces


@pytest.mark.parametrize("backend", ["kubernetes", "docker"])
def test_a_large_stdout_and_file_read_back_in_ranges(backend):
    last, file_bytes = SIZES
    stdout_hash, stdout_size = expected_stdout_hash(last)
    with tempfile.TemporaryDirectory(prefix="mcp-outputs-") as outputs:
        env = backend_env(backend, outputs)
        first, second = HttpServer(env), HttpServer(env)
        try:
            anyio.run(scenario, first, second, env, (last, stdout_hash, stdout_size), file_bytes)
        finally:
            first.stop()
            second.stop()


async def scenario(first: HttpServer, second: HttpServer, env: dict, stdout: tuple[int, str, int], file_bytes: int):
    last, stdout_hash, stdout_size = stdout
    script = f"seq 1 {last}; head -c {file_bytes} /dev/urandom > big.bin; sha256sum big.bin >&2"
    arguments = {
        "image": BUSYBOX,
        "command": ["sh", "-c", script],
        "limits": {"memory": "256Mi"},
        "timeout_s": 300,
        "network": "none",
    }
    async with Client(f"{first.base}/mcp", read_timeout_seconds=600) as client:
        result = await client.call_tool("run_job", arguments)
    assert result.is_error is False, result
    out = result.structured_content
    assert out["status"] == "succeeded", (out["reason"], out["message"], out["notes"], out["links"])
    assert out["truncated"]["stdout"] is True and out["stdout_total_bytes"] == stdout_size, out["truncated"]
    links = {link["name"]: link for link in out["links"]}
    assert links["stdout"]["size"] == stdout_size and links["stdout"]["complete"] is True, links
    assert links["big.bin"]["size"] == file_bytes and links["big.bin"]["complete"] is True, links
    blocks = [block for block in result.content if block.type == "resource_link"]
    assert {block.name: block.size for block in blocks} == {"stdout": stdout_size, "big.bin": file_bytes}
    file_hash = out["stderr"].split()[0]

    # The other replica reads the stdout; the first, restarted, the file.
    async with Client(f"{second.base}/mcp") as client:
        assert await read_whole(client, links["stdout"]["uri"]) == (stdout_hash, stdout_size, -(-stdout_size // PIECE))
        templates = await client.list_resource_templates()
        assert any(template.uri_template.startswith("job://{run_id}/stdout") for template in templates.resource_templates)
        modern = (await client.read_resource(f"{links['big.bin']['uri']}?offset=5")).contents[0]
    # The handshake era, over Streamable HTTP and over legacy SSE, reads
    # the same piece.
    for transport in (f"{second.base}/mcp", sse_client(f"{second.base}/sse")):
        async with Client(transport, mode="legacy") as client:
            piece = (await client.read_resource(f"{links['big.bin']['uri']}?offset=5")).contents[0]
            assert piece.blob == modern.blob and piece.meta["offset"] == 5
    first.stop()
    restarted = HttpServer(env)
    try:
        async with Client(f"{restarted.base}/mcp") as client:
            assert await read_whole(client, links["big.bin"]["uri"]) == (file_hash, file_bytes, -(-file_bytes // PIECE))
            guessed = links["stdout"]["uri"].replace(out["run_id"], "0123456789abcdef0123456789abcdef")
            with pytest.raises(MCPError, match="no stored output"):
                await client.read_resource(guessed)
    finally:
        restarted.stop()
