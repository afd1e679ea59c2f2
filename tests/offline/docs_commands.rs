//! Every fenced block of README.md and docs/*.md is checked by its kind, so
//! a recipe that stops working fails here rather than in a user's first
//! hour: `json` blocks parse as JSON, `yaml` blocks as YAML (with only real
//! `MCP_K8S_*` settings as keys, as in a client's `env`), and `sh` or
//! `bash` blocks pass `bash -n`, set only real `MCP_K8S_*` settings, give
//! `mcp-k8s-ephemeral-job` only its real flags and subcommands, and name
//! repository scripts and files that exist (executable where run). The `sh`
//! blocks that are safe and quick offline are run, against the built binary.
//!
//! What is done with a block is data: `RULES` names a block by its file and
//! how its first line starts. `json` and `yaml` blocks need no rule unless
//! they are fragments; every `sh` block needs one (run it, or say why not),
//! and so does every untagged block (text that is no command: a diagram, a
//! tree). A block without the rule it needs fails with a message saying how
//! to add one, and so does a rule that names no block, or more than one.

use std::path::Path;
use std::process::Command;

use mcp_k8s_ephemeral_job::config::SETTINGS;

const BIN_NAME: &str = "mcp-k8s-ephemeral-job";

/// How one block is checked, beyond what its tag implies.
enum Check {
    /// `sh`: the static checks only; `why` says why it is not run.
    Static,
    /// `sh`: the static checks, then run by `bash -e -o pipefail` with only
    /// these variables and a `PATH` that starts with the built binary's
    /// directory; its stdout must pass `stdout`.
    Run { env: &'static [(&'static str, &'static str)], stdout: fn(&str) -> Result<(), String> },
    /// Untagged: text that is no command and no document.
    Text,
    /// `json`: object members without their braces; parses once wrapped in `{}`.
    JsonMembers,
}

struct Rule {
    file: &'static str,
    /// How the block's first line starts (without the block's
    /// indentation); it names one block of the file.
    first_line_start: &'static str,
    check: Check,
    why: &'static str,
}

const RULES: &[Rule] = &[
    rule("README.md", "./demo ", Check::Static, "needs Docker or a cluster, as root, and minutes"),
    rule("README.md", "cargo test --lib --test offline", Check::Static, "runs the tier this test is part of"),
    rule("README.md", "agent ──MCP (stdio", Check::Text, "a diagram"),
    rule("README.md", "./install ", Check::Static, "a release build installed as root"),
    rule("README.md", "mcp-k8s-ephemeral-job --version", Check::Run { env: &[], stdout: version_and_help }, "prints and exits"),
    rule("README.md", "claude mcp add ", Check::Static, "changes the Claude Code CLI's configuration"),
    rule("README.md", "export MCP_K8S_AUTH_TOKEN=", Check::Static, "serves on a fixed port until stopped"),
    rule("docs/architecture.md", "agent ──MCP (stdio", Check::Text, "a diagram"),
    rule("docs/architecture.md", "agent ──MCP──▶ protocol", Check::Text, "a diagram"),
    rule(
        "docs/callers.md",
        "printf %s \"$TOKEN\" | sha256sum",
        Check::Run { env: &[("TOKEN", "test")], stdout: digest_of_test },
        "coreutils",
    ),
    rule("docs/deploy.md", "docker build ", Check::Static, "needs Docker, a registry and a cluster"),
    rule("docs/deploy.md", "# the two namespaces", Check::Static, "needs a cluster and helm"),
    rule("docs/deploy.md", "kubectl -n mcp-system rollout status", Check::Static, "needs a cluster"),
    rule(
        "docs/deploy.md",
        "cp -r examples/renamed-namespaces",
        Check::Static,
        "needs a cluster (with_tools kustomize_namespaces:: renders the overlay)",
    ),
    rule("docs/deploy.md", "kubectl delete -k deploy/", Check::Static, "needs a cluster"),
    rule("docs/deploy.md", "apt-get install ", Check::Static, "installs packages as root, then a cross build"),
    rule("docs/docker.md", "engine ──NewRun──▶", Check::Text, "a diagram"),
    rule("docs/docker.md", "tests/podman/up ", Check::Static, "installs podman as root"),
    rule("docs/large-outputs.md", "\"links\": [", Check::JsonMembers, "one member of a result"),
    rule("docs/large-outputs.md", "$MCP_K8S_OUTPUTS_DIR/", Check::Text, "a directory tree"),
    rule("docs/sandboxes.md", "open_sandbox {", Check::Text, "tool calls in short form"),
    rule("docs/testing.md", "cargo test --lib --test offline", Check::Static, "runs the tier this test is part of"),
    rule("docs/testing.md", "tests/clients/setup", Check::Static, "downloads the SDKs, needs Docker"),
    rule("docs/traces.md", "client's span ", Check::Text, "a tree of spans"),
    rule("docs/traces.md", "MCP_K8S_OTLP_ENDPOINT=", Check::Static, "serves until stopped, needs a backend"),
];

const fn rule(file: &'static str, first_line_start: &'static str, check: Check, why: &'static str) -> Rule {
    Rule { file, first_line_start, check, why }
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

#[test]
fn every_doc_block_passes_the_check_of_its_kind() {
    let blocks = doc_blocks();
    let mut failures = Vec::new();
    let mut n_by_kind = std::collections::BTreeMap::<String, usize>::new();
    for block in &blocks {
        let rule = RULES.iter().find(|rule| rule.names(block));
        let kind = check_block(block, rule).unwrap_or_else(|error| {
            failures.push(format!("{}:{}: ```{} block `{}`: {error}", block.file, block.line, block.tag, block.first_line()));
            "failed".to_string()
        });
        *n_by_kind.entry(kind).or_default() += 1;
    }
    println!("{} blocks: {n_by_kind:?}", blocks.len());
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn every_rule_names_a_block() {
    let blocks = doc_blocks();
    for rule in RULES {
        let n_blocks = blocks.iter().filter(|block| rule.names(block)).count();
        assert_eq!(
            n_blocks, 1,
            "blocks of {} that start with `{}`; a rule names one block ({})",
            rule.file, rule.first_line_start, rule.why
        );
    }
}

impl Rule {
    fn names(&self, block: &Block) -> bool {
        block.file == self.file && block.first_line().starts_with(self.first_line_start)
    }
}

struct Block {
    file: String,
    line: usize,
    tag: String,
    text: String,
}

impl Block {
    fn first_line(&self) -> &str {
        self.text.lines().next().unwrap_or("")
    }
}

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Every fenced block of README.md and docs/*.md, in order, with the
/// fence's indentation taken off its lines.
fn doc_blocks() -> Vec<Block> {
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

/// Checks one block; returns the kind it was counted as.
fn check_block(block: &Block, rule: Option<&Rule>) -> Result<String, String> {
    let check = rule.map(|rule| &rule.check);
    match (block.tag.as_str(), check) {
        ("json", None) => {
            let value = serde_json::from_str::<serde_json::Value>(&block.text).map_err(|error| format!("not JSON: {error}; fix it, or give it a JsonMembers rule in RULES (tests/offline/docs_commands.rs) if it is a fragment"))?;
            check_setting_keys(&value)?;
            Ok("json".to_string())
        }
        ("json", Some(Check::JsonMembers)) => {
            let value = serde_json::from_str::<serde_json::Value>(&format!("{{{}}}", block.text)).map_err(|error| format!("not JSON object members: {error}"))?;
            check_setting_keys(&value)?;
            Ok("json (members)".to_string())
        }
        ("yaml", None) => {
            let value = serde_saphyr::from_str::<serde_json::Value>(&block.text).map_err(|error| format!("not YAML: {error}"))?;
            check_setting_keys(&value)?;
            Ok("yaml".to_string())
        }
        ("sh" | "bash", Some(Check::Static)) => {
            check_shell(&block.text)?;
            Ok("sh (checked)".to_string())
        }
        ("sh" | "bash", Some(Check::Run { env, stdout })) => {
            check_shell(&block.text)?;
            run_shell(&block.text, env, *stdout)?;
            Ok("sh (run)".to_string())
        }
        ("sh" | "bash", None) => Err("no rule: add one to RULES in tests/offline/docs_commands.rs, `Check::Run` if it is safe and quick to run offline, else `Check::Static` with why it is not run".to_string()),
        ("", Some(Check::Text)) => Ok("text".to_string()),
        ("", None) => Err("untagged: tag it (sh, json, yaml) to have it checked, or, if it is no command and no document (a diagram, a tree), add a `Check::Text` rule to RULES in tests/offline/docs_commands.rs".to_string()),
        (_, Some(_)) => Err("its rule in RULES does not fit its tag".to_string()),
        (tag, None) => Err(format!("unknown tag `{tag}`: use sh, json or yaml, or none for text")),
    }
}

/// A client's configuration names settings as keys (an `env` object): each
/// `MCP_K8S_*` key must be one.
fn check_setting_keys(value: &serde_json::Value) -> Result<(), String> {
    match value {
        serde_json::Value::Object(object) => {
            for (key, member) in object {
                if key.starts_with("MCP_K8S_") && !SETTINGS.iter().any(|setting| setting.env == key) {
                    return Err(format!("`{key}` is no setting (config::SETTINGS)"));
                }
                check_setting_keys(member)?;
            }
            Ok(())
        }
        serde_json::Value::Array(items) => items.iter().try_for_each(check_setting_keys),
        _ => Ok(()),
    }
}

/// `bash -n`, then the settings, flags and paths of each command.
fn check_shell(text: &str) -> Result<(), String> {
    let output = Command::new("bash").args(["-n", "-c", text]).output().map_err(|error| format!("bash: {error}"))?;
    if !output.status.success() {
        return Err(format!("bash -n: {}", String::from_utf8_lossy(&output.stderr).trim()));
    }
    for command in shell_commands(text) {
        check_command(&command)?;
    }
    Ok(())
}

fn check_command(words: &[String]) -> Result<(), String> {
    for word in words {
        if let Some((name, _)) = word.split_once('=')
            && name.starts_with("MCP_K8S_")
            && !SETTINGS.iter().any(|setting| setting.env == name)
        {
            return Err(format!("`{name}` is no setting (config::SETTINGS)"));
        }
    }
    // Leading `export` and assignments are not the command.
    let start = words.iter().position(|word| word != "export" && !is_assignment(word)).unwrap_or(words.len());
    let Some(program) = words.get(start) else { return Ok(()) };
    if is_repo_path(program) {
        check_repo_path(program, true)?;
    }
    // kubectl's `kind/name` words are objects, not files: only what follows
    // `-f` or `-k` is a path there.
    let is_kubectl = program == "kubectl";
    for (word_idx, word) in words.iter().enumerate().skip(start + 1) {
        let names_a_file = !is_kubectl || matches!(words[word_idx - 1].as_str(), "-f" | "-k");
        if names_a_file && is_repo_path(word) {
            check_repo_path(word, false)?;
        }
    }
    // The binary as the command, or as the command after `--` (`kubectl exec
    // ... -- /mcp-k8s-ephemeral-job doctor`, `claude mcp add ... -- path`).
    for word_idx in start..words.len() {
        let follows_dashes = word_idx > start && words[word_idx - 1] == "--";
        if (word_idx == start || follows_dashes) && words[word_idx].rsplit('/').next() == Some(BIN_NAME) {
            check_binary_arguments(&words[word_idx + 1..])?;
        }
    }
    Ok(())
}

fn check_binary_arguments(arguments: &[String]) -> Result<(), String> {
    let mut arg_idx = 0;
    let mut subcommand_seen = false;
    while let Some(argument) = arguments.get(arg_idx) {
        arg_idx += 1;
        if matches!(argument.as_str(), "-h" | "--help" | "-V" | "--version") {
            continue;
        }
        if let Some(flag) = argument.strip_prefix("--") {
            let (name, value) = flag.split_once('=').map_or((flag, None), |(name, value)| (name, Some(value)));
            if !SETTINGS.iter().any(|setting| setting.flag == Some(name)) {
                return Err(format!("`--{name}` is no flag of {BIN_NAME} (config::SETTINGS)"));
            }
            if value.is_none() {
                arg_idx += 1;
            }
        } else if argument.starts_with('-') {
            return Err(format!("`{argument}` is no flag of {BIN_NAME}"));
        } else if subcommand_seen || !matches!(argument.as_str(), "serve" | "doctor") {
            return Err(format!("`{argument}` is no command of {BIN_NAME}; commands: serve, doctor"));
        } else {
            subcommand_seen = true;
        }
    }
    Ok(())
}

fn is_assignment(word: &str) -> bool {
    word.split_once('=').is_some_and(|(name, _)| {
        !name.is_empty()
            && !name.starts_with(|char: char| char.is_ascii_digit())
            && name.chars().all(|char| char == '_' || char.is_ascii_alphanumeric())
    })
}

/// A path into this repository, as the docs write them.
fn is_repo_path(word: &str) -> bool {
    ["./", "tests/", "deploy/", "docs/", "bench/", ".ci/"].iter().any(|prefix| word.starts_with(prefix))
}

fn check_repo_path(word: &str, is_run: bool) -> Result<(), String> {
    let path = root().join(word);
    let metadata = std::fs::metadata(&path).map_err(|_| format!("`{word}` does not exist in the repository"))?;
    if is_run {
        use std::os::unix::fs::PermissionsExt;
        if !metadata.is_file() || metadata.permissions().mode() & 0o111 == 0 {
            return Err(format!("`{word}` is run but is no executable file"));
        }
    }
    Ok(())
}

fn run_shell(text: &str, env: &[(&str, &str)], check_stdout: fn(&str) -> Result<(), String>) -> Result<(), String> {
    let binary = Path::new(env!("CARGO_BIN_EXE_mcp-k8s-ephemeral-job"));
    let path = format!("{}:/usr/local/bin:/usr/bin:/bin", binary.parent().expect("the binary's directory").display());
    let output = Command::new("bash")
        .args(["-e", "-o", "pipefail", "-c", text])
        .env_clear()
        .env("PATH", path)
        .envs(env.iter().copied())
        .current_dir(root())
        .output()
        .map_err(|error| format!("bash: {error}"))?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    if !output.status.success() {
        return Err(format!("run: {}; stderr: {}", output.status, String::from_utf8_lossy(&output.stderr).trim()));
    }
    check_stdout(&stdout).map_err(|error| format!("run: {error}; stdout: {stdout}"))
}

/// The commands of a shell text, each as its words with the quotes taken
/// off: lines joined at a trailing `\`, comments dropped, split at `|`,
/// `&&`, `||`, `;` and `&` outside quotes. What is inside quotes (a `$(...)`
/// in a value) stays one word and is not looked into.
fn shell_commands(text: &str) -> Vec<Vec<String>> {
    let text = text.replace("\\\n", " ");
    let mut commands = Vec::new();
    for line in text.lines() {
        let mut words: Vec<String> = Vec::new();
        let mut word: Option<String> = None;
        let mut quote: Option<char> = None;
        let mut chars = line.chars().peekable();
        while let Some(char) = chars.next() {
            match (quote, char) {
                (Some(open), _) if char == open => quote = None,
                (Some(_), _) => word.get_or_insert_default().push(char),
                (None, '\'' | '"') => {
                    quote = Some(char);
                    word.get_or_insert_default();
                }
                (None, '#') if word.is_none() => break,
                (None, '|' | '&' | ';') => {
                    if chars.peek() == Some(&char) {
                        chars.next();
                    }
                    words.extend(word.take());
                    commands.push(std::mem::take(&mut words));
                }
                (None, char) if char.is_whitespace() => words.extend(word.take()),
                (None, char) => word.get_or_insert_default().push(char),
            }
        }
        words.extend(word.take());
        commands.push(words);
    }
    commands.retain(|words| !words.is_empty());
    commands
}
