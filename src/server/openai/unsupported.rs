//! Fields a request sets that this server does not implement: collected
//! by each request struct and refused by name, at every depth, with the
//! JSON path of the field (`stream_options.foo`, `tools[0].function.bar`).

use serde::Deserialize;

use crate::server::errors::ApiError;

/// Every field of a request body that no struct field took. The rule of the
/// API is *refuse, don't ignore*: a field is implemented by adding it to a
/// request struct (and honouring it); any other field the client sets is a
/// 400 `unsupported_parameter` naming it. A field sent as `null` means "not
/// set", as in OpenAI's API, and is accepted.
///
/// It must be the **last** flattened field of its struct: serde hands a
/// flattened map only the entries that the fields before it left.
#[derive(Deserialize, Default)]
#[serde(transparent)]
pub struct Unsupported(serde_json::Map<String, serde_json::Value>);

impl Unsupported {
    /// The first field set to something other than `null`, by name order
    /// (so the answer does not depend on the client's key order).
    pub fn first_set(&self) -> Option<&str> {
        self.first_set_except(&[])
    }

    /// As [`Unsupported::first_set`], leaving out the fields in `known`.
    pub fn first_set_except(&self, known: &[&str]) -> Option<&str> {
        first_unknown(self.0.iter().map(|(k, v)| (k.as_str(), v.is_null())), known)
    }

    /// The field `key`, if the client set it.
    pub fn get(&self, key: &str) -> Option<&serde_json::Value> {
        self.0.get(key).filter(|v| !v.is_null())
    }
}

/// A request body that may carry fields this server does not implement.
pub trait RequestBody {
    /// The top level's unknown fields.
    fn unsupported(&self) -> &Unsupported;

    /// The unknown fields of the nested objects the route reads at parse
    /// time (`stream_options`, `response_format`, tool definitions), as a
    /// 400 naming the path. Messages and input items are checked as they
    /// are converted (the paths carry their index there).
    fn refuse_nested(&self) -> Result<(), ApiError> {
        Ok(())
    }
}

/// A nested struct's unknown field: 400 naming its path (`at.field`).
pub fn refuse_unknown(unsupported: &Unsupported, at: impl Fn() -> String) -> Result<(), ApiError> {
    match unsupported.first_set() {
        None => Ok(()),
        Some(field) => Err(unknown_at(&at(), field)),
    }
}

/// A free-form object's (`serde_json::Value`) keys outside `known`: 400
/// naming the first (by name) that is not `null`. A value that is not an
/// object is left to the caller's shape check.
pub fn refuse_unknown_keys(
    value: &serde_json::Value,
    known: &[&str],
    at: &str,
) -> Result<(), ApiError> {
    let Some(object) = value.as_object() else {
        return Ok(());
    };
    let keys = object.iter().map(|(k, v)| (k.as_str(), v.is_null()));
    match first_unknown(keys, known) {
        None => Ok(()),
        Some(field) => Err(unknown_at(at, field)),
    }
}

/// The same for a value kept as a [`minijinja::Value`] (tool definitions,
/// kept in the client's key order for the template).
pub fn refuse_unknown_template_keys(
    value: &minijinja::Value,
    known: &[&str],
    at: &str,
) -> Result<(), ApiError> {
    if value.kind() != minijinja::value::ValueKind::Map {
        return Ok(());
    }
    let Ok(keys) = value.try_iter() else {
        return Ok(());
    };
    let keys: Vec<(String, bool)> = keys
        .filter_map(|key| {
            let item = value.get_item(&key).ok()?;
            Some((
                key.as_str()?.to_owned(),
                item.is_none() || item.is_undefined(),
            ))
        })
        .collect();
    match first_unknown(keys.iter().map(|(k, null)| (k.as_str(), *null)), known) {
        None => Ok(()),
        Some(field) => Err(unknown_at(at, field)),
    }
}

/// The first key, by name, not in `known` and not `null`.
fn first_unknown<'a>(
    keys: impl Iterator<Item = (&'a str, bool)>,
    known: &[&str],
) -> Option<&'a str> {
    keys.filter(|(key, null)| !null && !known.contains(key))
        .map(|(key, _)| key)
        .min()
}

fn unknown_at(at: &str, field: &str) -> ApiError {
    let path = if at.is_empty() {
        field.to_owned()
    } else {
        format!("{at}.{field}")
    };
    ApiError::unsupported_parameter(&path, "is not supported by this server")
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn free_form_keys_are_refused_by_path_and_null_is_unset() {
        let value = json!({"type": "x", "zeta": 1, "beta": 2, "alpha": null});
        let error = refuse_unknown_keys(&value, &["type"], "response_format").unwrap_err();
        assert_eq!(error.param.as_deref(), Some("response_format.beta"));
        assert!(refuse_unknown_keys(&value, &["type", "zeta", "beta"], "r").is_ok());
        let tool = minijinja::Value::from_serialize(json!({"type": "function", "extra": true}));
        let error = refuse_unknown_template_keys(&tool, &["type"], "tools[3]").unwrap_err();
        assert_eq!(error.param.as_deref(), Some("tools[3].extra"));
    }
}
