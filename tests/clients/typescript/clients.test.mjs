// The official TypeScript SDK (1.x) lists and calls tools over stdio and
// Streamable HTTP. The binary comes from $MCP_K8S_BIN, else target/debug.

import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";
import path from "node:path";
import fs from "node:fs";
import os from "node:os";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

const repo = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../../..");
const binary = process.env.MCP_K8S_BIN || path.join(repo, "target/debug/mcp-k8s-ephemeral-job");

let httpServer;
let httpUrl;

/** Starts the binary on an ephemeral port; resolves with its base URL. */
function startHttpServer() {
  return new Promise((resolve, reject) => {
    const child = spawn(binary, [], {
      // No backend: MCP_K8S_LAZY_BACKEND lets it serve anyway.
      env: { MCP_K8S_TRANSPORT: "http", MCP_K8S_ADDR: "127.0.0.1:0", MCP_K8S_TEST_TOOLS: "1", MCP_K8S_LAZY_BACKEND: "1" },
      stdio: ["ignore", "ignore", "pipe"],
    });
    child.on("error", reject);
    const timer = setTimeout(() => reject(new Error("no `listening` log line within 10 s")), 10_000);
    createInterface({ input: child.stderr }).on("line", (line) => {
      const entry = JSON.parse(line);
      if (entry.msg === "listening") {
        clearTimeout(timer);
        resolve({ child, url: `http://${entry.addr}/mcp` });
      }
    });
  });
}

before(async () => {
  ({ child: httpServer, url: httpUrl } = await startHttpServer());
});

after(() => {
  httpServer?.kill("SIGTERM");
});

const transports = {
  stdio: () =>
    new StdioClientTransport({ command: binary, args: [], env: { MCP_K8S_TEST_TOOLS: "1", MCP_K8S_LAZY_BACKEND: "1" }, stderr: "ignore" }),
  "streamable-http": () => new StreamableHTTPClientTransport(new URL(httpUrl)),
};

for (const [name, makeTransport] of Object.entries(transports)) {
  test(`${name}: list tools and call one`, async () => {
    const client = new Client({ name: "ts-sdk-test", version: "1.0.0" });
    await client.connect(makeTransport());
    try {
      assert.equal(client.getServerVersion().name, "mcp-k8s-ephemeral-job");
      const { tools } = await client.listTools();
      const names = tools.map((tool) => tool.name);
      assert.ok(names.includes("describe_environment"), names.join(","));
      const result = await client.callTool({ name: "describe_environment", arguments: {} });
      assert.equal(result.isError, false);
      assert.equal(result.structuredContent.namespace, "mcp-ephemeral");
      assert.deepEqual(JSON.parse(result.content[0].text), result.structuredContent);
    } finally {
      await client.close();
    }
  });

  test(`${name}: progress and a bad-argument tool error`, async () => {
    const client = new Client({ name: "ts-sdk-test", version: "1.0.0" });
    await client.connect(makeTransport());
    try {
      const progress = [];
      const result = await client.callTool(
        { name: "test_sleep", arguments: { seconds: 0.3, progress_every_ms: 100 } },
        undefined,
        { onprogress: (update) => progress.push(update.progress) },
      );
      assert.deepEqual(result.structuredContent, { slept_ms: 300 });
      // The SDK handles notifications a microtask after responses, so a
      // progress notification read in the same chunk as the response can be
      // dropped (seen over stdio): the last one is not asserted.
      assert.deepEqual(progress.slice(0, 2), [100, 200]);
      const bad = await client.callTool({ name: "test_sleep", arguments: { seconds: "soon" } });
      assert.equal(bad.isError, true);
      assert.equal(bad.content[0].text, "argument `seconds` must be a number, not a string");
    } finally {
      await client.close();
    }
  });
}

// The SDK's request timeout (60 s by default, and the
// Inspector's) is its own clock, not the socket's: keepalive comments do not
// reset it, only progress notifications do, and only with
// `resetTimeoutOnProgress`. Shown with a 3 s timeout and a 6 s call.
test("streamable-http: progress resets the request timeout only when asked", async () => {
  const client = new Client({ name: "ts-sdk-test", version: "1.0.0" });
  await client.connect(transports["streamable-http"]());
  try {
    const call = { name: "test_sleep", arguments: { seconds: 6, progress_every_ms: 1000 } };
    const progress = [];
    const result = await client.callTool(call, undefined, {
      timeout: 3000,
      resetTimeoutOnProgress: true,
      onprogress: (update) => progress.push(update.progress),
    });
    assert.deepEqual(result.structuredContent, { slept_ms: 6000 });
    assert.ok(progress.length >= 4, `progress: ${progress}`);
    await assert.rejects(client.callTool(call, undefined, { timeout: 3000 }), (error) => error.code === -32001);
  } finally {
    await client.close();
  }
});

