//! Kubernetes resource quantities (`500m`, `1.5`, `512Mi`, `1e3`): checked
//! once, at the edge, so a bad value is a clear error before anything is
//! created. The original text is kept for the manifest (the API server
//! accepts what it wrote); the parsed value, in nano-units, is for
//! comparisons such as "a memory limit raises the memory request".

use std::cmp::Ordering;
use std::fmt;

/// A checked quantity: its text as given and its value in nano-units
/// (1 CPU = 10^9, 1 byte = 10^9). i128 holds 2^63 Ei without overflow.
#[derive(Clone, Debug)]
pub struct Quantity {
    text: String,
    nanos: i128,
}

impl Quantity {
    pub fn parse(text: &str) -> Result<Quantity, QuantityError> {
        let error = || QuantityError { text: text.to_string() };
        let trimmed = text.trim();
        if trimmed.is_empty() || trimmed.len() > 64 {
            return Err(error());
        }
        let number_end = trimmed.find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+')).unwrap_or(trimmed.len());
        let (number, suffix) = trimmed.split_at(number_end);
        let (mantissa_nanos, exponent) = parse_number(number).ok_or_else(error)?;
        let scale = suffix_scale(suffix).ok_or_else(error)?;
        let nanos = match scale {
            Scale::Binary(power) => mantissa_nanos.checked_mul(1i128 << power),
            Scale::Decimal(power) => scale_by_ten(mantissa_nanos, power + exponent),
        }
        .ok_or_else(error)?;
        Ok(Quantity { text: trimmed.to_string(), nanos })
    }

    pub fn as_str(&self) -> &str {
        &self.text
    }

    pub fn nanos(&self) -> i128 {
        self.nanos
    }

    /// True for quantities that round to nothing at all (`0`, `0Mi`).
    pub fn is_zero(&self) -> bool {
        self.nanos == 0
    }
}

/// Which resource a quantity limits, for the range check below.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Resource {
    Cpu,
    Memory,
}

impl Resource {
    pub fn name(self) -> &'static str {
        match self {
            Resource::Cpu => "cpu",
            Resource::Memory => "memory",
        }
    }
}

/// A memory limit below this cannot start a container runtime's shim and
/// a program; a bare number is bytes, so `64` (a typo for `64Mi`) is
/// refused here instead of failing at container start.
const MIN_MEMORY_BYTES: i128 = 16 << 20;
const MAX_MEMORY_BYTES: i128 = 1 << 40;
/// Kubernetes keeps CPU to the millicore; below that a limit is rounded
/// up or refused by the API server.
const MIN_CPU_MILLIS: i128 = 1;
const MAX_CPU_CORES: i128 = 1024;

impl Quantity {
    /// `text` as a limit of `resource`, with the message a settings file's
    /// field gets (`MCP_K8S_LANGUAGES`, `MCP_K8S_WARM_POOLS`).
    pub fn parse_limit(text: &str, resource: Resource) -> Result<Quantity, String> {
        let quantity = Quantity::parse(text)
            .map_err(|_| format!("`{}` is not a Kubernetes quantity such as 500m or 512Mi", crate::echo::shorten(text)))?;
        quantity.check_limit(resource).map_err(|why| format!("`{}` {why}", quantity.as_str()))?;
        Ok(quantity)
    }

    /// A limit the kubelet can apply and a node can have (an earlier
    /// build passed `1m` of memory, `1Pi`, `1E` CPUs and `1e-30`).
    /// The same range holds for a caller's `limits` and the operator's
    /// defaults. Quantities are in nano-units: 10^9 per byte or per core.
    pub fn check_limit(&self, resource: Resource) -> Result<(), String> {
        const NANOS: i128 = 1_000_000_000;
        let nanos = self.nanos;
        match resource {
            Resource::Memory if nanos < MIN_MEMORY_BYTES * NANOS => Err(
                "is below the minimum of 16Mi (a bare number is bytes: `64` is 64 bytes; write `64Mi` for mebibytes, `1Gi` for gibibytes)"
                    .to_string(),
            ),
            Resource::Memory if nanos > MAX_MEMORY_BYTES * NANOS => Err("is over the maximum of 1Ti".to_string()),
            Resource::Cpu if nanos < MIN_CPU_MILLIS * NANOS / 1000 => {
                Err("is below the minimum of 1m (one thousandth of a core, the finest Kubernetes keeps)".to_string())
            }
            Resource::Cpu if nanos > MAX_CPU_CORES * NANOS => Err(format!("is over the maximum of {MAX_CPU_CORES} cores")),
            _ => Ok(()),
        }
    }
}

impl PartialEq for Quantity {
    fn eq(&self, other: &Quantity) -> bool {
        self.nanos == other.nanos
    }
}

