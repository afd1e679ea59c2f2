//! Every fenced block of README.md and docs/*.md is checked by its kind, so
//! a recipe that stops working fails here rather than in a user's first
//! hour: `json` blocks parse as JSON, `yaml` blocks as YAML (with only real
//! `MCP_K8S_*` settings as keys, as in a client's `env`), and `sh` or
//! `bash` blocks pass `bash -n`, set only real `MCP_K8S_*` settings, give
//! `mcp-k8s-ephemeral-job` only its real flags and subcommands, and name
//! repository scripts and files that exist (executable where run). The `sh`
//! blocks that are safe and quick offline are run, against the built binary;
//! those a tier runs (`Check::InTier`) must still fit their edits here, and
//! those a script runs (`Check::RunBy`) must still be that script's lines.
//!
//! What is done with a block is data: `RULES` (tests/support/docs.rs, shared
//! with the tiers that run the blocks this one cannot) names a block by its
//! file and how its first line starts. `json` and `yaml` blocks need no rule unless
//! they are fragments; every `sh` block needs one (run it, or say why not),
//! and so does every untagged block (text that is no command: a diagram, a
//! tree). A block without the rule it needs fails with a message saying how
//! to add one, and so does a rule that names no block, or more than one.

use std::process::Command;

use crate::support::docs::{BIN_NAME, Block, Check, RULES, Rule, doc_blocks, edited, root, run_shell};
use mcp_k8s_ephemeral_job::config::SETTINGS;

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

/// The check can fail: README's `--version` block with a misspelt flag
/// fails its run, an edit that no longer fits its block fails, and so does
/// a script that no longer runs what its block says.
#[test]
fn a_broken_block_fails() {
    let (rule, block) = crate::support::docs::rule_and_block("README.md", "mcp-k8s-ephemeral-job --version");
    let broken = Block { text: block.text.replace("--version", "--versoin"), ..block };
    let error = check_block(&broken, Some(rule)).expect_err("a misspelt flag fails");
    assert!(error.contains("`--versoin` is no flag"), "{error}");
    let error = run_shell(&broken.text, &[], &[], None, root()).expect_err("and fails when run");
    assert!(error.contains("--versoin"), "{error}");
    let edits = [crate::support::docs::Edit::Replace { from: "127.0.0.1:8080", to: "127.0.0.1:1" }];
    let error = edited(&broken.text, &edits).err().expect("an edit that does not fit");
    assert_eq!(error, "edit: `127.0.0.1:8080` is not in the block");
    let (_, demo) = crate::support::docs::rule_and_block("README.md", "./demo ");
    let drifted =
        Rule { file: "README.md", first_line_start: "./demo ", check: Check::RunBy { lines: &[(".ci/run", "./demo --quick")] }, why: "" };
    let error = check_block(&demo, Some(&drifted)).expect_err("a line the script does not have");
    assert_eq!(error, "`./demo --quick` is no line of .ci/run, which its rule says runs the block");
}

/// docs/deploy.md's cross build is what `tests/build-arm64` runs (and
/// tests/run-all runs that): the same Debian packages (the script adds
/// the cross C headers and `file`) and the same Rust targets.
#[test]
fn the_cross_build_recipe_is_what_build_arm64_runs() {
    let (_, block) = crate::support::docs::rule_and_block("docs/deploy.md", "apt-get install ");
    let script = std::fs::read_to_string(root().join("tests/build-arm64")).expect("tests/build-arm64");
    let commands = shell_commands(&block.text);
    let words_after = |prefix: &[&str]| -> Vec<String> {
        let command = commands.iter().find(|words| words.starts_with(&prefix.iter().map(|word| word.to_string()).collect::<Vec<_>>()));
        command.unwrap_or_else(|| panic!("the block runs `{}`", prefix.join(" ")))[prefix.len()..].to_vec()
    };
    let ensured = script.lines().find_map(|line| line.strip_prefix("ensure_packages ")).expect("build-arm64 ensures its packages");
    for package in words_after(&["apt-get", "install"]) {
        assert!(ensured.split(' ').any(|word| word == package), "tests/build-arm64 does not install `{package}`");
    }
    for target in words_after(&["rustup", "target", "add"]) {
        assert!(script.contains(&format!("={target}\n")), "tests/build-arm64 does not add the target `{target}`");
    }
    assert!(commands.iter().any(|words| words == &["tests/build-arm64"]), "the block runs tests/build-arm64");
}

/// Checks one block; returns the kind it was counted as.
fn check_block(block: &Block, rule: Option<&Rule>) -> Result<String, String> {
    let check = rule.map(|rule| &rule.check);
    match (block.tag.as_str(), check) {
        ("json", None) => {
            let value = serde_json::from_str::<serde_json::Value>(&block.text).map_err(|error| format!("not JSON: {error}; fix it, or give it a JsonMembers rule in RULES (tests/support/docs.rs) if it is a fragment"))?;
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
            let output = run_shell(&block.text, env, &[], None, root())?;
            stdout(&output).map_err(|error| format!("run: {error}; stdout: {output}"))?;
            Ok("sh (run)".to_string())
        }
        ("sh" | "bash", Some(Check::InTier { tier, edits, .. })) => {
            check_shell(&block.text)?;
            let text = edited(&block.text, edits)?.text;
            check_shell(&text).map_err(|error| format!("after its edits: {error}"))?;
            Ok(format!("sh (run in {tier:?})"))
        }
        ("sh" | "bash", Some(Check::RunBy { lines })) => {
            check_shell(&block.text)?;
            for (script, line) in *lines {
                let script_text = std::fs::read_to_string(root().join(script)).map_err(|error| format!("{script}: {error}"))?;
                if !script_text.lines().any(|script_line| script_line.trim() == *line) {
                    return Err(format!("`{line}` is no line of {script}, which its rule says runs the block"));
                }
            }
            Ok("sh (run by a script)".to_string())
        }
        ("sh" | "bash", None) => Err("no rule: add one to RULES in tests/support/docs.rs, `Check::Run` if it is safe and quick to run offline, `Check::InTier` if a tier has what it needs, else `Check::Static` with why it is not run".to_string()),
        ("", Some(Check::Text)) => Ok("text".to_string()),
        ("", None) => Err("untagged: tag it (sh, json, yaml) to have it checked, or, if it is no command and no document (a diagram, a tree), add a `Check::Text` rule to RULES in tests/support/docs.rs".to_string()),
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
