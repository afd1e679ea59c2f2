//! The fenced blocks of README.md and docs/*.md, and what is done with each
//! (`RULES`): the offline tier's `docs_commands.rs` checks every block by
//! its kind and runs the ones that need nothing; the tiers that have what
//! the rest need (`with_tools`: the tools built from source; `on_cluster`:
//! the test cluster) run theirs through `run_in_tier`, with the edits their
//! rule declares. Knows nothing of how a tier gets what it needs.

use std::path::Path;
use std::process::{Command, Stdio};

pub const BIN_NAME: &str = "mcp-k8s-ephemeral-job";

/// How one block is checked, beyond what its tag implies.
pub enum Check {
    /// `sh`: the static checks only; the rule's `why` says why it is not run.
    Static,
    /// `sh`: the static checks only, because scripts of the suite run the
    /// same commands: each `(script, line)` of `lines` is one of that
    /// script's lines, so the two cannot drift apart without a failure.
    RunBy { lines: &'static [(&'static str, &'static str)] },
    /// `sh`: the static checks, then run offline by `bash -e -o pipefail`
    /// with only these variables and a `PATH` that starts with the built
    /// binary's directory; its stdout must pass `stdout`.
    Run { env: &'static [(&'static str, &'static str)], stdout: fn(&str) -> Result<(), String> },
    /// `sh`: the static checks offline, then run in `tier` (by its
    /// `docs_blocks.rs`) after `edits`, by `bash -e -o pipefail`; its
    /// stdout must pass `stdout`.
    InTier { tier: Tier, edits: &'static [Edit], stdout: fn(&str) -> Result<(), String> },
    /// Untagged: text that is no command and no document.
    Text,
    /// `json`: object members without their braces; parses once wrapped in `{}`.
    JsonMembers,
}

/// The test tiers that run blocks the offline tier cannot.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Tier {
    /// helm and kubectl from `tests/cluster/build-helm` and `build-kube`,
    /// and the static build of `tests/build-project-image`.
    WithTools,
    /// The test cluster of `tests/cluster/up`, as its admin.
    OnCluster,
}

/// One change to a block before a tier runs it. Each is visible here, in the
/// rule; the variables they use (`$DOCS_*`) are set by `run_in_tier`.
pub enum Edit {
    /// Every occurrence of `from` (which must occur) becomes `to`.
    Replace { from: &'static str, to: &'static str },
    /// Only the lines that contain one of these run (a block that lists
    /// alternatives, one per way of installing).
    OnlyLinesWith(&'static [&'static str]),
    /// The line that starts with `line_start` serves until stopped: it is
    /// started in the background, the block waits for `ready` in its
    /// output (stdout and stderr), runs `then`, and stops it.
    Serve { line_start: &'static str, ready: &'static str, then: &'static str },
    /// The block's standard input (a stdio server's messages; it stops at
    /// their end).
    Stdin(&'static str),
    /// Commands run after the block (a check of what it did).
    Append(&'static str),
    /// Run in a temporary directory that links to these directories of the
    /// checkout, so what the block writes there stays out of the checkout.
    InScratchDir(&'static [&'static str]),
}

pub struct Rule {
    pub file: &'static str,
    /// How the block's first line starts (without the block's
    /// indentation); it names one block of the file.
    pub first_line_start: &'static str,
    pub check: Check,
    pub why: &'static str,
}

/// The MCP `initialize` request, as one line.
const INITIALIZE: &str = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"docs","version":"1"}}}"#;

