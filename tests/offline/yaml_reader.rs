//! `yaml`, the bounded YAML reader of kubeconfigs and the pod template: the
//! shapes real kubeconfig writers produce (kubectl, kind, minikube, `aws eks`,
//! `gcloud`) read as a full YAML reader reads them, what it refuses and
//! where it says so, and every YAML file of this repository read the same
//! as serde-saphyr reads it.

use std::path::{Path, PathBuf};

use mcp_k8s_ephemeral_job::yaml::{self, MAX_DEPTH};
use serde_json::{Value, json};

fn read(text: &str) -> Value {
    yaml::from_str(text).unwrap_or_else(|error| panic!("{error}\n{text}"))
}

/// Real kubeconfig shapes, as their tools write them.
#[test]
fn kubeconfig_shapes_read_as_yaml_says() {
    let cases: Vec<(&str, &str, Value)> = vec![
        (
            "kubectl config view --raw (kind): sequences at their key's indentation, empty flow mapping",
            "apiVersion: v1\nclusters:\n- cluster:\n    certificate-authority-data: LS0tLS1CRUdJTg==\n    server: https://127.0.0.1:41235\n  name: kind-kind\ncontexts:\n- context:\n    cluster: kind-kind\n    user: kind-kind\n  name: kind-kind\ncurrent-context: kind-kind\nkind: Config\npreferences: {}\nusers:\n- name: kind-kind\n  user:\n    client-certificate-data: LS0t\n    client-key-data: LS0t\n",
            json!({"apiVersion": "v1", "clusters": [{"cluster": {"certificate-authority-data": "LS0tLS1CRUdJTg==", "server": "https://127.0.0.1:41235"}, "name": "kind-kind"}], "contexts": [{"context": {"cluster": "kind-kind", "user": "kind-kind"}, "name": "kind-kind"}], "current-context": "kind-kind", "kind": "Config", "preferences": {}, "users": [{"name": "kind-kind", "user": {"client-certificate-data": "LS0t", "client-key-data": "LS0t"}}]}),
        ),
        (
            "minikube: extensions, a date, file paths, null lists",
            "apiVersion: v1\nclusters:\n- cluster:\n    certificate-authority: /home/u/.minikube/ca.crt\n    extensions:\n    - extension:\n        last-update: Mon, 07 Dec 2026 06:00:00 UTC\n        provider: minikube.sigs.k8s.io\n        version: v1.34.0\n      name: cluster_info\n    server: https://192.168.49.2:8443\n  name: minikube\ncontexts: null\nusers: []\n",
            json!({"apiVersion": "v1", "clusters": [{"cluster": {"certificate-authority": "/home/u/.minikube/ca.crt", "extensions": [{"extension": {"last-update": "Mon, 07 Dec 2026 06:00:00 UTC", "provider": "minikube.sigs.k8s.io", "version": "v1.34.0"}, "name": "cluster_info"}], "server": "https://192.168.49.2:8443"}, "name": "minikube"}], "contexts": null, "users": []}),
        ),
        (
            "aws eks update-kubeconfig: exec plugin, args list, env null, indented sequences",
            "users:\n- name: arn:aws:eks:eu-west-1:123456789012:cluster/prod\n  user:\n    exec:\n      apiVersion: client.authentication.k8s.io/v1beta1\n      args:\n        - --region\n        - eu-west-1\n        - eks\n        - get-token\n        - --cluster-name\n        - prod\n      command: aws\n      env:\n        - name: AWS_PROFILE\n          value: prod\n      interactiveMode: IfAvailable\n      provideClusterInfo: false\n",
            json!({"users": [{"name": "arn:aws:eks:eu-west-1:123456789012:cluster/prod", "user": {"exec": {"apiVersion": "client.authentication.k8s.io/v1beta1", "args": ["--region", "eu-west-1", "eks", "get-token", "--cluster-name", "prod"], "command": "aws", "env": [{"name": "AWS_PROFILE", "value": "prod"}], "interactiveMode": "IfAvailable", "provideClusterInfo": false}}}]}),
        ),
        (
            "gcloud: a long installHint wrapped over two lines (a folded plain scalar)",
            "users:\n- name: gke_p_z_c\n  user:\n    exec:\n      apiVersion: client.authentication.k8s.io/v1beta1\n      command: gke-gcloud-auth-plugin\n      installHint: Install gke-gcloud-auth-plugin for use with kubectl by following\n        https://cloud.google.com/kubernetes-engine/docs/how-to/cluster-access-for-kubectl#install_plugin\n      provideClusterInfo: true\n",
            json!({"users": [{"name": "gke_p_z_c", "user": {"exec": {"apiVersion": "client.authentication.k8s.io/v1beta1", "command": "gke-gcloud-auth-plugin", "installHint": "Install gke-gcloud-auth-plugin for use with kubectl by following https://cloud.google.com/kubernetes-engine/docs/how-to/cluster-access-for-kubectl#install_plugin", "provideClusterInfo": true}}}]}),
        ),
        (
            "token, insecure-skip-tls-verify, comments, ---, quoted strings with escapes",
            "# written by hand\n---\nclusters:\n- name: 'it''s'   # single quotes\n  cluster:\n    server: \"https://10.0.0.1:6443\"\n    insecure-skip-tls-verify: true\nusers:\n- name: \"tab\\there \\\"q\\\" \\u00e9 \\x41 \\\\\"\n  user:\n    token: abc.def-ghi_jkl  # the token\n    username: \"\"\n",
            json!({"clusters": [{"name": "it's", "cluster": {"server": "https://10.0.0.1:6443", "insecure-skip-tls-verify": true}}], "users": [{"name": "tab\there \"q\" é A \\", "user": {"token": "abc.def-ghi_jkl", "username": ""}}]}),
        ),
        (
            "flow collections, nested, over several lines, with JSON-style keys",
            "as-groups: [system:masters, \"b c\", 'd']\nas-user-extra: {scopes: [a, b], \"empty\": [], none: }\nargs: [\n  \"--x\",  # comment\n  why\n]\n",
            json!({"as-groups": ["system:masters", "b c", "d"], "as-user-extra": {"scopes": ["a", "b"], "empty": [], "none": null}, "args": ["--x", "why"]}),
        ),
        (
            "block scalars: literal and folded, with chomping",
            "literal: |\n  line one\n    indented\n\n  line three\nstripped: |-\n  no newline\nkept: |+\n  two newlines\n\nfolded: >\n  a\n  b\n\n  c\nnext: end\n",
            json!({"literal": "line one\n  indented\n\nline three\n", "stripped": "no newline", "kept": "two newlines\n\n", "folded": "a b\nc\n", "next": "end"}),
        ),
        (
            "core schema for untyped values; nulls; CRLF line ends; a document end",
            "a: 12\r\nb: -3\r\nc: 1.5\r\nd: ~\r\ne:\r\nf: 'true'\r\ng: 0x1F\r\nh: 1.2.3\r\ni: False\r\n...\r\n# after\r\n",
            json!({"a": 12, "b": -3, "c": 1.5, "d": null, "e": null, "f": "true", "g": 31, "h": "1.2.3", "i": false}),
        ),
        (
            "nested sequences and multi-line quoted strings",
            "- - a\n  - b\n-\n  - c\n- \"one\n  two\n\n  three\"\n- 'x\n  y'\n",
            json!([["a", "b"], ["c"], "one two\nthree", "x y"]),
        ),
        ("an empty document", "# nothing\n", Value::Null),
        ("a lone scalar", "hello world\n", json!("hello world")),
        ("a kept block scalar at the end", "k: |+\n  a\n\n\n", json!({"k": "a\n\n\n"})),
    ];
    for (what, text, expected) in cases {
        assert_eq!(read(text), expected, "{what}");
    }
}

