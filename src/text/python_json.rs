//! The `tojson` filter as transformers defines it for chat templates:
//! Python's `json.dumps(x, ensure_ascii=False, indent=None, separators=None,
//! sort_keys=False)`.
//!
//! minijinja's own `tojson` writes compact JSON (`{"a":1}`) and escapes
//! `<`, `>`, `&` and `'` for HTML; Python writes `{"a": 1}` and escapes
//! nothing of the sort. Tool definitions rendered into a prompt must match
//! what the model was trained on byte for byte, hence this module.

use std::fmt::Write as _;

use minijinja::value::{Kwargs, ValueKind};
use minijinja::{Error, ErrorKind, Value};

/// How `json.dumps` lays out its output.
struct Style {
    /// Spaces per nesting level; `None` writes everything on one line.
    indent: Option<usize>,
    item_separator: String,
    key_separator: String,
    ensure_ascii: bool,
    sort_keys: bool,
}

/// The `tojson` filter: `value|tojson(indent=2, ensure_ascii=false,
/// separators=[",", ":"], sort_keys=true)`, every argument optional.
pub(crate) fn tojson(value: &Value, kwargs: Kwargs) -> Result<Value, Error> {
    let indent = match kwargs.get::<Option<Value>>("indent")? {
        None => None,
        Some(v) if v.is_none() => None,
        Some(v) => Some(usize::try_from(v)?),
    };
    // Python's default separators depend on whether output is indented.
    let (default_item, default_key) = if indent.is_some() {
        (",", ": ")
    } else {
        (", ", ": ")
    };
    let (item_separator, key_separator) = match kwargs.get::<Option<Vec<String>>>("separators")? {
        None => (default_item.to_owned(), default_key.to_owned()),
        Some(pair) => match <[String; 2]>::try_from(pair) {
            Ok([item, key]) => (item, key),
            Err(_) => {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    "tojson: separators must be a pair (item, key)",
                ));
            }
        },
    };
    let style = Style {
        indent,
        item_separator,
        key_separator,
        ensure_ascii: kwargs.get::<Option<bool>>("ensure_ascii")?.unwrap_or(false),
        sort_keys: kwargs.get::<Option<bool>>("sort_keys")?.unwrap_or(false),
    };
    kwargs.assert_all_used()?;
    let mut out = String::new();
    write_value(&mut out, value, &style, 0)?;
    Ok(Value::from(out))
}

fn write_value(out: &mut String, value: &Value, style: &Style, depth: usize) -> Result<(), Error> {
    match value.kind() {
        ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if value.is_true() { "true" } else { "false" }),
        ValueKind::Number => write_number(out, value)?,
        ValueKind::String => {
            write_string(out, value.as_str().unwrap_or_default(), style.ensure_ascii)
        }
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = value.try_iter()?.collect();
            write_container(out, ('[', ']'), &items, style, depth, |out, item, depth| {
                write_value(out, item, style, depth)
            })?;
        }
        ValueKind::Map => {
            let mut keys: Vec<(String, Value)> = value
                .try_iter()?
                .map(|key| Ok((key_string(&key)?, key)))
                .collect::<Result<_, Error>>()?;
            if style.sort_keys {
                keys.sort_by(|a, b| a.0.cmp(&b.0));
            }
            write_container(
                out,
                ('{', '}'),
                &keys,
                style,
                depth,
                |out, (name, key), depth| {
                    write_string(out, name, style.ensure_ascii);
                    out.push_str(&style.key_separator);
                    write_value(out, &value.get_item(key)?, style, depth)
                },
            )?;
        }
        kind => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                format!("tojson: a value of type {kind} is not JSON serializable"),
            ));
        }
    }
    Ok(())
}

/// Writes `[a, b]` / `{..}`, or the indented form Python writes with `indent`.
fn write_container<T>(
    out: &mut String,
    (open, close): (char, char),
    items: &[T],
    style: &Style,
    depth: usize,
    mut write_item: impl FnMut(&mut String, &T, usize) -> Result<(), Error>,
) -> Result<(), Error> {
    out.push(open);
    if items.is_empty() {
        out.push(close);
        return Ok(());
    }
    let newline_indent = |level: usize| match style.indent {
        Some(width) => format!("\n{}", " ".repeat(width * level)),
        None => String::new(),
    };
    out.push_str(&newline_indent(depth + 1));
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            out.push_str(&style.item_separator);
            out.push_str(&newline_indent(depth + 1));
        }
        write_item(out, item, depth + 1)?;
    }
    out.push_str(&newline_indent(depth));
    out.push(close);
    Ok(())
}

