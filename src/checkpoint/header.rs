//! The safetensors header of one file, parsed and validated completely before
//! any tensor byte is used.
//!
//! Layout: 8-byte little-endian header length `N`, `N` bytes of JSON, then the
//! data. Each JSON entry gives a tensor's dtype, shape and `data_offsets`
//! relative to the end of the header. Everything here is pure (bytes in,
//! entries or a typed error out), so the same code serves the header-only
//! reader, the memory-mapped reader and the fuzz target.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt;

use serde::Deserialize;
use serde::de::{self, MapAccess, Visitor};

use super::dtype::Dtype;

/// Bytes of the little-endian header length that starts every file.
pub const LENGTH_PREFIX_BYTES: u64 = 8;

/// Largest JSON header accepted. The biggest real headers (tens of thousands
/// of tensors) are a few MiB; a larger claim is a corrupt or hostile file, and
/// refusing it up front keeps the reader from allocating what the file claims.
pub const MAX_HEADER_BYTES: u64 = 100 * 1024 * 1024;

/// A header that cannot be trusted. Tensor names are quoted in the message;
/// the caller adds the file.
#[derive(Debug, thiserror::Error)]
pub enum HeaderError {
    #[error("file is {file_len} bytes, too short for the 8-byte header length")]
    TooShort { file_len: u64 },
    #[error("header length {header_len} exceeds the {MAX_HEADER_BYTES}-byte limit")]
    HeaderTooLarge { header_len: u64 },
    #[error("header length {header_len} runs past the end of the {file_len}-byte file")]
    HeaderPastEnd { header_len: u64, file_len: u64 },
    #[error("header is not UTF-8 (invalid byte at header offset {valid_up_to})")]
    NotUtf8 { valid_up_to: usize },
    #[error("header is not a JSON object")]
    NotAnObject,
    /// Not `#[from]`: a source would repeat the message in an error chain.
    #[error("header is not valid JSON: {0}")]
    Json(serde_json::Error),
    #[error("tensor `{tensor}` appears twice in the header")]
    DuplicateName { tensor: String },
    #[error("tensor `{tensor}` has unknown dtype `{dtype}`")]
    UnknownDtype { tensor: String, dtype: String },
    #[error("tensor `{tensor}` has data_offsets [{begin}, {end}] that run backwards")]
    OffsetsReversed {
        tensor: String,
        begin: u64,
        end: u64,
    },
    #[error(
        "tensor `{tensor}` ends at data byte {end}, past the {data_len} data bytes in the file \
         (truncated or lying header)"
    )]
    OffsetsPastEnd {
        tensor: String,
        end: u64,
        data_len: u64,
    },
    #[error("tensor `{tensor}` has shape {shape:?} whose byte size overflows")]
    ShapeOverflow { tensor: String, shape: Vec<usize> },
    #[error(
        "tensor `{tensor}`: shape {shape:?} of {dtype} needs {expected} bytes but data_offsets span {found}"
    )]
    LengthMismatch {
        tensor: String,
        dtype: Dtype,
        shape: Vec<usize>,
        expected: u64,
        found: u64,
    },
    #[error("tensors `{first}` and `{second}` overlap in the data")]
    Overlap { first: String, second: String },
}

/// One validated tensor entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeaderEntry {
    pub name: String,
    pub dtype: Dtype,
    pub shape: Vec<usize>,
    /// Absolute offset of the tensor's first byte in the file.
    pub offset: u64,
    pub byte_len: u64,
}

/// A validated header: every entry lies inside the file, entries do not
/// overlap, names are unique and each byte length matches its shape.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParsedHeader {
    /// `N`, the JSON length.
    pub json_len: u64,
    /// Offset of the first data byte (`8 + N`).
    pub data_start: u64,
    /// Size of the file the header was checked against.
    pub file_len: u64,
    /// Entries sorted by name.
    pub entries: Vec<HeaderEntry>,
    /// The free-form `__metadata__` map.
    pub metadata: BTreeMap<String, String>,
}

