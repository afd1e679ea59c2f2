//! The test hooks, `test_sleep` and `test_panic`: tools registered only
//! with `MCP_K8S_TEST_TOOLS=1` in a build with the `testing` feature (every
//! build cargo makes for tests; never a release). They let the tests and
//! the MCP client suites exercise progress, cancellation and a panicking
//! tool without a cluster. Nothing else in the server calls them.

use serde_json::{Map, Value, json};

use crate::log::Level;
use crate::tools::{Annotations, ArgError, Call, Ctx, Tool, ToolOutcome, check_known_arguments, optional_integer, optional_number};

/// The hooks, in `tools/list` order after the real tools.
pub fn tools() -> [Tool; 2] {
    [test_sleep_tool(), test_panic_tool()]
}

fn test_sleep_tool() -> Tool {
    Tool {
        name: "test_sleep",
        title: "Sleep (test hook)".to_string(),
        description: "Test hook: sleeps `seconds`, reporting progress every `progress_every_ms` and \
                      stopping early when cancelled."
            .to_string(),
        input_schema: json!({
            "type": "object",
            "properties": {
                "seconds": { "type": "number", "minimum": 0, "maximum": 600 },
                "progress_every_ms": { "type": "integer", "minimum": 10, "maximum": 60000 }
            },
            "required": ["seconds"],
            "additionalProperties": false
        }),
        output_schema: json!({
            "type": "object",
            "properties": { "slept_ms": { "type": "integer" } },
            "required": ["slept_ms"],
            "additionalProperties": false
        }),
        annotations: Annotations { read_only: true, destructive: false, idempotent: true, open_world: false },
        handler: test_sleep,
    }
}

struct SleepArgs {
    total_ms: u64,
    step_ms: u64,
}

fn parse_sleep_args(arguments: &Map<String, Value>) -> Result<SleepArgs, ArgError> {
    check_known_arguments(arguments, &["seconds", "progress_every_ms"])?;
    let seconds = optional_number(arguments, "seconds", 0.0, 600.0)?.ok_or(ArgError::Missing { name: "seconds" })?;
    let step_ms = optional_integer(arguments, "progress_every_ms", 10, 60_000)?.unwrap_or(100);
    Ok(SleepArgs { total_ms: (seconds * 1000.0).round() as u64, step_ms })
}

fn test_sleep(_ctx: &Ctx, call: &Call<'_>) -> ToolOutcome {
    let args = match parse_sleep_args(call.arguments) {
        Ok(args) => args,
        Err(error) => return ToolOutcome::Failure(error.to_string()),
    };
    call.events.log(Level::Info, &format!("sleeping {} ms", args.total_ms));
    let mut slept_ms = 0;
    while slept_ms < args.total_ms {
        let step_ms = args.step_ms.min(args.total_ms - slept_ms);
        if call.cancel.wait_timeout(std::time::Duration::from_millis(step_ms)) {
            return ToolOutcome::Failure(format!("cancelled after {slept_ms} ms"));
        }
        slept_ms += step_ms;
        let message = format!("slept {slept_ms} of {} ms", args.total_ms);
        call.events.progress(slept_ms as f64, Some(args.total_ms as f64), Some(&message));
    }
    ToolOutcome::Success(json!({ "slept_ms": slept_ms }))
}

fn test_panic_tool() -> Tool {
    Tool {
        name: "test_panic",
        title: "Panic (test hook)".to_string(),
        description: "Test hook: panics, to show a failing tool answers -32603 and the server lives on.".to_string(),
        input_schema: json!({ "type": "object", "additionalProperties": false }),
        output_schema: json!({ "type": "object" }),
        annotations: Annotations { read_only: true, destructive: false, idempotent: true, open_world: false },
        handler: test_panic,
    }
}

fn test_panic(_ctx: &Ctx, _call: &Call<'_>) -> ToolOutcome {
    panic!("test_panic was called");
}