pub const RULES: &[Rule] = &[
    rule("README.md", "./demo ", Check::RunBy { lines: &[(".ci/run", "./demo"), (".ci/run", "tests/run-all")] }, "run by .ci/run itself"),
    rule("README.md", "cargo test --lib --test offline", RUN_ALL_RUNS_THE_OFFLINE_TIER, OFFLINE_TIER_WHY),
    rule("README.md", "agent ──MCP (stdio", Check::Text, "a diagram"),
    rule(
        "README.md",
        "./install ",
        Check::InTier {
            tier: Tier::WithTools,
            edits: &[
                // Not the host's /usr/local: a prefix of the test's own.
                Edit::Replace { from: "./install                      #", to: "./install --prefix \"$DOCS_TMP/usr/local\" #" },
                Edit::Append("\"$DOCS_TMP/usr/local/bin/mcp-k8s-ephemeral-job\" --version\n~/.local/bin/mcp-k8s-ephemeral-job --version\n"),
            ],
            stdout: two_installs,
        },
        "the static release build, installed under a temporary prefix and HOME",
    ),
    rule("README.md", "mcp-k8s-ephemeral-job --version", Check::Run { env: &[], stdout: version_and_help }, "prints and exits"),
    rule(
        "README.md",
        "claude mcp add ",
        Check::InTier {
            tier: Tier::WithTools,
            edits: &[
                // The static build (the one ./install puts there), and a
                // scratch directory: the entry is written for it, in $HOME.
                Edit::Replace { from: "/usr/local/bin/mcp-k8s-ephemeral-job", to: "\"$DOCS_BIN\"" },
                Edit::InScratchDir(&[]),
                // Claude Code starts the entry's server and asks it over MCP.
                Edit::Append("claude mcp list\n"),
            ],
            stdout: claude_code_connected,
        },
        "Claude Code's CLI from npm (tests/clients/install-claude-code), with a temporary HOME, against the test Docker engine",
    ),
    rule(
        "README.md",
        "export MCP_K8S_AUTH_TOKEN=",
        Check::InTier {
            tier: Tier::OnCluster,
            edits: &[
                Edit::Replace { from: "127.0.0.1:8080", to: "127.0.0.1:$DOCS_PORT" },
                Edit::Serve {
                    line_start: "MCP_K8S_TRANSPORT=http ",
                    ready: r#""msg":"listening""#,
                    then: r#"curl -sS -o /dev/null -w '%{http_code}\n' -X POST -H 'Content-Type: application/json' -H 'Accept: application/json, text/event-stream' --data "$DOCS_INITIALIZE" "http://127.0.0.1:$DOCS_PORT/mcp"
curl -fsS -X POST -H "Authorization: Bearer $MCP_K8S_AUTH_TOKEN" -H 'Content-Type: application/json' -H 'Accept: application/json, text/event-stream' --data "$DOCS_INITIALIZE" "http://127.0.0.1:$DOCS_PORT/mcp""#,
                },
            ],
            stdout: refused_then_initialized,
        },
        "serves until stopped: a free port, in the background until two requests answered",
    ),
    rule("docs/architecture.md", "agent ──MCP (stdio", Check::Text, "a diagram"),
    rule("docs/architecture.md", "agent ──MCP──▶ protocol", Check::Text, "a diagram"),
    rule(
        "docs/callers.md",
        "printf %s \"$TOKEN\" | sha256sum",
        Check::Run { env: &[("TOKEN", "test")], stdout: digest_of_test },
        "coreutils",
    ),
    rule(
        "docs/deploy.md",
        "docker build ",
        Check::InTier { tier: Tier::OnCluster, edits: KUSTOMIZE_REGISTRY_AND_NAMESPACES, stdout: anything },
        "the kustomize way as written: built with the test Docker engine, pushed to a registry of the test's own, applied from a copy of deploy/ edited as the block's comment says",
    ),
    rule(
        "docs/deploy.md",
        "# the two namespaces",
        Check::InTier { tier: Tier::OnCluster, edits: HELM_NAMESPACES_AND_IMAGE, stdout: anything },
        "the chart installed as written, into two namespaces of the test's own and with the test cluster's images",
    ),
    rule(
        "docs/deploy.md",
        "kubectl -n mcp-system rollout status",
        Check::InTier {
            tier: Tier::OnCluster,
            edits: &[Edit::Replace { from: "mcp-system", to: "$DOCS_SERVER_NAMESPACE" }],
            stdout: doctor_passes,
        },
        "after the chart's install, and after kustomize's",
    ),
    rule(
        "docs/deploy.md",
        "helm test ",
        Check::InTier {
            tier: Tier::OnCluster,
            edits: &[Edit::Replace { from: "mcp-system", to: "$DOCS_SERVER_NAMESPACE" }],
            stdout: helm_test_passes,
        },
        "after the chart's install",
    ),
    rule(
        "docs/deploy.md",
        "cp -r examples/renamed-namespaces",
        Check::InTier {
            tier: Tier::WithTools,
            edits: &[
                Edit::InScratchDir(&["deploy", "examples"]),
                Edit::OnlyLinesWith(&["cp -r ", "sed -i ", "kubectl kustomize "]),
                // `grep -c` exits 1 when it counts 0, the answer the block wants.
                Edit::Replace { from: "grep -c 'mcp-system\\|mcp-ephemeral$'", to: "{ grep -c 'mcp-system\\|mcp-ephemeral$' || true; }" },
            ],
            stdout: zero,
        },
        "the overlay copied and rendered by the cache's kubectl; its apply (and delete -k) is not run: it would rebind deploy/'s ClusterRole, which the test cluster's other tests use",
    ),
    rule(
        "docs/deploy.md",
        "kubectl delete -k deploy/",
        Check::InTier {
            tier: Tier::OnCluster,
            edits: &[Edit::Replace { from: "-k deploy/", to: "-k \"$DOCS_DEPLOY\"" }],
            stdout: anything,
        },
        "after the kustomize way's install: the test's edited copy of deploy/",
    ),
    rule(
        "docs/deploy.md",
        "helm uninstall ",
        Check::InTier {
            tier: Tier::OnCluster,
            edits: &[
                Edit::Replace { from: "mcp-system", to: "$DOCS_SERVER_NAMESPACE" },
                Edit::Replace { from: "mcp-ephemeral", to: "$DOCS_JOBS_NAMESPACE" },
            ],
            stdout: anything,
        },
        "after the chart's install",
    ),
    rule(
        "docs/deploy.md",
        "apt-get install ",
        Check::RunBy {
            lines: &[
                ("tests/build-arm64", "ensure_packages musl-tools gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user-static file"),
                ("tests/run-all", "tests/build-arm64 --load"),
            ],
        },
        "tests/build-arm64 installs the same packages and targets (offline docs_commands:: compares them) and run-all runs it; the skopeo push needs a registry",
    ),
    rule("docs/docker.md", "engine ──NewRun──▶", Check::Text, "a diagram"),
    rule(
        "docs/docker.md",
        "tests/podman/up ",
        Check::Static,
        "installs podman as root and runs the on_docker tier a second time (about 4 min): it passes by hand (112 tests, twice) and is not a tier of tests/run-all until a whole .ci/run has run it",
    ),
    rule("docs/large-outputs.md", "\"links\": [", Check::JsonMembers, "one member of a result"),
    rule("docs/large-outputs.md", "$MCP_K8S_OUTPUTS_DIR/", Check::Text, "a directory tree"),
    rule("docs/sandboxes.md", "open_sandbox {", Check::Text, "tool calls in short form"),
    rule("docs/testing.md", "cargo test --lib --test offline", RUN_ALL_RUNS_THE_OFFLINE_TIER, OFFLINE_TIER_WHY),
    rule(
        "docs/testing.md",
        "tests/clients/setup",
        Check::RunBy {
            lines: &[
                ("tests/run-all", "tests/clients/setup"),
                ("tests/run-all", "tests/clients/run"),
                ("tests/clients/run", "\"$here/conformance/score\" docker"),
            ],
        },
        "tests/run-all runs the setup, then tests/clients/run, which scores the conformance suite on Docker (and on the cluster)",
    ),
    rule("docs/traces.md", "client's span ", Check::Text, "a tree of spans"),
    rule(
        "docs/traces.md",
        "MCP_K8S_OTLP_ENDPOINT=",
        Check::InTier { tier: Tier::OnCluster, edits: &[Edit::Stdin(INITIALIZE)], stdout: initialized },
        "serves stdio until its input ends: given an initialize request (the on_docker trace test checks the spans)",
    ),
];

