//! Files that lie: each one crafted by hand, each refused with an error that
//! names the file (and the tensor where there is one), by both readers, and
//! never a panic.

use std::path::{Path, PathBuf};

use sparkrt::checkpoint::{Checkpoint, CheckpointError, HeaderError, read_headers};

/// A safetensors file from a header JSON and `data_len` zero bytes.
fn craft(json: &str, data_len: usize) -> Vec<u8> {
    craft_with_len(json.len() as u64, json.as_bytes(), data_len)
}

/// A file whose length prefix says `claimed` whatever the header really is.
fn craft_with_len(claimed: u64, header: &[u8], data_len: usize) -> Vec<u8> {
    let mut bytes = claimed.to_le_bytes().to_vec();
    bytes.extend_from_slice(header);
    bytes.resize(bytes.len() + data_len, 0);
    bytes
}

/// A model folder with one `model.safetensors` holding `bytes`.
fn single_file_dir(bytes: &[u8]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("model.safetensors"), bytes).unwrap();
    dir
}

/// Both readers refuse the folder with the same message; returns the
/// header-only reader's error and that message.
fn refused(dir: &Path) -> (CheckpointError, String) {
    let from_headers = read_headers(dir).unwrap_err();
    let from_map = Checkpoint::open(dir).unwrap_err();
    let message = from_headers.to_string();
    assert_eq!(
        message,
        from_map.to_string(),
        "both readers share one validation"
    );
    (from_headers, message)
}

fn header_error(err: CheckpointError) -> (PathBuf, HeaderError) {
    match err {
        CheckpointError::Header { path, source } => (path, source),
        other => panic!("expected a header error, got {other}"),
    }
}

fn assert_names(message: &str, parts: &[&str]) {
    for part in parts {
        assert!(message.contains(part), "`{message}` should name `{part}`");
    }
}

#[test]
fn offsets_past_the_end_are_refused() {
    let dir = single_file_dir(&craft(
        r#"{"w":{"dtype":"F32","shape":[16],"data_offsets":[0,64]}}"#,
        32,
    ));
    let (err, message) = refused(dir.path());
    let (path, source) = header_error(err);
    assert_eq!(path, dir.path().join("model.safetensors"));
    assert!(matches!(
        source,
        HeaderError::OffsetsPastEnd {
            end: 64,
            data_len: 32,
            ..
        }
    ));
    assert_names(&message, &["model.safetensors", "`w`"]);
}

#[test]
fn overlapping_ranges_are_refused() {
    let dir = single_file_dir(&craft(
        r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},
            "b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}"#,
        12,
    ));
    let (err, message) = refused(dir.path());
    assert!(matches!(header_error(err).1, HeaderError::Overlap { .. }));
    assert_names(&message, &["model.safetensors", "`a`", "`b`", "overlap"]);
}

#[test]
fn a_tensor_nested_inside_another_is_an_overlap() {
    let dir = single_file_dir(&craft(
        r#"{"outer":{"dtype":"U8","shape":[16],"data_offsets":[0,16]},
            "inner":{"dtype":"U8","shape":[2],"data_offsets":[4,6]}}"#,
        16,
    ));
    let (err, _) = refused(dir.path());
    assert!(matches!(header_error(err).1, HeaderError::Overlap { .. }));
}

#[test]
fn shape_that_disagrees_with_the_byte_length_is_refused() {
    let dir = single_file_dir(&craft(
        r#"{"w":{"dtype":"BF16","shape":[3,4],"data_offsets":[0,16]}}"#,
        16,
    ));
    let (err, message) = refused(dir.path());
    let source = header_error(err).1;
    assert!(
        matches!(
            source,
            HeaderError::LengthMismatch {
                expected: 24,
                found: 16,
                ..
            }
        ),
        "{source}"
    );
    assert_names(&message, &["model.safetensors", "`w`", "24", "16"]);
}

#[test]
fn shape_whose_size_overflows_is_refused() {
    let dir = single_file_dir(&craft(
        r#"{"w":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,4]}}"#,
        4,
    ));
    let (err, message) = refused(dir.path());
    assert!(matches!(
        header_error(err).1,
        HeaderError::ShapeOverflow { .. }
    ));
    assert_names(&message, &["`w`", "overflows"]);
}

