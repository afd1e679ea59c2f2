//! Entry point: wiring only. Parses the command line, then hands over to the
//! chosen mode (the MCP server, or the hidden in-pod runner).

fn main() {
    eprintln!("mcp-k8s-ephemeral-job: not wired yet");
    std::process::exit(2);
}
