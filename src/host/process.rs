//! This process's own memory, from `/proc/self/status`.

/// Resident set size now (`VmRSS`), 0 where unknown.
pub fn rss_bytes() -> u64 {
    status_kb("VmRSS:")
}

/// Peak resident set size (`VmHWM`), 0 where unknown.
pub fn peak_rss_bytes() -> u64 {
    status_kb("VmHWM:")
}

fn status_kb(field: &str) -> u64 {
    crate::util::files::read_regular_to_string(
        std::path::Path::new("/proc/self/status"),
        crate::limits::MAX_HOST_FILE_BYTES,
    )
    .ok()
    .and_then(|s| {
        s.lines()
            .find(|l| l.starts_with(field))
            .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
    })
    .map_or(0, |kb| kb * 1024)
}