#[test]
fn backwards_offsets_are_refused() {
    let dir = single_file_dir(&craft(
        r#"{"w":{"dtype":"U8","shape":[0],"data_offsets":[8,4]}}"#,
        8,
    ));
    let (err, _) = refused(dir.path());
    assert!(matches!(
        header_error(err).1,
        HeaderError::OffsetsReversed {
            begin: 8,
            end: 4,
            ..
        }
    ));
}

#[test]
fn header_length_larger_than_the_file_is_refused() {
    let json = r#"{"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}"#;
    let bytes = craft_with_len(json.len() as u64 + 100, json.as_bytes(), 1);
    let file_len = bytes.len() as u64;
    let dir = single_file_dir(&bytes);
    let (err, message) = refused(dir.path());
    let source = header_error(err).1;
    assert!(
        matches!(source, HeaderError::HeaderPastEnd { file_len: f, .. } if f == file_len),
        "{source}"
    );
    assert_names(&message, &["model.safetensors", "past the end"]);
}

#[test]
fn header_length_claiming_gigabytes_is_refused_before_allocating() {
    for claimed in [5u64 << 30, u64::MAX] {
        let dir = single_file_dir(&craft_with_len(claimed, b"{}", 0));
        let (err, message) = refused(dir.path());
        let source = header_error(err).1;
        assert!(
            matches!(source, HeaderError::HeaderTooLarge { header_len } if header_len == claimed),
            "{source}"
        );
        assert_names(&message, &["model.safetensors", "limit"]);
    }
}

#[test]
fn file_shorter_than_the_length_prefix_is_refused() {
    for len in [0usize, 1, 7] {
        let dir = single_file_dir(&vec![0u8; len]);
        let (err, _) = refused(dir.path());
        assert!(matches!(
            header_error(err).1,
            HeaderError::TooShort { file_len } if file_len == len as u64
        ));
    }
}

#[test]
fn non_utf8_header_is_refused() {
    let header = b"{\"w\xff\xfe\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}";
    let dir = single_file_dir(&craft_with_len(header.len() as u64, header, 1));
    let (err, message) = refused(dir.path());
    assert!(matches!(
        header_error(err).1,
        HeaderError::NotUtf8 { valid_up_to: 3 }
    ));
    assert_names(&message, &["model.safetensors", "UTF-8"]);
}

#[test]
fn non_object_json_is_refused() {
    for json in ["[1,2,3]", "\"tensors\"", "null", "42", "", "   "] {
        let dir = single_file_dir(&craft(json, 0));
        let (err, message) = refused(dir.path());
        assert!(
            matches!(header_error(err).1, HeaderError::NotAnObject),
            "{json}: {message}"
        );
    }
}

#[test]
fn malformed_json_is_refused() {
    for json in [
        r#"{"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}"#,
        r#"{"w":}"#,
        r#"{"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}} trailing"#,
    ] {
        let dir = single_file_dir(&craft(json, 1));
        let (err, _) = refused(dir.path());
        assert!(
            matches!(header_error(err).1, HeaderError::Json(_)),
            "{json}"
        );
    }
}

#[test]
fn entry_that_is_not_a_tensor_description_names_the_tensor() {
    for json in [
        r#"{"w":[0,1]}"#,
        r#"{"w":{"dtype":"U8","shape":[1]}}"#,
        r#"{"w":{"dtype":"U8","shape":[1.5],"data_offsets":[0,1]}}"#,
        r#"{"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1],"extra":true}}"#,
        r#"{"w":{"dtype":7,"shape":[1],"data_offsets":[0,1]}}"#,
    ] {
        let dir = single_file_dir(&craft(json, 1));
        let (err, message) = refused(dir.path());
        assert!(
            matches!(header_error(err).1, HeaderError::Json(_)),
            "{json}"
        );
        assert_names(&message, &["model.safetensors", "tensor `w`"]);
    }
}

