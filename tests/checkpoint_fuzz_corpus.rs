//! Replays the committed fuzz corpus (`fuzz/corpus/header/`) through the
//! header parser on stable, as CI does: `ok-*` inputs must parse, `bad-*`
//! inputs must be refused, anything else (inputs the fuzzer found) must not
//! panic; every accepted header must be sound.

use std::collections::HashSet;
use std::path::Path;

use sparkrt::checkpoint::header::{ParsedHeader, parse_header};

fn assert_sound(name: &str, header: &ParsedHeader) {
    assert_eq!(header.data_start, 8 + header.json_len, "{name}");
    let mut names = HashSet::new();
    let mut ranges = Vec::new();
    for entry in &header.entries {
        assert!(
            names.insert(entry.name.as_str()),
            "{name}: duplicate {}",
            entry.name
        );
        let end = entry.offset + entry.byte_len;
        assert!(
            entry.offset >= header.data_start && end <= header.file_len,
            "{name}"
        );
        let elements: u64 = entry.shape.iter().map(|&d| d as u64).product();
        assert_eq!(
            elements * entry.dtype.size() as u64,
            entry.byte_len,
            "{name}"
        );
        if entry.byte_len > 0 {
            ranges.push((entry.offset, end));
        }
    }
    ranges.sort_unstable();
    assert!(
        ranges.windows(2).all(|w| w[0].1 <= w[1].0),
        "{name}: overlap"
    );
}

#[test]
fn corpus_replays_with_the_expected_outcomes() {
    let corpus = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/header");
    let (mut ok, mut bad) = (0, 0);
    for entry in std::fs::read_dir(&corpus).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let bytes = std::fs::read(&path).unwrap();
        let result = parse_header(&bytes, bytes.len() as u64);
        if name.starts_with("ok-") {
            let header = result.unwrap_or_else(|e| panic!("{name} should parse: {e}"));
            assert_sound(&name, &header);
            ok += 1;
        } else if name.starts_with("bad-") {
            assert!(result.is_err(), "{name} should be refused");
            bad += 1;
        } else if let Ok(header) = result {
            assert_sound(&name, &header);
        }
    }
    assert!(
        ok >= 5 && bad >= 15,
        "corpus incomplete: {ok} ok, {bad} bad"
    );
}