impl PartialOrd for Quantity {
    fn partial_cmp(&self, other: &Quantity) -> Option<Ordering> {
        Some(self.nanos.cmp(&other.nanos))
    }
}

impl fmt::Display for Quantity {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str(&self.text)
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct QuantityError {
    pub text: String,
}

impl fmt::Display for QuantityError {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            formatter,
            "`{}` is not a Kubernetes quantity; use a number with an optional suffix, e.g. `500m`, `2`, `512Mi`, `1Gi`",
            self.text
        )
    }
}

enum Scale {
    Binary(u32),
    Decimal(i32),
}

fn suffix_scale(suffix: &str) -> Option<Scale> {
    Some(match suffix {
        "Ki" => Scale::Binary(10),
        "Mi" => Scale::Binary(20),
        "Gi" => Scale::Binary(30),
        "Ti" => Scale::Binary(40),
        "Pi" => Scale::Binary(50),
        "Ei" => Scale::Binary(60),
        "n" => Scale::Decimal(-9),
        "u" => Scale::Decimal(-6),
        "m" => Scale::Decimal(-3),
        "" => Scale::Decimal(0),
        "k" => Scale::Decimal(3),
        "M" => Scale::Decimal(6),
        "G" => Scale::Decimal(9),
        "T" => Scale::Decimal(12),
        "P" => Scale::Decimal(15),
        "E" => Scale::Decimal(18),
        _ => return decimal_exponent(suffix).map(Scale::Decimal),
    })
}

/// `e3` / `E-2` style exponents, which Kubernetes also accepts.
fn decimal_exponent(suffix: &str) -> Option<i32> {
    let digits = suffix.strip_prefix(['e', 'E'])?;
    let value: i32 = digits.parse().ok()?;
    (-30..=30).contains(&value).then_some(value)
}

/// Parses `12`, `1.5`, `+3` into (value × 10^9 rounded up, extra exponent).
/// Negative quantities are refused: nothing in a run may be negative.
fn parse_number(number: &str) -> Option<(i128, i32)> {
    let number = number.strip_prefix('+').unwrap_or(number);
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    if whole.is_empty() && fraction.is_empty() {
        return None;
    }
    if !whole.bytes().all(|b| b.is_ascii_digit()) || !fraction.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    if whole.len() > 24 || fraction.len() > 24 {
        return None;
    }
    let whole_value: i128 = if whole.is_empty() { 0 } else { whole.parse().ok()? };
    let mut value = whole_value.checked_mul(1_000_000_000)?;
    // Each fraction digit below nano resolution rounds up, as Kubernetes
    // rounds quantities up to its smallest unit.
    let mut place = 100_000_000i128;
    for digit in fraction.bytes() {
        let digit = i128::from(digit - b'0');
        if place == 0 {
            if digit > 0 {
                value += 1;
                break;
            }
            continue;
        }
        value += digit * place;
        place /= 10;
    }
    Some((value, 0))
}

fn scale_by_ten(value: i128, power: i32) -> Option<i128> {
    if power >= 0 {
        value.checked_mul(10i128.checked_pow(power as u32)?)
    } else {
        let divisor = 10i128.checked_pow(power.unsigned_abs())?;
        Some((value + divisor - 1) / divisor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn valid_quantities_in_nano_units() {
        let cases: &[(&str, i128)] = &[
            ("1", 1_000_000_000),
            ("500m", 500_000_000),
            ("0.5", 500_000_000),
            (".5", 500_000_000),
            ("2k", 2_000_000_000_000),
            ("512Mi", 512 * (1 << 20) * 1_000_000_000),
            ("1Gi", (1 << 30) * 1_000_000_000),
            ("1e3", 1_000_000_000_000),
            ("1.5Gi", 3 * (1 << 29) * 1_000_000_000),
            ("1n", 1),
            ("0", 0),
            ("+2", 2_000_000_000),
        ];
        for (text, nanos) in cases {
            let quantity = Quantity::parse(text).unwrap_or_else(|e| panic!("{text}: {e}"));
            assert_eq!(quantity.nanos(), *nanos, "{text}");
            assert_eq!(quantity.as_str(), *text);
        }
    }

    #[test]
    fn invalid_quantities_are_refused_with_a_hint() {
        for text in ["", "abc", "-1", "1 Gi", "1GB", "1.2.3", "Mi", "1e99", "1ki", "9999999999999999999999999999Ei"] {
            let error = Quantity::parse(text).expect_err(text);
            assert!(error.to_string().contains("512Mi"), "{error}");
        }
    }

    #[test]
    fn comparisons_use_the_value_not_the_text() {
        assert!(Quantity::parse("1Gi").unwrap() > Quantity::parse("1000Mi").unwrap());
        assert!(Quantity::parse("1").unwrap() == Quantity::parse("1000m").unwrap());
    }
}