#[test]
fn duplicate_names_are_refused() {
    let dir = single_file_dir(&craft(
        r#"{"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},
            "w":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}"#,
        2,
    ));
    let (err, message) = refused(dir.path());
    assert!(
        matches!(header_error(err).1, HeaderError::DuplicateName { ref tensor } if tensor == "w")
    );
    assert_names(&message, &["model.safetensors", "`w`", "twice"]);
}

#[test]
fn unknown_dtype_is_refused() {
    for dtype in ["Q4_K", "F4", "bf16", ""] {
        let json = format!(r#"{{"w":{{"dtype":"{dtype}","shape":[1],"data_offsets":[0,1]}}}}"#);
        let dir = single_file_dir(&craft(&json, 1));
        let (err, message) = refused(dir.path());
        assert!(
            matches!(header_error(err).1, HeaderError::UnknownDtype { dtype: ref d, .. } if d == dtype),
            "{message}"
        );
        assert_names(&message, &["model.safetensors", "`w`", "unknown dtype"]);
    }
}

#[test]
fn metadata_that_is_not_a_string_map_is_refused() {
    let dir = single_file_dir(&craft(r#"{"__metadata__":{"format":1}}"#, 0));
    let (err, message) = refused(dir.path());
    assert!(matches!(header_error(err).1, HeaderError::Json(_)));
    assert_names(&message, &["__metadata__"]);
}

#[test]
fn file_truncated_after_the_header_is_refused() {
    // A valid file, then cut right after its header (an interrupted download).
    let json = r#"{"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},
                   "b":{"dtype":"F32","shape":[4],"data_offsets":[16,32]}}"#;
    let full = craft(json, 32);
    let cut = &full[..8 + json.len()];
    let dir = single_file_dir(cut);
    let (err, message) = refused(dir.path());
    assert!(matches!(
        header_error(err).1,
        HeaderError::OffsetsPastEnd { data_len: 0, .. }
    ));
    assert_names(&message, &["model.safetensors", "truncated"]);

    // Cut in the middle of the second tensor: the first is intact, yet
    // nothing is handed out.
    let dir = single_file_dir(&full[..full.len() - 5]);
    let (err, message) = refused(dir.path());
    assert!(matches!(
        header_error(err).1,
        HeaderError::OffsetsPastEnd {
            end: 32,
            data_len: 27,
            ..
        }
    ));
    assert_names(&message, &["`b`"]);
}

#[test]
fn folder_without_weights_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("config.json"), "{}").unwrap();
    let (err, message) = refused(dir.path());
    assert!(matches!(err, CheckpointError::NoWeights { .. }));
    assert_names(&message, &["model.safetensors"]);
}

/// A folder with the given shard files and an index mapping tensor → file.
fn sharded_dir(shards: &[(&str, Vec<u8>)], weight_map: &[(&str, &str)]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for (name, bytes) in shards {
        std::fs::write(dir.path().join(name), bytes).unwrap();
    }
    let map: serde_json::Map<String, serde_json::Value> = weight_map
        .iter()
        .map(|(t, f)| (t.to_string(), serde_json::Value::from(*f)))
        .collect();
    let index = serde_json::json!({"metadata": {}, "weight_map": map});
    std::fs::write(
        dir.path().join("model.safetensors.index.json"),
        index.to_string(),
    )
    .unwrap();
    dir
}