/// What the reader refuses, each with the line it names.
#[test]
fn refusals_name_the_construct_and_the_line() {
    let deep = format!("{}x", "[".repeat(MAX_DEPTH + 5));
    let deep_block: String = (0..MAX_DEPTH + 5).map(|level| format!("{}k:\n", " ".repeat(level))).collect();
    let cases: Vec<(&str, String, &str, u64)> = vec![
        ("anchor", "a: &x 1\nb: 2\n".into(), "anchors and aliases", 1),
        ("alias", "a: 1\nb: *x\n".into(), "anchors and aliases", 2),
        ("billion laughs", "a: &a [\"lol\"]\nb: &b [*a, *a]\n".into(), "anchors and aliases", 1),
        ("tag", "a: !!binary aGk=\n".into(), "tags", 1),
        ("directive", "%YAML 1.2\n---\na: 1\n".into(), "directives", 1),
        ("two documents", "a: 1\n---\nb: 2\n".into(), "several YAML documents", 2),
        ("duplicate key", "users: []\nusers: []\n".into(), "the key `users` is given twice", 2),
        ("tab indentation", "a:\n\tb: 1\n".into(), "a tab indents this line", 2),
        ("complex key", "? a\n: b\n".into(), "complex mapping keys", 1),
        ("bad indentation", "a:\n  b: 1\n c: 2\n".into(), "indentation", 3),
        ("unclosed quote", "a: \"abc\nb: 1\n".into(), "not closed", 1),
        ("bad escape", "a: \"\\q\"\n".into(), "unknown escape", 1),
        ("colon in a plain value", "a: b: c\n".into(), "inside a plain value", 1),
        ("text after a flow value", "a: [1] x\n".into(), "after the value", 1),
        ("deep flow nesting", deep, "nested deeper than", 1),
        ("deep block nesting", deep_block, "nested deeper than", 65),
    ];
    for (what, text, words, line) in cases {
        let error = yaml::parse(&text).err().unwrap_or_else(|| panic!("{what}: accepted"));
        assert!(error.message.contains(words), "{what}: {error}");
        assert_eq!(error.position.map(|(line, _)| line), Some(line), "{what}: {error}");
    }
}

