//! Fields a request sets that this server does not implement: collected
//! by each request struct and refused by name.

use serde::Deserialize;

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
        let mut set: Vec<&str> = self
            .0
            .iter()
            .filter(|(_, value)| !value.is_null())
            .map(|(key, _)| key.as_str())
            .collect();
        set.sort_unstable();
        set.first().copied()
    }
}

/// A request body that may carry fields this server does not implement.
pub trait RequestBody {
    fn unsupported(&self) -> &Unsupported;
}