fn one_tensor(name: &str) -> Vec<u8> {
    craft(
        &format!(r#"{{"{name}":{{"dtype":"U8","shape":[4],"data_offsets":[0,4]}}}}"#),
        4,
    )
}

#[test]
fn missing_shard_is_refused_naming_file_and_tensor() {
    let dir = sharded_dir(
        &[("model-00001-of-00002.safetensors", one_tensor("a"))],
        &[
            ("a", "model-00001-of-00002.safetensors"),
            ("b", "model-00002-of-00002.safetensors"),
        ],
    );
    let (err, message) = refused(dir.path());
    assert!(matches!(err, CheckpointError::MissingShard { ref tensor, .. } if tensor == "b"));
    assert_names(
        &message,
        &["model-00002-of-00002.safetensors", "`b`", "missing"],
    );
}

#[test]
fn index_entry_outside_the_folder_is_refused_without_opening_it() {
    let parent = tempfile::tempdir().unwrap();
    // The file exists and is a valid checkpoint: only the path is wrong.
    std::fs::write(parent.path().join("outside.safetensors"), one_tensor("b")).unwrap();
    let dir = parent.path().join("model");
    std::fs::create_dir(&dir).unwrap();
    std::fs::write(
        dir.join("model-00001-of-00001.safetensors"),
        one_tensor("a"),
    )
    .unwrap();
    let index = serde_json::json!({"weight_map": {
        "a": "model-00001-of-00001.safetensors",
        "b": "../outside.safetensors",
    }});
    std::fs::write(dir.join("model.safetensors.index.json"), index.to_string()).unwrap();
    let (err, message) = refused(&dir);
    assert!(matches!(err, CheckpointError::IndexEscape { ref tensor, .. } if tensor == "b"));
    assert_names(
        &message,
        &[
            "../outside.safetensors",
            "`b`",
            "model.safetensors.index.json",
        ],
    );

    for escape in ["/etc/passwd", "sub/../../outside.safetensors", ""] {
        let index = serde_json::json!({"weight_map": {"a": escape}});
        std::fs::write(dir.join("model.safetensors.index.json"), index.to_string()).unwrap();
        let (err, _) = refused(&dir);
        assert!(
            matches!(err, CheckpointError::IndexEscape { .. }),
            "{escape}"
        );
    }
}

#[test]
fn index_and_shards_must_agree() {
    let shard1 = "model-00001-of-00002.safetensors";
    let shard2 = "model-00002-of-00002.safetensors";
    // The index lists a tensor its shard does not hold.
    let dir = sharded_dir(
        &[(shard1, one_tensor("a"))],
        &[("a", shard1), ("ghost", shard1)],
    );
    let (err, message) = refused(dir.path());
    assert!(matches!(err, CheckpointError::NotInShard { ref tensor, .. } if tensor == "ghost"));
    assert_names(&message, &[shard1, "`ghost`"]);

    // A shard holds a tensor the index does not list.
    let two = craft(
        r#"{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},
            "stray":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}"#,
        2,
    );
    let dir = sharded_dir(&[(shard1, two)], &[("a", shard1)]);
    let (err, message) = refused(dir.path());
    assert!(
        matches!(err, CheckpointError::NotInIndex { ref tensor, listed: None, .. } if tensor == "stray")
    );
    assert_names(&message, &[shard1, "`stray`"]);

    // The same tensor in two shards.
    let dir = sharded_dir(
        &[(shard1, one_tensor("a")), (shard2, one_tensor("a"))],
        &[("a", shard1), ("b", shard2)],
    );
    let (err, message) = refused(dir.path());
    assert!(matches!(err, CheckpointError::DuplicateTensor { ref tensor, .. } if tensor == "a"));
    assert_names(&message, &[shard1, shard2, "`a`"]);
}

#[test]
fn malformed_index_is_refused() {
    for index in [
        "not json",
        r#"{"metadata":{}}"#,
        r#"{"weight_map":{}}"#,
        r#"{"weight_map":{"a":3}}"#,
        r#"{"weight_map":{"a":"x.safetensors","a":"y.safetensors"}}"#,
    ] {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("model.safetensors.index.json"), index).unwrap();
        let (err, message) = refused(dir.path());
        assert!(
            matches!(err, CheckpointError::Index { .. }),
            "{index}: {message}"
        );
        assert_names(&message, &["model.safetensors.index.json"]);
    }
}

#[test]
fn bad_shard_header_names_the_shard() {
    let shard1 = "model-00001-of-00002.safetensors";
    let shard2 = "model-00002-of-00002.safetensors";
    let lying = craft(
        r#"{"b":{"dtype":"U8","shape":[9],"data_offsets":[0,9]}}"#,
        4,
    );
    let dir = sharded_dir(
        &[(shard1, one_tensor("a")), (shard2, lying)],
        &[("a", shard1), ("b", shard2)],
    );
    let (err, message) = refused(dir.path());
    let (path, _) = header_error(err);
    assert_eq!(path, dir.path().join(shard2));
    assert_names(&message, &[shard2, "`b`"]);
}
