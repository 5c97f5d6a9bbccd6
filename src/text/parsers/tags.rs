//! Finding tags in streamed text without ever emitting part of one.

/// Where the earliest complete tag of `tags` starts in `text`, and which
/// tag it is (the longest one where two start at the same place).
pub(crate) fn find_tag<'t>(text: &str, tags: &[&'t str]) -> Option<(usize, &'t str)> {
    tags.iter()
        .filter_map(|&tag| text.find(tag).map(|at| (at, tag)))
        .min_by(|a, b| a.0.cmp(&b.0).then(b.1.len().cmp(&a.1.len())))
}

/// Byte offset of the longest suffix of `text` that is a proper prefix of
/// one of `tags` (`text.len()` when none is): everything before it can be
/// emitted, because no tag can start there any more.
pub(crate) fn safe_prefix_len(text: &str, tags: &[&str]) -> usize {
    text.char_indices()
        .map(|(i, _)| i)
        .find(|&i| {
            let suffix = &text[i..];
            tags.iter()
                .any(|tag| tag.len() > suffix.len() && tag.starts_with(suffix))
        })
        .unwrap_or(text.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_earliest_tag_and_holds_only_a_possible_prefix() {
        let tags = ["<think>", "</think>"];
        assert_eq!(find_tag("ab</think>c<think>", &tags), Some((2, "</think>")));
        assert_eq!(find_tag("ab<thin", &tags), None);
        assert_eq!(safe_prefix_len("ab<thin", &tags), 2);
        assert_eq!(safe_prefix_len("ab</", &tags), 2);
        assert_eq!(safe_prefix_len("ab<x", &tags), 4);
        assert_eq!(safe_prefix_len("é<", &tags), "é".len());
    }
}