/// The README's and docs/testing.md's offline loop.
const RUN_ALL_RUNS_THE_OFFLINE_TIER: Check = Check::RunBy { lines: &[("tests/run-all", "tier --lib --bins --test offline")] };
const OFFLINE_TIER_WHY: &str = "the tier this test is part of (run from here it would recurse); tests/run-all runs it";

/// docs/deploy.md's kustomize way pushes to the test's registry
/// (`$DOCS_REGISTRY`, 127.0.0.1 and a port, reachable from the test Docker
/// engine and the node alike) and applies the test's copy of deploy/
/// (`$DOCS_DEPLOY`), edited as the block's comment tells an operator to
/// (the image's `newName`, `MCP_K8S_ALLOWED_IMAGES`) and renamed to two
/// namespaces of the test's own: the documented ones are the test
/// cluster's other tests'.
const KUSTOMIZE_REGISTRY_AND_NAMESPACES: &[Edit] = &[
    Edit::Replace { from: "registry.example.com", to: "$DOCS_REGISTRY" },
    // Nothing can be pulled here: the builder tests/docker/build-dockerfile
    // assembled from this machine (the Dockerfile's own `BUILDER` argument).
    Edit::Replace { from: "docker build -t", to: "docker build --build-arg \"BUILDER=$DOCS_BUILDER\" -t" },
    Edit::Replace { from: "mcp-system", to: "$DOCS_SERVER_NAMESPACE" },
    Edit::Replace { from: "-k deploy/", to: "-k \"$DOCS_DEPLOY\"" },
];