// execute_code: isolator's tool through the real SDK. A bad call
// needs no cluster; the runs use the test cluster when `tests/cluster/up`
// has left one, and are reported as skipped (LEFT OUT) otherwise.
const clusterDir = process.env.MCP_K8S_TEST_CLUSTER_DIR || "/var/lib/mcp-k8s-test-cluster";
const projectImage = process.env.MCP_K8S_PROJECT_IMAGE || "mcp-k8s-test.local/mcp-k8s-ephemeral-job:dev";

test("stdio: execute_code without code is an isError result", async () => {
  const client = new Client({ name: "ts-sdk-test", version: "1.0.0" });
  await client.connect(transports.stdio());
  try {
    const result = await client.callTool({ name: "execute_code", arguments: { entrypoint_code: "print(1)" } });
    assert.equal(result.isError, true);
    assert.equal(result.structuredContent, undefined);
    assert.match(result.content[0].text, /^`entrypoint_code` needs `language`/);
  } finally {
    await client.close();
  }
});

const kubeconfig = path.join(clusterDir, "server.kubeconfig");
const haveCluster = fs.existsSync(kubeconfig);
test(
  "stdio: execute_code hello world and a failing run on the cluster",
  { skip: haveCluster ? false : `LEFT OUT: no test cluster at ${clusterDir} (run tests/cluster/up)` },
  async () => {
    const languagesFile = path.join(os.tmpdir(), `mcp-ts-languages-${process.pid}.json`);
    fs.writeFileSync(languagesFile, JSON.stringify({ python: { image: "mcp-k8s-test.local/python:3.11", cpu: "500m", memory: "128Mi" } }));
    const env = {
      MCP_K8S_KUBECONFIG: kubeconfig,
      MCP_K8S_RUNNER_IMAGE: projectImage,
      MCP_K8S_LANGUAGES: languagesFile,
      MCP_K8S_DEFAULT_CPU: "50m",
      MCP_K8S_DEFAULT_MEMORY: "64Mi",
    };
    const client = new Client({ name: "ts-sdk-test", version: "1.0.0" });
    await client.connect(new StdioClientTransport({ command: binary, args: [], env, stderr: "ignore" }));
    try {
      const hello = await client.callTool({ name: "execute_code", arguments: { language: "python", entrypoint_code: "print('hello, world')" } }, undefined, { timeout: 120_000 });
      assert.equal(hello.isError, false);
      assert.equal(hello.content[0].text, "--- stdout ---\nhello, world\n\n--- stderr ---\n");
      assert.equal(hello.structuredContent.status, "succeeded");
      // isError with structuredContent (the run result): the SDK accepts it.
      const failed = await client.callTool({ name: "execute_code", arguments: { language: "python", entrypoint_code: "import sys\nsys.exit(3)" } }, undefined, { timeout: 120_000 });
      assert.equal(failed.isError, true);
      assert.match(failed.content[0].text, /^Execution Failed \(error\): /);
      assert.equal(failed.structuredContent.exit_code, 3);
    } finally {
      await client.close();
      fs.rmSync(languagesFile, { force: true });
    }
  },
);

// For real runs: a command that prints nothing still
// resets a progress-reset timeout, because run_job reports "still running"
// every 5 s. A 9 s timeout and a 20 s silent command.
test(
  "stdio: a silent run_job keeps a timeout reset by progress alive",
  { skip: haveCluster ? false : `LEFT OUT: no test cluster at ${clusterDir} (run tests/cluster/up)` },
  async () => {
    const env = {
      MCP_K8S_KUBECONFIG: kubeconfig,
      MCP_K8S_RUNNER_IMAGE: projectImage,
      MCP_K8S_ALLOWED_IMAGES: "mcp-k8s-test.local/busybox:1.35",
      MCP_K8S_DEFAULT_CPU: "50m",
      MCP_K8S_DEFAULT_MEMORY: "64Mi",
    };
    const client = new Client({ name: "ts-sdk-test", version: "1.0.0" });
    await client.connect(new StdioClientTransport({ command: binary, args: [], env, stderr: "ignore" }));
    try {
      const messages = [];
      const result = await client.callTool(
        { name: "run_job", arguments: { image: "mcp-k8s-test.local/busybox:1.35", command: ["sleep", "20"] } },
        undefined,
        { timeout: 9000, resetTimeoutOnProgress: true, onprogress: (update) => messages.push(update.message) },
      );
      assert.equal(result.structuredContent.status, "succeeded", JSON.stringify(result.structuredContent));
      const beats = messages.filter((message) => /^still running after \d+ s$/.test(message));
      assert.ok(beats.length >= 3, `progress messages: ${JSON.stringify(messages)}`);
    } finally {
      await client.close();
    }
  },
);
