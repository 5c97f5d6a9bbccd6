//! fnmatch-style globs over module paths: the exclude lists and
//! mixed-precision rules of quantized checkpoints.

/// fnmatch-style matching of the whole `text`: `*` matches any run of
/// characters (dots included), `?` one character, `[abc]` / `[a-z]` / `[!x]`
/// one character of a class; everything else matches itself.
pub fn glob_match(pattern: &str, text: &str) -> bool {
    let pattern: Vec<char> = pattern.chars().collect();
    let text: Vec<char> = text.chars().collect();
    let (mut p, mut t) = (0, 0);
    // Where the last `*` was, and the text position it currently absorbs up to.
    let mut star: Option<(usize, usize)> = None;
    while t < text.len() {
        if pattern.get(p) == Some(&'*') {
            star = Some((p, t));
            p += 1;
            continue;
        }
        if let Some(next) = match_one(&pattern, p, text[t]) {
            p = next;
            t += 1;
            continue;
        }
        // Mismatch: let the last `*` absorb one more character and retry.
        match star {
            Some((star_p, star_t)) => {
                star = Some((star_p, star_t + 1));
                p = star_p + 1;
                t = star_t + 1;
            }
            None => return false,
        }
    }
    pattern[p..].iter().all(|&c| c == '*')
}

/// Matches one text character against the pattern item at `p`; returns the
/// position after the item when it matches.
fn match_one(pattern: &[char], p: usize, c: char) -> Option<usize> {
    match pattern.get(p)? {
        '?' => Some(p + 1),
        '[' => match class_end(pattern, p) {
            Some(end) => class_contains(&pattern[p + 1..end], c).then_some(end + 1),
            // An unclosed `[` is an ordinary character, as in fnmatch.
            None => (c == '[').then_some(p + 1),
        },
        &literal => (literal == c).then_some(p + 1),
    }
}

/// Index of the `]` closing the class opened at `open` (a `]` right after
/// `[` or `[!` belongs to the class).
fn class_end(pattern: &[char], open: usize) -> Option<usize> {
    let mut i = open + 1;
    if pattern.get(i) == Some(&'!') {
        i += 1;
    }
    if pattern.get(i) == Some(&']') {
        i += 1;
    }
    (i..pattern.len()).find(|&j| pattern[j] == ']')
}

fn class_contains(class: &[char], c: char) -> bool {
    let (negate, items) = match class.split_first() {
        Some(('!', rest)) => (true, rest),
        _ => (false, class),
    };
    let mut found = false;
    let mut i = 0;
    while i < items.len() {
        if i + 2 < items.len() && items[i + 1] == '-' {
            found |= items[i] <= c && c <= items[i + 2];
            i += 3;
        } else {
            found |= items[i] == c;
            i += 1;
        }
    }
    found != negate
}

#[cfg(test)]
mod tests {
    use super::glob_match;

    #[test]
    fn glob_star_crosses_dots_and_classes_work() {
        assert!(glob_match(
            "model.layers.*.self_attn*",
            "model.layers.12.self_attn.q_proj"
        ));
        assert!(glob_match(
            "model.layers.*.mlp.gate",
            "model.layers.3.mlp.gate"
        ));
        assert!(!glob_match(
            "model.layers.*.mlp.gate",
            "model.layers.3.mlp.gate_proj"
        ));
        assert!(glob_match("*", ""));
        assert!(glob_match("a*b*c", "a.x.b.y.c"));
        assert!(!glob_match("a*b*c", "a.x.b.y.d"));
        assert!(glob_match("layer?", "layer7"));
        assert!(!glob_match("layer?", "layer"));
        assert!(glob_match("layers.[0-3].x", "layers.2.x"));
        assert!(!glob_match("layers.[0-3].x", "layers.5.x"));
        assert!(glob_match("layers.[!0-3].x", "layers.5.x"));
        assert!(glob_match("a[b", "a[b"));
        assert!(glob_match("lm_head", "lm_head"));
        assert!(!glob_match("lm_head", "lm_head2"));
    }
}
