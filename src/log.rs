//! Structured logs: one JSON object per line on stderr, metadata only.
//!
//! stdout belongs to the stdio transport, so nothing here ever writes there.
//! Callers pass field values they have decided are safe to log (run ids,
//! statuses, byte counts); caller data such as commands, file contents,
//! environment values and tokens must never be passed in. `Redacted` makes
//! the safe choice the easy one for values that travel in structs.

use std::fmt;
use std::io::Write;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// Severity, ordered from most to least verbose; the names are the syslog
/// levels MCP's `logging/setLevel` uses, so one type serves both.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    Debug,
    Info,
    Notice,
    Warning,
    Error,
    Critical,
    Alert,
    Emergency,
}

impl Level {
    pub const ALL: [Level; 8] =
        [Level::Debug, Level::Info, Level::Notice, Level::Warning, Level::Error, Level::Critical, Level::Alert, Level::Emergency];

    pub fn as_str(self) -> &'static str {
        match self {
            Level::Debug => "debug",
            Level::Info => "info",
            Level::Notice => "notice",
            Level::Warning => "warning",
            Level::Error => "error",
            Level::Critical => "critical",
            Level::Alert => "alert",
            Level::Emergency => "emergency",
        }
    }

    pub fn parse(text: &str) -> Option<Level> {
        Level::ALL.into_iter().find(|level| level.as_str() == text)
    }
}

/// Sets the lowest level written to stderr (default `info`).
pub fn set_stderr_level(level: Level) {
    STDERR_LEVEL.store(level as u8, Ordering::Relaxed);
}

pub fn debug(message: &str, fields: &[(&str, serde_json::Value)]) {
    write(Level::Debug, message, fields);
}

pub fn info(message: &str, fields: &[(&str, serde_json::Value)]) {
    write(Level::Info, message, fields);
}

pub fn warn(message: &str, fields: &[(&str, serde_json::Value)]) {
    write(Level::Warning, message, fields);
}

pub fn error(message: &str, fields: &[(&str, serde_json::Value)]) {
    write(Level::Error, message, fields);
}

/// Writes one log line if `level` is at or above the stderr threshold.
pub fn write(level: Level, message: &str, fields: &[(&str, serde_json::Value)]) {
    if (level as u8) < STDERR_LEVEL.load(Ordering::Relaxed) {
        return;
    }
    let line = format_line(SystemTime::now(), level, message, fields);
    // One write_all per line under the stderr lock keeps lines from
    // interleaving between threads; a failed write to stderr has nowhere
    // else to go, so it is dropped.
    let mut stderr = std::io::stderr().lock();
    let _ = stderr.write_all(line.as_bytes());
}

/// A value that must not reach logs: `Debug` and `Display` print `***`.
#[derive(Clone, PartialEq, Eq)]
pub struct Redacted<T>(pub T);

impl<T> fmt::Debug for Redacted<T> {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str("***")
    }
}

impl<T> fmt::Display for Redacted<T> {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str("***")
    }
}

/// RFC 3339 UTC time with millisecond precision, as Kubernetes and most log
/// shippers expect; written by hand to avoid a date crate for one format.
pub fn rfc3339_utc(time: SystemTime) -> String {
    let since_epoch = time.duration_since(UNIX_EPOCH).unwrap_or_default();
    let seconds = since_epoch.as_secs();
    let (year, month, day) = civil_from_days((seconds / 86_400) as i64);
    let second_of_day = seconds % 86_400;
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        second_of_day / 3600,
        second_of_day / 60 % 60,
        second_of_day % 60,
        since_epoch.subsec_millis()
    )
}

static STDERR_LEVEL: AtomicU8 = AtomicU8::new(Level::Info as u8);

fn format_line(time: SystemTime, level: Level, message: &str, fields: &[(&str, serde_json::Value)]) -> String {
    let mut object = serde_json::Map::new();
    object.insert("ts".into(), rfc3339_utc(time).into());
    object.insert("level".into(), level.as_str().into());
    object.insert("msg".into(), message.into());
    for (key, value) in fields {
        object.insert((*key).to_string(), value.clone());
    }
    let mut line = serde_json::Value::Object(object).to_string();
    line.push('\n');
    line
}

/// Days since 1970-01-01 to (year, month, day), Howard Hinnant's algorithm.
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let shifted = days + 719_468;
    let era = shifted.div_euclid(146_097);
    let day_of_era = shifted.rem_euclid(146_097);
    let year_of_era = (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_index = (5 * day_of_year + 2) / 153;
    let day = (day_of_year - (153 * month_index + 2) / 5 + 1) as u32;
    let month = if month_index < 10 { month_index + 3 } else { month_index - 9 } as u32;
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn rfc3339_known_instants() {
        let cases = [
            (0, "1970-01-01T00:00:00.000Z"),
            (951_782_400, "2000-02-29T00:00:00.000Z"),
            (1_798_588_799, "2026-12-29T23:59:59.000Z"),
            (4_107_542_400, "2100-03-01T00:00:00.000Z"),
        ];
        for (seconds, expected) in cases {
            let time = UNIX_EPOCH + Duration::from_secs(seconds);
            assert_eq!(rfc3339_utc(time), expected, "seconds {seconds}");
        }
    }

    #[test]
    fn line_is_one_json_object_with_fields() {
        let line = format_line(UNIX_EPOCH, Level::Warning, "run finished", &[("run_id", "abc".into()), ("bytes", 12.into())]);
        assert!(line.ends_with('\n'));
        assert_eq!(line.matches('\n').count(), 1);
        let value: serde_json::Value = serde_json::from_str(line.trim_end()).unwrap();
        assert_eq!(value["level"], "warning");
        assert_eq!(value["msg"], "run finished");
        assert_eq!(value["run_id"], "abc");
        assert_eq!(value["bytes"], 12);
    }

    #[test]
    fn redacted_never_prints_its_value() {
        let secret = Redacted("hunter2".to_string());
        assert_eq!(format!("{secret:?} {secret}"), "*** ***");
    }
}
