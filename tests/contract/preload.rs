//! A warm pool of a language profile with `preload` (included by the
//! Docker and the Kubernetes tiers as their `preload` module): its
//! sandboxes start Python ahead with the profile's modules imported, and an
//! `execute_code` call that takes one runs as a cold call does: the same
//! status, exit code, stdout and stderr for a table of programs
//! (tracebacks, a syntax error, argv and globals, stdin, exit codes, a
//! name never imported), each call taking a sandbox of the pool (its hit
//! count), and the preloaded modules there (`sys.modules`) where the cold
//! call has none of them.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::BACKEND;
use super::harness::{PYTHON, Server};

const MODULES: [&str; 5] = ["asyncio", "email", "http.client", "json", "decimal"];

/// Programs whose results must not tell a pre-started Python from a cold one.
const PROGRAMS: &[(&str, &str)] = &[
    ("an exception's traceback", "def f():\n    raise ValueError('boom')\n\nf()\n"),
    ("a syntax error", "x = (\n"),
    (
        "argv, path and globals",
        "import os, sys\nprint(sys.argv, sys.path[0] == os.getcwd(), __file__, __name__, __doc__)\nprint(sorted(globals()))\n",
    ),
    ("stdin at its end", "import sys\nprint(repr(sys.stdin.read()))\n"),
    ("streams apart and an exit code", "import sys\nprint('out')\nprint('err', file=sys.stderr)\nsys.exit(3)\n"),
    ("a name never imported", "print(os.getcwd())\n"),
    ("SystemExit with a text", "raise SystemExit('bye')\n"),
];

/// What one call came to, as compared.
fn outcome(result: &Value) -> Value {
    let out = &result["structuredContent"];
    json!([out["status"], out["exit_code"], out["stdout"], out["stderr"]])
}

/// The languages and pools files, in a folder of their own.
struct Files {
    dir: super::support::TempDir,
    pool: String,
}

impl Files {
    fn new() -> Files {
        let dir = super::support::TempDir::new("preload");
        let pool = format!("py{}", std::process::id());
        let languages = json!({"python": {"image": PYTHON, "cpu": "500m", "memory": "128Mi", "preload": MODULES}});
        std::fs::write(dir.path.join("languages.json"), languages.to_string()).unwrap();
        let pools = json!([{"name": pool, "language": "python", "network": "none", "size": 1, "max_idle_s": 300}]);
        std::fs::write(dir.path.join("pools.json"), pools.to_string()).unwrap();
        Files { dir, pool }
    }

    fn path(&self, name: &str) -> String {
        self.dir.path.join(name).display().to_string()
    }
}

/// The pool's `describe_environment` view.
fn pool_view(server: &mut Server, pool: &str) -> Value {
    let described = server.ok("describe_environment", json!({}));
    let pools = described["warm_pools"].as_array().cloned().unwrap_or_default();
    pools.into_iter().find(|view| view["name"] == pool).unwrap_or_else(|| panic!("no pool {pool}: {described}"))
}

/// Until the pool has a ready sandbox; its hit count then.
fn await_ready(server: &mut Server, pool: &str) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(150);
    loop {
        let view = pool_view(server, pool);
        if view["ready"].as_u64() >= Some(1) {
            return view["hits"].as_u64().unwrap_or_default();
        }
        assert!(Instant::now() < deadline, "the pool never got a ready sandbox: {view}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn execute(server: &mut Server, code: &str) -> Value {
    server.call("execute_code", json!({"language": "python", "entrypoint_code": code})).result
}

#[test]
fn a_preloaded_python_runs_every_program_as_a_cold_one() {
    let files = Files::new();
    let languages = files.path("languages.json");
    let pools = files.path("pools.json");
    let base = [("MCP_K8S_LANGUAGES", languages.as_str()), ("MCP_K8S_NETWORK_DEFAULT", "none")];
    let mut cold = Server::start(BACKEND, &base);
    let mut warm = Server::start(BACKEND, &[base[0], base[1], ("MCP_K8S_WARM_POOLS", pools.as_str())]);
    warm.stdio.stop_gently = true;

    let probe = format!("import sys\nprint([name in sys.modules for name in {MODULES:?}])\n");
    let before = await_ready(&mut warm, &files.pool);
    let preloaded = execute(&mut warm, &probe);
    assert_eq!(pool_view(&mut warm, &files.pool)["hits"].as_u64(), Some(before + 1), "not warm: {preloaded}");
    assert_eq!(preloaded["structuredContent"]["stdout"], "[True, True, True, True, True]\n", "{preloaded}");
    let plain = execute(&mut cold, &probe);
    assert_eq!(plain["structuredContent"]["stdout"], "[False, False, False, False, False]\n", "{plain}");

    for (what, code) in PROGRAMS {
        let before = await_ready(&mut warm, &files.pool);
        let warm_result = execute(&mut warm, code);
        assert_eq!(pool_view(&mut warm, &files.pool)["hits"].as_u64(), Some(before + 1), "{what}: not warm: {warm_result}");
        let cold_result = execute(&mut cold, code);
        assert_eq!(outcome(&warm_result), outcome(&cold_result), "{what}: warm {warm_result}\ncold {cold_result}");
    }
}
