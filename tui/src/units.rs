//! Byte figures as the monitor prints them: binary (GiB) or decimal (GB) units.
//!
//! The root crate has its own quantity parser; the monitor only needs to
//! format, and it cannot depend on the root crate, so this is a few lines here.

const GIB: f64 = 1024.0 * 1024.0 * 1024.0;
const GB: f64 = 1e9;

/// Which unit byte figures are shown in; `u` toggles it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Units {
    #[default]
    Gib,
    Gb,
}

impl Units {
    pub fn toggled(self) -> Units {
        match self {
            Units::Gib => Units::Gb,
            Units::Gb => Units::Gib,
        }
    }

    pub fn suffix(self) -> &'static str {
        match self {
            Units::Gib => "GiB",
            Units::Gb => "GB",
        }
    }

    fn divisor(self) -> f64 {
        match self {
            Units::Gib => GIB,
            Units::Gb => GB,
        }
    }

    /// `bytes` as a plain number in this unit (used for chart axes).
    pub fn value(self, bytes: f64) -> f64 {
        bytes / self.divisor()
    }

    /// `bytes` with one decimal and the unit: `12.5 GiB`.
    pub fn format(self, bytes: u64) -> String {
        format!("{:.1} {}", self.value(bytes as f64), self.suffix())
    }

    /// A signed quantity (the eviction margin can be negative): `-1.5 GiB`.
    pub fn format_signed(self, bytes: i128) -> String {
        format!("{:.1} {}", self.value(bytes as f64), self.suffix())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_binary_and_decimal_units() {
        // 3 GiB = 3 × 2^30 = 3_221_225_472 bytes = 3.2 GB.
        assert_eq!(Units::Gib.format(3 * 1024 * 1024 * 1024), "3.0 GiB");
        assert_eq!(Units::Gb.format(3 * 1024 * 1024 * 1024), "3.2 GB");
        assert_eq!(Units::Gb.format(1_500_000_000), "1.5 GB");
        assert_eq!(
            Units::Gib.format_signed(-(1024 * 1024 * 1024) / 2 * 3),
            "-1.5 GiB"
        );
    }

    #[test]
    fn toggle_swaps_units() {
        assert_eq!(Units::Gib.toggled(), Units::Gb);
        assert_eq!(Units::Gb.toggled(), Units::Gib);
    }
}
