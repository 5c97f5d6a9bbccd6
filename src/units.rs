//! Byte quantities as people and the kubelet write them, and as sparkrt
//! prints them.
//!
//! One parser serves profiles (`"24GiB"`, `"512MiB"`) and Kubernetes
//! quantities (`"1Gi"`, `"500M"`, `"128974848"`, `"129e6"`, `"1.5Gi"`).
//! Binary suffixes are powers of 1024, decimal ones powers of 1000; a trailing
//! `B` is accepted after either (`GiB`, `GB`). Fractions round up to the next
//! whole byte, as the kubelet does.

use thiserror::Error;

#[derive(Debug, Error, PartialEq, Eq)]
pub enum QuantityError {
    #[error("empty quantity")]
    Empty,
    #[error(
        "{0:?} is not a quantity: expected a number with an optional suffix (Ki, Mi, Gi, Ti, K, M, G, T, or an exponent like 1e9)"
    )]
    Malformed(String),
    #[error(
        "{quantity:?} has an unknown suffix {suffix:?} (use Ki, Mi, Gi, Ti, Pi, Ei, k, K, M, G, T, P, E, optionally followed by B)"
    )]
    UnknownSuffix { quantity: String, suffix: String },
    #[error("{0:?} is negative; a byte count cannot be")]
    Negative(String),
    #[error("{0:?} is too large")]
    Overflow(String),
}

/// Parses a byte quantity into a whole number of bytes (fractions round up).
pub fn parse_bytes(text: &str) -> Result<u64, QuantityError> {
    let s = text.trim();
    if s.is_empty() {
        return Err(QuantityError::Empty);
    }
    if s.starts_with('-') {
        return Err(QuantityError::Negative(s.to_string()));
    }
    let s_unsigned = s.strip_prefix('+').unwrap_or(s);

    // The number is the longest prefix made of digits and at most one '.'.
    let number_end = s_unsigned
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s_unsigned.len());
    let (number, suffix) = s_unsigned.split_at(number_end);
    let decimal = Decimal::parse(number).ok_or_else(|| QuantityError::Malformed(s.to_string()))?;

    // "1E" is an exabyte; "1e9" / "1E9" is an exponent form.
    let scaled = if let Some((base, power)) = suffix_multiplier(suffix) {
        decimal.scale(base, power)
    } else if let Some(exponent) = suffix.strip_prefix(['e', 'E']) {
        let exponent: i32 = exponent
            .parse()
            .map_err(|_| QuantityError::Malformed(s.to_string()))?;
        decimal.scale_pow10(exponent)
    } else {
        return Err(QuantityError::UnknownSuffix {
            quantity: s.to_string(),
            suffix: suffix.to_string(),
        });
    };
    scaled.ok_or_else(|| QuantityError::Overflow(s.to_string()))
}

/// `(base, power)` of a suffix: `Gi` is (1024, 3), `G` is (1000, 3).
fn suffix_multiplier(suffix: &str) -> Option<(u128, u32)> {
    let bare = match suffix {
        "" | "B" => return Some((1, 0)),
        s => s.strip_suffix('B').unwrap_or(s),
    };
    let (letter, binary) = match bare.strip_suffix('i') {
        Some(letter) => (letter, true),
        None => (bare, false),
    };
    let power = match letter {
        "k" | "K" => 1,
        "M" => 2,
        "G" => 3,
        "T" => 4,
        "P" => 5,
        "E" => 6,
        _ => return None,
    };
    Some((if binary { 1024 } else { 1000 }, power))
}

/// An exact non-negative decimal `digits / 10^fraction_digits`.
struct Decimal {
    digits: u128,
    fraction_digits: u32,
}

impl Decimal {
    fn parse(number: &str) -> Option<Decimal> {
        let (int_part, frac_part) = match number.split_once('.') {
            Some((i, f)) => (i, f),
            None => (number, ""),
        };
        if int_part.is_empty() && frac_part.is_empty() {
            return None;
        }
        if frac_part.contains('.') {
            return None;
        }
        let mut digits: u128 = 0;
        for c in int_part.chars().chain(frac_part.chars()) {
            let d = c.to_digit(10)?;
            digits = digits.checked_mul(10)?.checked_add(u128::from(d))?;
        }
        Some(Decimal {
            digits,
            fraction_digits: u32::try_from(frac_part.len()).ok()?,
        })
    }

