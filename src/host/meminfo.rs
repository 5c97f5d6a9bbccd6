//! `/proc/meminfo`: the host's own view of the unified pool.
//!
//! `MemAvailable` is the figure that matters on a Spark: it counts page cache
//! as reclaimable, unlike `cudaMemGetInfo`'s free figure.

use serde::{Deserialize, Serialize};

use super::cgroup::CgroupMemory;
use super::error::HostError;

/// The fields of `/proc/meminfo` sparkrt uses, in bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemInfo {
    pub mem_total: u64,
    pub mem_available: u64,
    pub mem_free: u64,
    pub cached: u64,
    pub buffers: u64,
    pub shmem: u64,
    pub swap_total: u64,
    pub swap_free: u64,
    /// Pages the kernel cannot reclaim (mlocked, ramfs, ...), left out of
    /// MemAvailable; 0 where the kernel does not report it.
    #[serde(default)]
    pub unevictable: u64,
    /// Of those, mlocked; 0 where not reported.
    #[serde(default)]
    pub mlocked: u64,
}

impl MemInfo {
    /// The wire form of this reading (`/v1/memory`'s `host`, the monitor's
    /// local reading), with the kubepods cgroup and the kubelet's figures
    /// (`system_reserved`, `kube_reserved`, `eviction_hard`) it is drawn
    /// against. The monitor-side `usable` is left for the caller.
    pub fn to_wire(
        &self,
        kubepods: Option<&CgroupMemory>,
        [system_reserved, kube_reserved, eviction_hard]: [u64; 3],
    ) -> sparkrt_wire::HostSnapshot {
        sparkrt_wire::HostSnapshot {
            mem_total: self.mem_total,
            mem_available: self.mem_available,
            mem_free: self.mem_free,
            cached: self.cached,
            buffers: self.buffers,
            shmem: self.shmem,
            swap_total: self.swap_total,
            swap_free: self.swap_free,
            kubepods_current: kubepods.map(|c| c.current),
            kubepods_max: kubepods.and_then(|c| c.max),
            system_reserved,
            kube_reserved,
            eviction_hard,
            usable: None,
            gpu_processes: Vec::new(),
        }
    }

    /// What the rest of the host uses: MemTotal − MemAvailable.
    pub fn in_use(&self) -> u64 {
        self.mem_total.saturating_sub(self.mem_available)
    }

    /// Parses the text of `/proc/meminfo`. `source` names the file in errors.
    pub fn parse(text: &str, source: &str) -> Result<MemInfo, HostError> {
        let mut fields: [Option<u64>; FIELDS.len()] = [None; FIELDS.len()];
        for (index, line) in text.lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            let malformed = |why: &str| HostError::Malformed {
                file: source.to_string(),
                line: index + 1,
                why: format!("{why}: {line:?}"),
            };
            let (key, rest) = line
                .split_once(':')
                .ok_or_else(|| malformed("expected `Key: value kB`"))?;
            let Some(slot) = FIELDS.iter().position(|&name| name == key.trim()) else {
                continue; // a field sparkrt does not use
            };
            let mut words = rest.split_whitespace();
            let value: u64 = words
                .next()
                .and_then(|v| v.parse().ok())
                .ok_or_else(|| malformed("expected a whole number"))?;
            let bytes = match words.next() {
                Some("kB") => value.checked_mul(1024),
                None => Some(value),
                Some(_) => return Err(malformed("expected the unit kB")),
            }
            .ok_or_else(|| malformed("value too large"))?;
            fields[slot] = Some(bytes);
        }
        let get = |slot: usize| {
            fields[slot].ok_or_else(|| HostError::MissingField {
                file: source.to_string(),
                field: FIELDS[slot].to_string(),
            })
        };
        let info = MemInfo {
            mem_total: get(0)?,
            mem_available: get(1)?,
            mem_free: get(2)?,
            cached: get(3)?,
            buffers: get(4)?,
            shmem: get(5)?,
            swap_total: get(6)?,
            swap_free: get(7)?,
            unevictable: fields[8].unwrap_or(0),
            mlocked: fields[9].unwrap_or(0),
        };
        if info.mem_available > info.mem_total || info.mem_free > info.mem_total {
            return Err(HostError::Inconsistent {
                file: source.to_string(),
                why: "MemAvailable or MemFree exceeds MemTotal".to_string(),
            });
        }
        Ok(info)
    }
}

/// The required fields, then the optional ones (`Unevictable`, `Mlocked`).
const FIELDS: [&str; 10] = [
    "MemTotal",
    "MemAvailable",
    "MemFree",
    "Cached",
    "Buffers",
    "Shmem",
    "SwapTotal",
    "SwapFree",
    "Unevictable",
    "Mlocked",
];

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "MemTotal:       127629360 kB\nMemFree:        100000000 kB\nMemAvailable:   120000000 kB\nBuffers:            1024 kB\nCached:          2048000 kB\nSwapCached:            0 kB\nShmem:             10000 kB\nSwapTotal:             0 kB\nSwapFree:              0 kB\nHugePages_Total:       0\n";

    #[test]
    fn parses_kb_fields_into_bytes() {
        let info = MemInfo::parse(SAMPLE, "meminfo").unwrap();
        assert_eq!(info.mem_total, 127_629_360 * 1024);
        assert_eq!(info.mem_available, 120_000_000 * 1024);
        assert_eq!(info.mem_free, 100_000_000 * 1024);
        assert_eq!(info.buffers, 1024 * 1024);
        assert_eq!(info.cached, 2_048_000 * 1024);
        assert_eq!(info.shmem, 10_000 * 1024);
        assert_eq!(info.in_use(), (127_629_360 - 120_000_000) * 1024);
    }

    #[test]
    fn unevictable_and_mlocked_are_read_when_present_and_zero_when_not() {
        let info = MemInfo::parse(SAMPLE, "meminfo").unwrap();
        assert_eq!((info.unevictable, info.mlocked), (0, 0));
        let text = format!("{SAMPLE}Unevictable:     2048 kB\nMlocked:          512 kB\n");
        let info = MemInfo::parse(&text, "meminfo").unwrap();
        assert_eq!((info.unevictable, info.mlocked), (2048 * 1024, 512 * 1024));
    }

    #[test]
    fn missing_field_is_named() {
        let text = SAMPLE.replace("MemAvailable:   120000000 kB\n", "");
        let err = MemInfo::parse(&text, "meminfo").unwrap_err();
        assert!(err.to_string().contains("MemAvailable"), "{err}");
    }

    #[test]
    fn garbage_is_an_error_with_a_line_number() {
        let err = MemInfo::parse("MemTotal: lots kB\n", "meminfo").unwrap_err();
        assert!(err.to_string().contains("meminfo:1"), "{err}");
        let err = MemInfo::parse("MemTotal 12 kB\n", "meminfo").unwrap_err();
        assert!(err.to_string().contains("meminfo:1"), "{err}");
        let err = MemInfo::parse("MemTotal: 12 MB\n", "meminfo").unwrap_err();
        assert!(err.to_string().contains("kB"), "{err}");
    }

    #[test]
    fn available_above_total_is_inconsistent() {
        let text = SAMPLE.replace("MemAvailable:   120000000", "MemAvailable:   999999999");
        assert!(matches!(
            MemInfo::parse(&text, "m"),
            Err(HostError::Inconsistent { .. })
        ));
    }
}
