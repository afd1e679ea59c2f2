//! The in-pod runner: the job's entrypoint, started by the kubelet. Runs the
//! caller's argv, captures stdout and stderr apart, enforces the command
//! timeout and writes a framed result to its own stdout. Knows nothing of
//! MCP or of the API server.