/// docs/deploy.md's Helm way uses the documented namespaces, which the test
/// cluster's other tests use: the test's own instead, with the same labels.
const HELM_NAMESPACES_AND_IMAGE: &[Edit] = &[
    Edit::Replace {
        from: "kubectl apply -f deploy/namespace.yaml -f deploy/namespace-system.yaml",
        to: "kubectl apply -f <(sed \"s/mcp-ephemeral/$DOCS_JOBS_NAMESPACE/\" deploy/namespace.yaml) -f <(sed \"s/mcp-system/$DOCS_SERVER_NAMESPACE/\" deploy/namespace-system.yaml)",
    },
    Edit::Replace {
        from: "--namespace mcp-system",
        to: "--namespace $DOCS_SERVER_NAMESPACE --set namespaces.server=$DOCS_SERVER_NAMESPACE --set namespaces.jobs=$DOCS_JOBS_NAMESPACE",
    },
    Edit::Replace { from: "-n mcp-system", to: "-n $DOCS_SERVER_NAMESPACE" },
    // The images the test cluster has loaded (tests/build-project-image,
    // tests/cluster/images): it pulls nothing.
    Edit::Replace { from: "'allowedImages={python:3.12-slim,node:22-slim}'", to: "\"allowedImages={$DOCS_ALLOWED_IMAGES}\"" },
    Edit::Replace {
        from: "image.repository=registry.example.com/mcp-k8s-ephemeral-job",
        to: "image.repository=$DOCS_IMAGE_REPOSITORY --set image.tag=$DOCS_IMAGE_TAG",
    },
];

const fn rule(file: &'static str, first_line_start: &'static str, check: Check, why: &'static str) -> Rule {
    Rule { file, first_line_start, check, why }
}

fn zero(stdout: &str) -> Result<(), String> {
    if stdout != "0\n" {
        return Err("expected the count 0 alone".to_string());
    }
    Ok(())
}

fn anything(_stdout: &str) -> Result<(), String> {
    Ok(())
}