/// Python turns non-string keys into strings: `{1: 2}` → `{"1": 2}`.
fn key_string(key: &Value) -> Result<String, Error> {
    match key.kind() {
        ValueKind::String => Ok(key.as_str().unwrap_or_default().to_owned()),
        ValueKind::Bool => Ok(if key.is_true() { "true" } else { "false" }.to_owned()),
        ValueKind::None => Ok("null".to_owned()),
        ValueKind::Number => {
            let mut s = String::new();
            write_number(&mut s, key)?;
            Ok(s)
        }
        kind => Err(Error::new(
            ErrorKind::InvalidOperation,
            format!("tojson: keys must be str, int, float, bool or None, not {kind}"),
        )),
    }
}

fn write_number(out: &mut String, value: &Value) -> Result<(), Error> {
    if value.is_integer() {
        // Integers print exactly (minijinja's Display of an integer).
        let _ = write!(out, "{value}");
    } else {
        out.push_str(&python_float_repr(f64::try_from(value.clone())?));
    }
    Ok(())
}

/// Python's `repr(float)`, which `json.dumps` uses: the shortest digits that
/// round-trip, in positional notation for exponents -4..16 (always with a
/// fractional part: `1.0`), otherwise scientific with a signed two-digit
/// exponent (`1e+16`, `1.5e-05`).
pub(crate) fn python_float_repr(x: f64) -> String {
    if x.is_nan() {
        return "NaN".to_owned();
    }
    if x.is_infinite() {
        return if x > 0.0 { "Infinity" } else { "-Infinity" }.to_owned();
    }
    // Rust's `{:e}` gives the same shortest round-trip digits: "-1.2345e-7".
    let scientific = format!("{x:e}");
    let (mantissa, exponent) = scientific.split_once('e').unwrap_or((&scientific, "0"));
    let exponent: i32 = exponent.parse().unwrap_or(0);
    let (sign, mantissa) = match mantissa.strip_prefix('-') {
        Some(rest) => ("-", rest),
        None => ("", mantissa),
    };
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();

    if (-4..16).contains(&exponent) {
        if exponent < 0 {
            let zeros = "0".repeat((-exponent - 1) as usize);
            format!("{sign}0.{zeros}{digits}")
        } else {
            let int_len = exponent as usize + 1;
            if digits.len() <= int_len {
                let zeros = "0".repeat(int_len - digits.len());
                format!("{sign}{digits}{zeros}.0")
            } else {
                format!("{sign}{}.{}", &digits[..int_len], &digits[int_len..])
            }
        }
    } else {
        let (first, rest) = digits.split_at(1);
        let fraction = if rest.is_empty() {
            String::new()
        } else {
            format!(".{rest}")
        };
        let exp_sign = if exponent < 0 { '-' } else { '+' };
        format!(
            "{sign}{first}{fraction}e{exp_sign}{:02}",
            exponent.unsigned_abs()
        )
    }
}

/// A JSON string literal as Python writes it.
fn write_string(out: &mut String, s: &str, ensure_ascii: bool) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{08}' => out.push_str("\\b"),
            '\u{0c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            // With ensure_ascii Python escapes everything outside ' '..='~',
            // characters beyond the BMP as a UTF-16 surrogate pair.
            c if ensure_ascii && !(' '..='~').contains(&c) => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    let _ = write!(out, "\\u{unit:04x}");
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::python_float_repr;

    /// Expected strings are what CPython's `repr()` prints for each value.
    #[test]
    fn floats_print_like_python_repr() {
        let cases = [
            (1.0, "1.0"),
            (-0.0, "-0.0"),
            (0.1, "0.1"),
            (0.5, "0.5"),
            (123.456, "123.456"),
            (1e15, "1000000000000000.0"),
            (1e16, "1e+16"),
            (1.5e16, "1.5e+16"),
            (0.0001, "0.0001"),
            (0.00012, "0.00012"),
            (1e-5, "1e-05"),
            (-2.5e-7, "-2.5e-07"),
            (1.5e300, "1.5e+300"),
            (123456789012345.6, "123456789012345.6"),
            (f64::NAN, "NaN"),
            (f64::NEG_INFINITY, "-Infinity"),
        ];
        for (x, want) in cases {
            assert_eq!(python_float_repr(x), want, "repr({x:e})");
        }
    }
}
