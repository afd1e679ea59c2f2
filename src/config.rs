//! Configuration: `RawConfig` holds what the environment (`MCP_K8S_*`) and
//! the command line said; `Config::from_raw` applies defaults, cross-checks
//! fields and names the variable in every error. Nothing else reads the
//! environment for settings.