/// A type error names the line of the value that did not fit.
#[test]
fn type_errors_name_the_value_line() {
    #[derive(Debug, serde::Deserialize)]
    #[allow(dead_code)]
    struct Shape {
        list: Vec<String>,
        flag: bool,
    }
    let error = yaml::from_str::<Shape>("flag: true\nlist: nope\n").unwrap_err();
    assert!(error.message.contains("invalid type"), "{error}");
    assert_eq!(error.position, Some((2, 7)));
    let error = yaml::from_str::<Shape>("list: []\nflag: \"maybe\"\n").unwrap_err();
    assert_eq!(error.position, Some((2, 7)), "{error}");
    // Booleans as go-yaml v2 (kubectl) and serde-saphyr take them.
    for (word, expected) in
        [("yes", true), ("On", true), ("Y", true), ("'true'", true), ("NO", false), ("off", false), ("\"false\"", false)]
    {
        let shape: Shape = yaml::from_str(&format!("list: []\nflag: {word}\n")).unwrap_or_else(|error| panic!("{word}: {error}"));
        assert_eq!(shape.flag, expected, "{word}");
    }
    assert_eq!(read("[yes, No, 'on', 1]"), json!([true, false, "on", 1]));
    // A string field takes any scalar's text, as serde-saphyr did.
    let text: std::collections::BTreeMap<String, String> = yaml::from_str("port: 8080\non: true\n").unwrap();
    assert_eq!(text["port"], "8080");
    assert_eq!(text["on"], "true");
}

/// Every prefix of every fixture, and a few hostile texts: an answer, never
/// a panic.
#[test]
fn truncated_and_hostile_texts_never_panic() {
    let mut texts: Vec<String> = yaml_files().iter().map(|path| std::fs::read_to_string(path).unwrap_or_default()).collect();
    texts.extend(
        ["\"\\", "'", "- - - -", "a: |9\n x", ": :", "[{]}", "{a: [}", "\r", "a: \"\r", "\u{feff}", "-\t-", "a:\n- b\n -c"]
            .map(String::from),
    );
    for text in &texts {
        let mut end = 0;
        while end <= text.len() {
            if text.is_char_boundary(end) {
                let _ = yaml::from_str::<Value>(&text[..end]);
            }
            end += 1;
        }
    }
}

/// The repository's YAML files (kubeconfig fixtures, the deploy manifests,
/// the fuzz seeds), each document read by serde-saphyr and by this reader:
/// the same values, or a refusal this reader documents.
#[test]
fn the_repositorys_yaml_reads_as_serde_saphyr_reads_it() {
    let mut compared = 0;
    for path in yaml_files() {
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        for document in documents(&text) {
            let Ok(theirs) = serde_saphyr::from_str::<Value>(&document) else { continue };
            match yaml::from_str::<Value>(&document) {
                Ok(ours) => assert_eq!(ours, theirs, "{}:\n{document}", path.display()),
                Err(error) => {
                    let documented = ["anchors", "tags", "directives"].iter().any(|word| error.message.contains(word));
                    assert!(documented, "{}: {error}\n{document}", path.display());
                }
            }
            compared += 1;
        }
    }
    assert!(compared > 60, "only {compared} documents compared");
}

/// A multi-document file's documents, split at its `---` lines.
fn documents(text: &str) -> Vec<String> {
    let mut documents = vec![String::new()];
    for line in text.lines() {
        if line.trim_end() == "---" {
            documents.push(String::new());
        } else if let Some(last) = documents.last_mut() {
            last.push_str(line);
            last.push('\n');
        }
    }
    documents
}

fn yaml_files() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    for folder in ["fixtures", "deploy", "fuzz/corpus/kubeconfig", "examples"] {
        collect(&root.join(folder), &mut files);
    }
    files.sort();
    files
}

fn collect(folder: &Path, files: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(folder) else { return };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            collect(&path, files);
        } else if path.extension().is_some_and(|extension| extension == "yaml" || extension == "yml") {
            files.push(path);
        }
    }
}