    /// `self × base^power`, rounded up to a whole number.
    fn scale(&self, base: u128, power: u32) -> Option<u64> {
        let numerator = self.digits.checked_mul(base.checked_pow(power)?)?;
        let denominator = 10u128.checked_pow(self.fraction_digits)?;
        u64::try_from(numerator.div_ceil(denominator)).ok()
    }

    /// `self × 10^exponent`, rounded up to a whole number.
    fn scale_pow10(&self, exponent: i32) -> Option<u64> {
        let shift = i64::from(exponent) - i64::from(self.fraction_digits);
        let value = if shift >= 0 {
            self.digits
                .checked_mul(10u128.checked_pow(u32::try_from(shift).ok()?)?)?
        } else {
            let denominator = 10u128.checked_pow(u32::try_from(-shift).ok()?)?;
            self.digits.div_ceil(denominator)
        };
        u64::try_from(value).ok()
    }
}

pub const KIB: u64 = 1024;
pub const MIB: u64 = 1024 * KIB;
pub const GIB: u64 = 1024 * MIB;

/// How every byte figure prints (`512 B`, `1.50 KiB`, `23.1 MiB`, `123 GiB`):
/// the one rule the monitor shares, defined in the wire crate.
pub use sparkrt_wire::units::format_bytes;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_and_binary_and_decimal_suffixes() {
        assert_eq!(parse_bytes("1024"), Ok(1024));
        assert_eq!(parse_bytes("1Ki"), Ok(1024));
        assert_eq!(parse_bytes("512Mi"), Ok(512 * 1024 * 1024));
        assert_eq!(parse_bytes("24GiB"), Ok(24 * 1024 * 1024 * 1024));
        assert_eq!(parse_bytes("2Ti"), Ok(2 * 1024u64.pow(4)));
        assert_eq!(parse_bytes("1k"), Ok(1000));
        assert_eq!(parse_bytes("1K"), Ok(1000));
        assert_eq!(parse_bytes("500M"), Ok(500_000_000));
        assert_eq!(parse_bytes("3G"), Ok(3_000_000_000));
        assert_eq!(parse_bytes("3GB"), Ok(3_000_000_000));
        assert_eq!(parse_bytes(" 7 "), Ok(7));
    }

    #[test]
    fn exponent_forms_and_fractions_round_up() {
        assert_eq!(parse_bytes("129e6"), Ok(129_000_000));
        assert_eq!(parse_bytes("128974848e0"), Ok(128_974_848));
        assert_eq!(parse_bytes("1.5E3"), Ok(1500));
        assert_eq!(parse_bytes("1.5Gi"), Ok(3 * 512 * 1024 * 1024));
        assert_eq!(parse_bytes("0.1Ki"), Ok(103)); // 102.4 rounds up
        assert_eq!(parse_bytes("15e-1"), Ok(2)); // 1.5 rounds up
        assert_eq!(parse_bytes(".5Ki"), Ok(512));
        assert_eq!(parse_bytes("1E"), Ok(10u64.pow(18)));
    }

    #[test]
    fn bad_quantities_are_errors() {
        assert_eq!(parse_bytes(""), Err(QuantityError::Empty));
        assert!(matches!(
            parse_bytes("12Xi"),
            Err(QuantityError::UnknownSuffix { .. })
        ));
        assert!(matches!(
            parse_bytes("12 parsecs"),
            Err(QuantityError::UnknownSuffix { .. })
        ));
        assert!(matches!(
            parse_bytes("-1Gi"),
            Err(QuantityError::Negative(_))
        ));
        assert!(matches!(
            parse_bytes("Gi"),
            Err(QuantityError::Malformed(_))
        ));
        assert!(matches!(
            parse_bytes("1.2.3"),
            Err(QuantityError::Malformed(_))
        ));
        assert!(matches!(
            parse_bytes("1e"),
            Err(QuantityError::Malformed(_))
        ));
        assert!(matches!(
            parse_bytes("99999Ei"),
            Err(QuantityError::Overflow(_))
        ));
        assert!(matches!(
            parse_bytes("1e400"),
            Err(QuantityError::Overflow(_))
        ));
    }
}
