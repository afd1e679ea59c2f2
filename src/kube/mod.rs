//! A small blocking Kubernetes REST client over ureq. It knows Jobs, Pods,
//! Secrets, Events and logs, and nothing about runs or MCP.
