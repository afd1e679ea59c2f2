//! The configuration table (`docs/configuration.md`, linked from the README)
//! lists every setting with its default, so the table and `config::SETTINGS`
//! cannot drift apart.

use mcp_k8s_ephemeral_job::config::SETTINGS;

#[test]
fn the_configuration_table_lists_every_setting_with_its_default() {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/configuration.md")).expect("docs/configuration.md");
    let section = doc.split("\n## Settings\n").nth(1).expect("a `## Settings` section in docs/configuration.md");
    for setting in SETTINGS {
        let row = section
            .lines()
            .find(|line| line.starts_with(&format!("| `{}` |", setting.env)))
            .unwrap_or_else(|| panic!("docs/configuration.md's settings table has no row for {}", setting.env));
        let cells: Vec<&str> = row.split(" | ").collect();
        let default = if setting.default.is_empty() { "(none)".to_string() } else { format!("`{}`", setting.default) };
        assert_eq!(cells.get(2).copied(), Some(default.as_str()), "default of {} in: {row}", setting.env);
        let flag = setting.flag.map_or_else(|| "(env only)".to_string(), |flag| format!("`--{flag}`"));
        assert_eq!(cells.get(1).copied(), Some(flag.as_str()), "flag of {} in: {row}", setting.env);
    }
}