fn version_and_help(stdout: &str) -> Result<(), String> {
    let version = format!("{BIN_NAME} {}\n", env!("CARGO_PKG_VERSION"));
    if !stdout.starts_with(&version) || !stdout.contains("\nUsage: ") {
        return Err(format!("expected `{}` then the help text", version.trim_end()));
    }
    Ok(())
}

/// The digest of `test`, the one docs/callers.md's example shows.
fn digest_of_test(stdout: &str) -> Result<(), String> {
    let digest = stdout.strip_suffix('\n').unwrap_or(stdout);
    if digest.len() != 64 || !digest.bytes().all(|byte| byte.is_ascii_hexdigit()) {
        return Err("expected 64 hex digits alone".to_string());
    }
    if digest != "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08" {
        return Err("expected the SHA-256 of `test`".to_string());
    }
    Ok(())
}

/// `claude mcp list` reached the entry's server over MCP.
fn claude_code_connected(stdout: &str) -> Result<(), String> {
    let entry = stdout.lines().find(|line| line.starts_with("k8s-jobs: ")).ok_or("expected the k8s-jobs entry in `claude mcp list`")?;
    if !entry.contains("Connected") || entry.contains("Failed") {
        return Err(format!("expected Claude Code to reach the server: `{entry}`"));
    }
    Ok(())
}

/// Both installs print the version.
fn two_installs(stdout: &str) -> Result<(), String> {
    let version = format!("{BIN_NAME} {}", env!("CARGO_PKG_VERSION"));
    let n_versions = stdout.lines().filter(|line| *line == version).count();
    if n_versions != 2 {
        return Err(format!("expected `{version}` twice, once per installed binary"));
    }
    Ok(())
}

/// The request without the token is refused; with it, answered.
fn refused_then_initialized(stdout: &str) -> Result<(), String> {
    let Some((_, answer)) = stdout.split_once("\n401\n") else { return Err("expected 401 without the token".to_string()) };
    initialized(answer)
}

fn initialized(stdout: &str) -> Result<(), String> {
    if !stdout.contains(r#""id":1"#) || !stdout.contains(r#""serverInfo""#) {
        return Err("expected the answer to initialize".to_string());
    }
    Ok(())
}

/// `helm test --logs` and `doctor` print their checks; none failed.
fn doctor_passes(stdout: &str) -> Result<(), String> {
    if !stdout.lines().any(|line| line == "all checks passed") {
        return Err("expected doctor's `all checks passed`".to_string());
    }
    Ok(())
}

fn helm_test_passes(stdout: &str) -> Result<(), String> {
    if !stdout.lines().any(|line| line.starts_with("Phase:") && line.ends_with("Succeeded")) {
        return Err("expected `helm test` to report the doctor pod Succeeded".to_string());
    }
    Ok(())
}

impl Rule {
    pub fn names(&self, block: &Block) -> bool {
        block.file == self.file && block.first_line().starts_with(self.first_line_start)
    }
}

pub struct Block {
    pub file: String,
    pub line: usize,
    pub tag: String,
    pub text: String,
}

impl Block {
    pub fn first_line(&self) -> &str {
        self.text.lines().next().unwrap_or("")
    }
}

