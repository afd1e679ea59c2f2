//! Time as the APIs write it: RFC 3339 timestamps read from outside (the
//! API server's, exec plugins', annotations and labels anyone may edit),
//! parsed totally by hand so a hostile text is `None`, never a panic.
//! A leaf: imports nothing of the crate.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch (0 before it), as the runner's
/// arguments carry moments.
pub fn unix_ms(time: SystemTime) -> u64 {
    time.duration_since(UNIX_EPOCH).map(|since| u64::try_from(since.as_millis()).unwrap_or(u64::MAX)).unwrap_or(0)
}

/// Parses `2006-01-02T15:04:05[.frac](Z|±hh:mm)`, fractions down to the
/// nanosecond: exec plugins' expiry times and the API's own timestamps.
///
/// Total on any text: the text comes from outside (a plugin,
/// an annotation anyone with edit rights in the namespace can write), so it
/// is read by byte with `get`, never sliced at a position that could fall
/// inside a UTF-8 character, and every field is range-checked. A leap second
/// (`:60`) is accepted, as RFC 3339 allows, and reads as the next minute's
/// first second; digits past the ninth of a fraction are ignored.
pub fn parse_rfc3339(text: &str) -> Option<SystemTime> {
    let bytes = text.as_bytes();
    let separators_ok = bytes.get(4) == Some(&b'-')
        && bytes.get(7) == Some(&b'-')
        && matches!(bytes.get(10), Some(b'T' | b't'))
        && bytes.get(13) == Some(&b':')
        && bytes.get(16) == Some(&b':');
    if !separators_ok {
        return None;
    }
    let (year, month, day) = (ascii_number(bytes, 0, 4)?, ascii_number(bytes, 5, 2)?, ascii_number(bytes, 8, 2)?);
    let (hour, minute, second) = (ascii_number(bytes, 11, 2)?, ascii_number(bytes, 14, 2)?, ascii_number(bytes, 17, 2)?);
    if !(1..=12).contains(&month) || day < 1 || day > days_in_month(year, month) || hour > 23 || minute > 59 || second > 60 {
        return None;
    }
    let mut rest = bytes.get(19..)?;
    let mut nanos = 0u32;
    if let Some(fraction) = rest.strip_prefix(b".") {
        let n_digits = fraction.iter().take_while(|byte| byte.is_ascii_digit()).count();
        if n_digits == 0 {
            return None;
        }
        for position in 0..9 {
            let digit = fraction.get(position).filter(|_| position < n_digits).map_or(0, |byte| u32::from(byte - b'0'));
            nanos = nanos * 10 + digit;
        }
        rest = fraction.get(n_digits..)?;
    }
    let offset_seconds = offset_seconds(rest)?;
    let seconds = days_from_civil(year, month, day) * 86_400 + hour * 3600 + minute * 60 + second - offset_seconds;
    let seconds = u64::try_from(seconds).ok()?;
    UNIX_EPOCH.checked_add(Duration::new(seconds, nanos))
}

/// `Z`, `z` or `±hh:mm` (hours to 23, minutes to 59), in seconds east of UTC.
fn offset_seconds(zone: &[u8]) -> Option<i64> {
    let sign = match zone {
        b"Z" | b"z" => return Some(0),
        [b'+', _, _, b':', _, _] => 1,
        [b'-', _, _, b':', _, _] => -1,
        _ => return None,
    };
    let (hours, minutes) = (ascii_number(zone, 1, 2)?, ascii_number(zone, 4, 2)?);
    if hours > 23 || minutes > 59 {
        return None;
    }
    Some(sign * (hours * 3600 + minutes * 60))
}

/// The decimal number in `bytes[start..start + len]`, when all of it is
/// ASCII digits (no sign, no space).
fn ascii_number(bytes: &[u8], start: usize, len: usize) -> Option<i64> {
    let digits = bytes.get(start..start.checked_add(len)?)?;
    if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    Some(digits.iter().fold(0, |number, digit| number * 10 + i64::from(digit - b'0')))
}