/// Reads and checks the 8-byte length prefix: returns `N`, the JSON length,
/// once it is known to fit the limit and the file.
pub fn json_len(file_start: &[u8], file_len: u64) -> Result<u64, HeaderError> {
    let Some(prefix) = file_start.first_chunk::<8>() else {
        return Err(HeaderError::TooShort { file_len });
    };
    if file_len < LENGTH_PREFIX_BYTES {
        return Err(HeaderError::TooShort { file_len });
    }
    let header_len = u64::from_le_bytes(*prefix);
    if header_len > MAX_HEADER_BYTES {
        return Err(HeaderError::HeaderTooLarge { header_len });
    }
    if header_len > file_len - LENGTH_PREFIX_BYTES {
        return Err(HeaderError::HeaderPastEnd {
            header_len,
            file_len,
        });
    }
    Ok(header_len)
}

/// Parses and validates the header of a file of `file_len` bytes whose first
/// bytes are `file_start` (at least the prefix and the JSON; the whole file
/// is fine too).
pub fn parse_header(file_start: &[u8], file_len: u64) -> Result<ParsedHeader, HeaderError> {
    let header_len = json_len(file_start, file_len)?;
    let data_start = LENGTH_PREFIX_BYTES + header_len;
    let json_bytes = usize::try_from(data_start)
        .ok()
        .and_then(|end| file_start.get(LENGTH_PREFIX_BYTES as usize..end))
        .ok_or(HeaderError::HeaderPastEnd {
            header_len,
            file_len: file_start.len() as u64,
        })?;
    let text = std::str::from_utf8(json_bytes).map_err(|e| HeaderError::NotUtf8 {
        valid_up_to: e.valid_up_to(),
    })?;
    if !text.trim_start().starts_with('{') {
        return Err(HeaderError::NotAnObject);
    }
    let raw: RawHeader = serde_json::from_str(text).map_err(HeaderError::Json)?;

    let data_len = file_len - data_start;
    let mut entries = raw
        .entries
        .into_iter()
        .map(|(name, raw_entry)| validate_entry(name, raw_entry, data_start, data_len))
        .collect::<Result<Vec<_>, _>>()?;
    // Sorted by name, equal names are neighbours: no hashing needed.
    entries.sort_unstable_by(|a, b| a.name.cmp(&b.name));
    if let Some(pair) = entries.windows(2).find(|pair| pair[0].name == pair[1].name) {
        return Err(HeaderError::DuplicateName {
            tensor: pair[0].name.clone(),
        });
    }
    check_no_overlap(&entries)?;

    Ok(ParsedHeader {
        json_len: header_len,
        data_start,
        file_len,
        entries,
        metadata: raw.metadata,
    })
}

/// Checks one entry's dtype, offsets and length against the data section.
fn validate_entry(
    name: String,
    raw: RawEntry<'_>,
    data_start: u64,
    data_len: u64,
) -> Result<HeaderEntry, HeaderError> {
    let Some(dtype) = Dtype::from_name(&raw.dtype) else {
        return Err(HeaderError::UnknownDtype {
            tensor: name,
            dtype: raw.dtype.into_owned(),
        });
    };
    let [begin, end] = raw.data_offsets;
    if begin > end {
        return Err(HeaderError::OffsetsReversed {
            tensor: name,
            begin,
            end,
        });
    }
    if end > data_len {
        return Err(HeaderError::OffsetsPastEnd {
            tensor: name,
            end,
            data_len,
        });
    }
    let expected = raw
        .shape
        .iter()
        .try_fold(dtype.size() as u64, |acc, &dim| acc.checked_mul(dim as u64));
    let Some(expected) = expected else {
        return Err(HeaderError::ShapeOverflow {
            tensor: name,
            shape: raw.shape,
        });
    };
    let found = end - begin;
    if expected != found {
        return Err(HeaderError::LengthMismatch {
            tensor: name,
            dtype,
            shape: raw.shape,
            expected,
            found,
        });
    }
    Ok(HeaderEntry {
        name,
        dtype,
        shape: raw.shape,
        // Cannot overflow: begin ≤ data_len = file_len − data_start.
        offset: data_start + begin,
        byte_len: found,
    })
}

/// Rejects any two non-empty tensors sharing a byte.
fn check_no_overlap(entries: &[HeaderEntry]) -> Result<(), HeaderError> {
    let mut by_offset: Vec<&HeaderEntry> = entries.iter().filter(|e| e.byte_len > 0).collect();
    by_offset.sort_by_key(|e| (e.offset, e.byte_len));
    for pair in by_offset.windows(2) {
        let (a, b) = (pair[0], pair[1]);
        if b.offset < a.offset + a.byte_len {
            return Err(HeaderError::Overlap {
                first: a.name.clone(),
                second: b.name.clone(),
            });
        }
    }
    Ok(())
}

