//! Fuzzes the safetensors header parser: whatever the bytes, it must return
//! an error or a header whose every tensor lies inside the file, without
//! overlap, with a byte length matching its shape, and never panic.
#![no_main]

use std::collections::HashSet;

use libfuzzer_sys::fuzz_target;
use sparkrt::checkpoint::header::{ParsedHeader, parse_header};

fuzz_target!(|data: &[u8]| {
    // As a whole file: length prefix, JSON, data.
    if let Ok(header) = parse_header(data, data.len() as u64) {
        assert_sound(&header);
    }
    // As the JSON alone, behind a correct length prefix and 64 data bytes,
    // so mutations spend their time inside the JSON.
    let mut file = (data.len() as u64).to_le_bytes().to_vec();
    file.extend_from_slice(data);
    file.resize(file.len() + 64, 0);
    if let Ok(header) = parse_header(&file, file.len() as u64) {
        assert_sound(&header);
    }
});

fn assert_sound(header: &ParsedHeader) {
    assert_eq!(header.data_start, 8 + header.json_len);
    assert!(header.data_start <= header.file_len);
    let mut names = HashSet::new();
    let mut ranges = Vec::new();
    for entry in &header.entries {
        assert!(
            names.insert(entry.name.as_str()),
            "duplicate {}",
            entry.name
        );
        let end = entry.offset + entry.byte_len;
        assert!(entry.offset >= header.data_start && end <= header.file_len);
        let elements: u64 = entry.shape.iter().map(|&d| d as u64).product();
        assert_eq!(elements * entry.dtype.size() as u64, entry.byte_len);
        if entry.byte_len > 0 {
            ranges.push((entry.offset, end));
        }
    }
    ranges.sort_unstable();
    assert!(ranges.windows(2).all(|w| w[0].1 <= w[1].0), "overlap");
}