pub fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Every fenced block of README.md and docs/*.md, in order, with the
/// fence's indentation taken off its lines.
pub fn doc_blocks() -> Vec<Block> {
    let mut files = vec!["README.md".to_string()];
    let mut docs: Vec<String> = std::fs::read_dir(root().join("docs"))
        .expect("docs/")
        .map(|entry| entry.expect("docs/ entry").file_name().to_string_lossy().into_owned())
        .filter(|name| name.ends_with(".md"))
        .map(|name| format!("docs/{name}"))
        .collect();
    docs.sort();
    files.extend(docs);
    let mut blocks = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(root().join(&file)).unwrap_or_else(|error| panic!("{file}: {error}"));
        let mut open: Option<(usize, usize, String, Vec<&str>)> = None;
        for (line_idx, line) in text.lines().enumerate() {
            let trimmed = line.trim_start();
            let is_fence = trimmed.starts_with("```");
            match (&mut open, is_fence) {
                (None, true) => open = Some((line_idx + 1, line.len() - trimmed.len(), trimmed[3..].trim().to_string(), Vec::new())),
                (Some(_), true) => {
                    assert_eq!(trimmed, "```", "{file}:{}: a fence inside a block", line_idx + 1);
                    let (line, _, tag, lines) = open.take().expect("an open block");
                    blocks.push(Block { file: file.clone(), line, tag, text: lines.join("\n") + "\n" });
                }
                (Some((_, indent, _, lines)), false) => {
                    let n_spaces = line.len() - line.trim_start_matches(' ').len();
                    lines.push(&line[n_spaces.min(*indent)..]);
                }
                (None, false) => {}
            }
        }
        assert!(open.is_none(), "{file}: a block is never closed");
    }
    blocks
}

/// The rule of `file` whose first line starts with `first_line_start`, and
/// its one block.
pub fn rule_and_block(file: &str, first_line_start: &str) -> (&'static Rule, Block) {
    let rule = RULES
        .iter()
        .find(|rule| rule.file == file && rule.first_line_start == first_line_start)
        .unwrap_or_else(|| panic!("no rule in RULES (tests/support/docs.rs) for {file} `{first_line_start}`"));
    let mut blocks: Vec<Block> = doc_blocks().into_iter().filter(|block| rule.names(block)).collect();
    assert_eq!(blocks.len(), 1, "blocks of {file} that start with `{first_line_start}`");
    (rule, blocks.remove(0))
}

/// The block's text after the edits, and its standard input; fails when an
/// edit no longer fits the block (what it replaces or picks is gone).
pub fn edited(text: &str, edits: &[Edit]) -> Result<Edited, String> {
    let mut text = text.to_string();
    let mut stdin = None;
    let mut scratch_links: Option<&'static [&'static str]> = None;
    for edit in edits {
        match edit {
            Edit::Replace { from, to } => {
                if !text.contains(from) {
                    return Err(format!("edit: `{from}` is not in the block"));
                }
                text = text.replace(from, to);
            }
            Edit::OnlyLinesWith(needles) => {
                let kept: Vec<&str> = text.lines().filter(|line| needles.iter().any(|needle| line.contains(needle))).collect();
                if kept.len() != needles.len() {
                    return Err(format!("edit: expected one line with each of {needles:?}, kept {kept:?}"));
                }
                text = kept.join("\n") + "\n";
            }
            Edit::Serve { line_start, ready, then } => {
                let lines: Vec<&str> = text.lines().collect();
                let Some(line_idx) = lines.iter().position(|line| line.starts_with(line_start)) else {
                    return Err(format!("edit: no line starts with `{line_start}`"));
                };
                text = format!("{}\n{}\n", lines[..line_idx].join("\n"), serve_in_background(lines[line_idx], ready, then))
                    + &lines[line_idx + 1..].iter().map(|line| format!("{line}\n")).collect::<String>();
            }
            Edit::Stdin(input) => stdin = Some(*input),
            Edit::Append(commands) => text.push_str(commands),
            Edit::InScratchDir(links) => scratch_links = Some(links),
        }
    }
    Ok(Edited { text, stdin, scratch_links })
}

/// A block after its edits.
pub struct Edited {
    pub text: String,
    pub stdin: Option<&'static str>,
    /// The checkout's directories a scratch directory links to; `None`:
    /// the block runs in the checkout.
    pub scratch_links: Option<&'static [&'static str]>,
}

/// A server's command line as a coprocess (the server itself, by `exec`,
/// so that stopping it stops the server), waited on until `ready` shows in
/// its output; stopped when the block ends, however it ends.
fn serve_in_background(line: &str, ready: &str, then: &str) -> String {
    let words: Vec<&str> = line.split(' ').collect();
    let n_assignments = words.iter().take_while(|word| word.contains('=') && !word.starts_with('-')).count();
    let command = format!("{} exec {}", words[..n_assignments].join(" "), words[n_assignments..].join(" "));
    let ready = ready.replace('\'', r"'\''");
    format!(
        "coproc DOCS_SERVER {{ {command} 2>&1; }}\n\
         trap 'kill \"$DOCS_SERVER_PID\" 2>/dev/null || true' EXIT\n\
         grep -q -m1 -F '{ready}' <&\"${{DOCS_SERVER[0]}}\"\n\
         {then}"
    )
}

/// Runs a shell text by `bash -e -o pipefail` in `cwd`, with only `env`
/// and a `PATH` of the built binary's directory, then `path`, then the
/// system's; its stdout, or why it failed.
pub fn run_shell(text: &str, env: &[(&str, &str)], path: &[&Path], stdin: Option<&str>, cwd: &Path) -> Result<String, String> {
    let binary = Path::new(env!("CARGO_BIN_EXE_mcp-k8s-ephemeral-job"));
    let mut dirs: Vec<String> = vec![binary.parent().expect("the binary's directory").display().to_string()];
    dirs.extend(path.iter().map(|dir| dir.display().to_string()));
    dirs.push("/usr/local/bin:/usr/bin:/bin".to_string());
    let mut child = Command::new("bash")
        .args(["-e", "-o", "pipefail", "-c", text])
        .env_clear()
        .env("PATH", dirs.join(":"))
        .envs(env.iter().copied())
        .current_dir(cwd)
        .stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|error| format!("bash: {error}"))?;
    if let (Some(input), Some(mut pipe)) = (stdin, child.stdin.take()) {
        std::io::Write::write_all(&mut pipe, format!("{input}\n").as_bytes()).map_err(|error| format!("stdin: {error}"))?;
    }
    let output = child.wait_with_output().map_err(|error| format!("bash: {error}"))?;
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    if !output.status.success() {
        return Err(format!("run: {}; stdout: {stdout}\nstderr: {}", output.status, String::from_utf8_lossy(&output.stderr).trim()));
    }
    Ok(stdout)
}

/// Runs one block of `tier` as its rule says: the edits, then
/// `run_shell` with `env` (the tier's `$DOCS_*` and tools) and the
/// initialize request as `$DOCS_INITIALIZE`, then the rule's stdout check.
pub fn run_in_tier(tier: Tier, rule: &Rule, block: &Block, env: &[(&str, &str)], path: &[&Path]) -> Result<String, String> {
    let Check::InTier { tier: rule_tier, edits, stdout: check_stdout } = &rule.check else {
        return Err(format!("{} `{}` is not run in a tier", rule.file, rule.first_line_start));
    };
    assert_eq!(*rule_tier, tier, "{} `{}` is run in another tier", rule.file, rule.first_line_start);
    let Edited { text, stdin, scratch_links } = edited(&block.text, edits)?;
    let mut env = env.to_vec();
    env.push(("DOCS_INITIALIZE", INITIALIZE));
    let scratch = super::TempDir::new("docs-scratch");
    for link in scratch_links.unwrap_or_default() {
        std::os::unix::fs::symlink(root().join(link), scratch.path.join(link)).expect("a link in the scratch directory");
    }
    let cwd = if scratch_links.is_some() { &scratch.path } else { root() };
    let stdout =
        run_shell(&text, &env, path, stdin, cwd).map_err(|error| format!("{}:{}: {error}\nrun:\n{text}", block.file, block.line))?;
    check_stdout(&stdout).map_err(|error| format!("{}:{}: {error}; stdout: {stdout}", block.file, block.line))?;
    Ok(stdout)
}

/// The rules run in `tier`, as `(file, first_line_start)`.
pub fn rules_of(tier: Tier) -> Vec<(&'static str, &'static str)> {
    RULES
        .iter()
        .filter(|rule| matches!(rule.check, Check::InTier { tier: rule_tier, .. } if rule_tier == tier))
        .map(|rule| (rule.file, rule.first_line_start))
        .collect()
}
