//! Byte figures as every sparkrt surface prints them: the monitor
//! (`sparkrt top`), `sparkrt plan`'s text and `serve`'s start-up summary.
//! Defined here, in the crate both the root crate and the monitor depend on,
//! so the one rule is written once.
//!
//! The rule: a count under one kilo-unit is whole bytes (`512 B`, `1023 B`);
//! anything larger is scaled to the largest unit (KiB, MiB, GiB, TiB, or kB,
//! MB, GB, TB in decimal) that keeps the figure at least 1, and shown with
//! three significant digits (`1.50 KiB`, `23.1 MiB`, `123 GiB`). A figure that
//! would round to 1000 or more moves up a unit (`0.98 MiB`, not `1000 KiB`),
//! so no figure is wider than four characters plus its unit, except past
//! 999 TiB, the largest unit.

/// Which units byte figures are shown in: powers of 1024 (KiB…) or of 1000
/// (kB…). The monitor's `u` key toggles it; the CLI prints binary.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ByteUnits {
    #[default]
    Binary,
    Decimal,
}

impl ByteUnits {
    pub fn toggled(self) -> ByteUnits {
        match self {
            ByteUnits::Binary => ByteUnits::Decimal,
            ByteUnits::Decimal => ByteUnits::Binary,
        }
    }

    /// In words, for a status line: `binary` or `decimal`.
    pub fn name(self) -> &'static str {
        match self {
            ByteUnits::Binary => "binary",
            ByteUnits::Decimal => "decimal",
        }
    }

    fn base(self) -> f64 {
        match self {
            ByteUnits::Binary => 1024.0,
            ByteUnits::Decimal => 1000.0,
        }
    }

    /// The scaled units above bytes, smallest first.
    fn suffixes(self) -> [&'static str; 4] {
        match self {
            ByteUnits::Binary => ["KiB", "MiB", "GiB", "TiB"],
            ByteUnits::Decimal => ["kB", "MB", "GB", "TB"],
        }
    }

    /// `bytes` by the rule above: `512 B`, `1.50 KiB`, `23.1 MiB`, `123 GiB`.
    pub fn format(self, bytes: u64) -> String {
        let base = self.base();
        if (bytes as f64) < base {
            return format!("{bytes} B");
        }
        let suffixes = self.suffixes();
        let mut value = bytes as f64 / base;
        let mut unit = 0;
        // Move up while the figure would print with four digits.
        while value >= 999.5 && unit + 1 < suffixes.len() {
            value /= base;
            unit += 1;
        }
        // Decimals for three significant digits, judged on the rounded
        // figure (9.996 prints as `10.0`, not `10.00`).
        let decimals = if value >= 99.95 {
            0
        } else if value >= 9.995 {
            1
        } else {
            2
        };
        format!("{value:.decimals$} {}", suffixes[unit])
    }

    /// A signed figure (the eviction margin can be negative): the magnitude
    /// by the same rule, with a minus sign when below zero.
    pub fn format_signed(self, bytes: i128) -> String {
        let magnitude = u64::try_from(bytes.unsigned_abs()).unwrap_or(u64::MAX);
        if bytes < 0 {
            format!("-{}", self.format(magnitude))
        } else {
            self.format(magnitude)
        }
    }
}

/// `bytes` in binary units by the rule above; what the CLI prints.
pub fn format_bytes(bytes: u64) -> String {
    ByteUnits::Binary.format(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    const KIB: u64 = 1024;
    const MIB: u64 = 1024 * KIB;
    const GIB: u64 = 1024 * MIB;
    const TIB: u64 = 1024 * GIB;

    #[test]
    fn whole_bytes_below_one_kibibyte() {
        assert_eq!(format_bytes(0), "0 B");
        assert_eq!(format_bytes(1), "1 B");
        assert_eq!(format_bytes(512), "512 B");
        assert_eq!(format_bytes(1023), "1023 B");
    }

    #[test]
    fn three_significant_digits_in_binary_units() {
        assert_eq!(format_bytes(1024), "1.00 KiB");
        assert_eq!(format_bytes(1536), "1.50 KiB");
        // 10 MiB + 300 KiB = 10.29 MiB.
        assert_eq!(format_bytes(10 * MIB + 300 * KIB), "10.3 MiB");
        // 23.1 MiB = 24_222_105.6 bytes; 24_222_106 rounds back to 23.1.
        assert_eq!(format_bytes(24_222_106), "23.1 MiB");
        assert_eq!(format_bytes(GIB + 400 * MIB), "1.39 GiB");
        assert_eq!(format_bytes(GIB + 410 * MIB), "1.40 GiB");
        assert_eq!(format_bytes(100 * GIB), "100 GiB");
        // 123.4 GiB: three digits, no decimals.
        assert_eq!(format_bytes(123 * GIB + 2 * GIB / 5), "123 GiB");
        assert_eq!(format_bytes(3 * TIB / 2), "1.50 TiB");
        // TiB is the largest unit: past it the figure just grows.
        assert_eq!(format_bytes(2048 * TIB), "2048 TiB");
    }

    #[test]
    fn rounding_never_adds_a_digit() {
        // 9.996 KiB would be `10.00` with two decimals.
        assert_eq!(format_bytes(10_236), "10.0 KiB");
        // 99.96 KiB would be `100.0`.
        assert_eq!(format_bytes(102_359), "100 KiB");
        // 999.6 KiB would be `1000`: up a unit, 0.976 MiB.
        assert_eq!(format_bytes(1_023_590), "0.98 MiB");
        assert_eq!(format_bytes(MIB - 1), "1.00 MiB");
        assert_eq!(format_bytes(999 * KIB), "999 KiB");
    }

    #[test]
    fn decimal_units_are_powers_of_1000() {
        let d = ByteUnits::Decimal;
        assert_eq!(d.format(999), "999 B");
        assert_eq!(d.format(1000), "1.00 kB");
        assert_eq!(d.format(1536), "1.54 kB");
        assert_eq!(d.format(1_500_000_000), "1.50 GB");
        // 3 GiB = 3_221_225_472 bytes = 3.22 GB.
        assert_eq!(d.format(3 * GIB), "3.22 GB");
        // 128 GiB = 137.4 GB.
        assert_eq!(d.format(128 * GIB), "137 GB");
        assert_eq!(d.format(42_000_000_000_000), "42.0 TB");
    }

    #[test]
    fn signed_figures_carry_the_sign() {
        let b = ByteUnits::Binary;
        assert_eq!(b.format_signed(-i128::from(3 * GIB / 2)), "-1.50 GiB");
        assert_eq!(b.format_signed(-512), "-512 B");
        assert_eq!(b.format_signed(0), "0 B");
        assert_eq!(b.format_signed(i128::from(24 * GIB)), "24.0 GiB");
    }

    #[test]
    fn toggle_swaps_units() {
        assert_eq!(ByteUnits::Binary.toggled(), ByteUnits::Decimal);
        assert_eq!(ByteUnits::Decimal.toggled(), ByteUnits::Binary);
    }
}