/// One tensor entry exactly as the JSON spells it.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawEntry<'a> {
    /// Borrowed from the header text (no allocation per tensor).
    #[serde(borrow)]
    dtype: Cow<'a, str>,
    shape: Vec<usize>,
    data_offsets: [u64; 2],
}

/// The header's entries in file order, duplicates kept (a JSON map type
/// would silently keep only the last of two equal names).
struct RawHeader<'a> {
    entries: Vec<(String, RawEntry<'a>)>,
    metadata: BTreeMap<String, String>,
}

impl<'de> Deserialize<'de> for RawHeader<'de> {
    fn deserialize<D: de::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_map(RawHeaderVisitor)
    }
}

struct RawHeaderVisitor;

impl<'de> Visitor<'de> for RawHeaderVisitor {
    type Value = RawHeader<'de>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object of tensor entries")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<RawHeader<'de>, A::Error> {
        let mut entries = Vec::new();
        let mut metadata = None;
        while let Some(key) = map.next_key::<String>()? {
            if key == "__metadata__" {
                if metadata.is_some() {
                    return Err(de::Error::custom("`__metadata__` appears twice"));
                }
                let value: BTreeMap<String, String> = map
                    .next_value()
                    .map_err(|e| de::Error::custom(format!("`__metadata__`: {e}")))?;
                metadata = Some(value);
            } else {
                if entries.len() >= crate::limits::MAX_TENSORS {
                    return Err(de::Error::custom(format_args!(
                        "more than {} tensors, the limit",
                        crate::limits::MAX_TENSORS
                    )));
                }
                let entry: RawEntry<'de> = map
                    .next_value()
                    .map_err(|e| de::Error::custom(format!("tensor `{key}`: {e}")))?;
                entries.push((key, entry));
            }
        }
        Ok(RawHeader {
            entries,
            metadata: metadata.unwrap_or_default(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(json: &str, data_len: usize) -> Vec<u8> {
        let mut bytes = (json.len() as u64).to_le_bytes().to_vec();
        bytes.extend_from_slice(json.as_bytes());
        bytes.resize(bytes.len() + data_len, 0);
        bytes
    }

    #[test]
    fn valid_header_gives_absolute_offsets_sorted_by_name() {
        let json = r#"{"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]},
                       "a":{"dtype":"BF16","shape":[2],"data_offsets":[0,4]},
                       "__metadata__":{"format":"pt"}}"#;
        let bytes = file(json, 12);
        let h = parse_header(&bytes, bytes.len() as u64).unwrap();
        let start = 8 + json.len() as u64;
        assert_eq!(h.data_start, start);
        assert_eq!(h.entries[0].name, "a");
        assert_eq!(h.entries[0].offset, start);
        assert_eq!(h.entries[1].name, "b");
        assert_eq!((h.entries[1].offset, h.entries[1].byte_len), (start + 4, 8));
        assert_eq!(h.metadata["format"], "pt");
    }

    #[test]
    fn zero_sized_tensors_share_offsets_without_overlapping() {
        let json = r#"{"a":{"dtype":"F32","shape":[0,3],"data_offsets":[0,0]},
                       "b":{"dtype":"F32","shape":[],"data_offsets":[0,4]}}"#;
        let bytes = file(json, 4);
        let h = parse_header(&bytes, bytes.len() as u64).unwrap();
        assert_eq!(h.entries[0].byte_len, 0);
        assert_eq!(h.entries[1].byte_len, 4);
    }

    #[test]
    fn entry_with_extra_field_or_three_offsets_is_refused() {
        for json in [
            r#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4],"x":1}}"#,
            r#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4,4]}}"#,
            r#"{"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}}"#,
            r#"{"a":{"shape":[1],"data_offsets":[0,4]}}"#,
        ] {
            let bytes = file(json, 4);
            let err = parse_header(&bytes, bytes.len() as u64).unwrap_err();
            assert!(matches!(err, HeaderError::Json(_)), "{json}: {err}");
            assert!(err.to_string().contains("tensor `a`"), "{err}");
        }
    }
}