fn days_in_month(year: i64, month: i64) -> i64 {
    let leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
    match month {
        2 if leap => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Days since 1970-01-01 (Howard Hinnant's algorithm).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let year_of_era = year.rem_euclid(400);
    let month_index = (month + 9) % 12;
    let day_of_year = (153 * month_index + 2) / 5 + day - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seconds(text: &str) -> Option<u64> {
        parse_rfc3339(text).and_then(|time| time.duration_since(UNIX_EPOCH).ok()).map(|elapsed| elapsed.as_secs())
    }

    #[test]
    fn rfc3339_forms() {
        let cases = [
            ("1970-01-01T00:00:00Z", Some(0)),
            ("1970-01-01t00:00:00z", Some(0)),
            ("2000-02-29T00:00:00Z", Some(951_782_400)),
            ("2000-02-29T01:00:00+01:00", Some(951_782_400)),
            ("2000-02-28T23:00:00-01:00", Some(951_782_400)),
            ("2026-12-29T23:59:59.123456Z", Some(1_798_588_799)),
            // A leap second reads as the next minute's first second.
            ("2016-12-31T23:59:60Z", Some(1_483_228_800)),
            ("2026-12-29", None),
            ("2026-13-01T00:00:00Z", None),
            ("2026-12-29T23:59:59", None),
            ("2026-02-29T00:00:00Z", None),
            ("2026-04-31T00:00:00Z", None),
            ("1900-02-29T00:00:00Z", None),
            ("2026-12-29T24:00:00Z", None),
            ("2026-12-29T23:60:00Z", None),
            ("2026-12-29T23:59:61Z", None),
            ("1969-12-31T23:59:59Z", None),
        ];
        for (text, expected) in cases {
            assert_eq!(seconds(text), expected, "{text}");
        }
    }

    #[test]
    fn rfc3339_fractions_are_kept_to_the_nanosecond() {
        let nanos = |text: &str| parse_rfc3339(text).map(|time| time.duration_since(UNIX_EPOCH).unwrap_or_default().subsec_nanos());
        assert_eq!(nanos("2026-01-01T00:00:00.5Z"), Some(500_000_000));
        assert_eq!(nanos("2026-01-01T00:00:00.123456789Z"), Some(123_456_789));
        let huge = format!("2026-01-01T00:00:00.{}Z", "9".repeat(100_000));
        assert_eq!(nanos(&huge), Some(999_999_999), "digits past the ninth are ignored");
        assert_eq!(nanos("2026-01-01T00:00:00.Z"), None, "a dot needs a digit");
    }

    /// Hostile text (an `expires-at` annotation anyone may
    /// write) must never panic the reaper thread.
    #[test]
    fn rfc3339_hostile_text_is_refused_without_panicking() {
        let hostile = [
            "",
            "2",
            "2026-01-01T00:00:0",
            "2026-01-01T00:00:00",
            "2026-01-01T00:00:00+",
            "2026-01-01T00:00:00+01",
            "2026-01-01T00:00:00+0100",
            "2026-01-01T00:00:00+01:0",
            "2026-01-01T00:00:00+01:000",
            "2026-01-01T00:00:00+24:00",
            "2026-01-01T00:00:00+01:60",
            "2026-01-01T00:00:00+é:00",
            "2026-01-01T00:00:00é1234",
            "2026-01-01T00:00:00.é",
            "2026-01-01T00:00:00.1é",
            "2026-01-01T00:00:00ZZ",
            "2026-01-01T00:00:00 Z",
            "+026-01-01T00:00:00Z",
            "2026-+1-01T00:00:00Z",
            "2026-01-01T-1:00:00Z",
            "2026-01-01T00:00:+1Z",
            "99999-01-01T00:00:00Z",
            "2026-01-01X00:00:00Z",
            "2026/01/01T00:00:00Z",
            "２０２６-01-01T00:00:00Z",
            "\u{0}\u{0}\u{0}\u{0}-01-01T00:00:00Z",
        ];
        for text in hostile {
            assert_eq!(seconds(text), None, "{text:?}");
        }
        // A multi-byte character at every position of valid timestamps,
        // replacing a byte or inserted, in 2-, 3- and 4-byte UTF-8.
        for valid in ["2026-01-01T00:00:00Z", "2026-01-01T00:00:00.123+01:00"] {
            for wide in ['é', '€', '🦀'] {
                for index in 0..=valid.len() {
                    let inserted = format!("{}{wide}{}", &valid[..index], &valid[index..]);
                    assert_eq!(seconds(&inserted), None, "{inserted:?}");
                    if index < valid.len() {
                        let replaced = format!("{}{wide}{}", &valid[..index], &valid[index + 1..]);
                        assert_eq!(seconds(&replaced), None, "{replaced:?}");
                    }
                }
            }
            // Every prefix, too (truncated annotations).
            for end in 0..valid.len() {
                assert_eq!(seconds(&valid[..end]), None, "{:?}", &valid[..end]);
            }
        }
    }
}
