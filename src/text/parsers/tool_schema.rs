//! The parameter types a request's tools declare (their JSON schemas), by
//! function and parameter name: a format that writes argument values as
//! raw text (`qwen3_coder`) needs them to know `5` from `"5"`.

use std::collections::HashMap;

use serde_json::Value as Json;

/// What a parameter's value is, as far as converting its text goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ValueKind {
    String,
    Integer,
    Number,
    Boolean,
    /// An object, an array, or a type the conversion does not know: JSON
    /// if the text is JSON.
    Json,
}

/// A parameter's declared type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ParamType {
    pub kind: ValueKind,
    /// The schema admits `null` (`"type": ["string", "null"]`, an `anyOf`
    /// with `{"type": "null"}`).
    pub nullable: bool,
}

/// The declared parameters of each offered function.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ToolSchemas {
    functions: HashMap<String, HashMap<String, ParamType>>,
}

impl ToolSchemas {
    /// From the chat-form tools (`{"type": "function", "function": {"name",
    /// "parameters": {"properties": {...}}}}`) the template got; a tool
    /// that is not of that shape declares nothing.
    pub fn from_tools(tools: &[minijinja::Value]) -> ToolSchemas {
        let mut functions = HashMap::new();
        for tool in tools {
            let Ok(tool) = serde_json::to_value(tool) else {
                continue;
            };
            let function = &tool["function"];
            let Some(name) = function["name"].as_str() else {
                continue;
            };
            let params = function["parameters"]["properties"]
                .as_object()
                .map(|properties| {
                    properties
                        .iter()
                        .map(|(param, schema)| (param.clone(), param_type(schema)))
                        .collect()
                })
                .unwrap_or_default();
            // The first definition of a name wins, as a lookup by name in
            // the list would find it.
            functions.entry(name.to_owned()).or_insert(params);
        }
        ToolSchemas { functions }
    }

    /// The declared type of `function`'s parameter `param`, if declared.
    pub fn param(&self, function: &str, param: &str) -> Option<ParamType> {
        self.functions.get(function)?.get(param).copied()
    }
}

/// A property schema's type: its `type` (a name, or a list of names), else
/// the first typed option of `anyOf` / `oneOf`; `null` among them makes it
/// nullable. A schema without a type is a string (as vLLM reads it).
fn param_type(schema: &Json) -> ParamType {
    let names: Vec<&str> = match &schema["type"] {
        Json::String(name) => vec![name.as_str()],
        Json::Array(names) => names.iter().filter_map(Json::as_str).collect(),
        _ => ["anyOf", "oneOf"]
            .iter()
            .filter_map(|key| schema[*key].as_array())
            .flatten()
            .filter_map(|option| option["type"].as_str())
            .collect(),
    };
    let is_null = |name: &&str| name.trim().eq_ignore_ascii_case("null");
    let nullable = names.iter().any(is_null);
    let kind = match names.iter().find(|name| !is_null(name)) {
        Some(name) => kind_of(name),
        // Only `null`: whatever the text is.
        None if nullable => ValueKind::Json,
        None => ValueKind::String,
    };
    ParamType { kind, nullable }
}

/// A type name as vLLM's `qwen3_coder` parser reads it (it accepts the
/// names of several type systems: `int64`, `float`, `dict`, `list`, ...).
fn kind_of(name: &str) -> ValueKind {
    let name = name.trim().to_ascii_lowercase();
    let starts = |prefixes: &[&str]| prefixes.iter().any(|p| name.starts_with(p));
    match name.as_str() {
        "string" | "str" | "text" | "varchar" | "char" | "enum" => ValueKind::String,
        "boolean" | "bool" | "binary" => ValueKind::Boolean,
        _ if starts(&["int", "uint", "long", "short", "unsigned"]) => ValueKind::Integer,
        _ if starts(&["num", "float"]) => ValueKind::Number,
        _ => ValueKind::Json,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn types_come_from_type_names_lists_and_any_of() {
        let tools: Vec<minijinja::Value> = vec![minijinja::Value::from_serialize(
            serde_json::json!({"type": "function", "function": {"name": "f", "parameters": {
                "type": "object", "properties": {
                    "s": {"type": "string"}, "i": {"type": "integer"}, "n": {"type": "number"},
                    "b": {"type": "boolean"}, "o": {"type": "object"}, "a": {"type": "array"},
                    "opt": {"type": ["integer", "null"]},
                    "any": {"anyOf": [{"type": "null"}, {"type": "string"}]},
                    "untyped": {"description": "d"}, "i64": {"type": "int64"}}}}}),
        )];
        let schemas = ToolSchemas::from_tools(&tools);
        let kind = |p: &str| schemas.param("f", p).map(|t| (t.kind, t.nullable));
        assert_eq!(kind("s"), Some((ValueKind::String, false)));
        assert_eq!(kind("i"), Some((ValueKind::Integer, false)));
        assert_eq!(kind("n"), Some((ValueKind::Number, false)));
        assert_eq!(kind("b"), Some((ValueKind::Boolean, false)));
        assert_eq!(kind("o"), Some((ValueKind::Json, false)));
        assert_eq!(kind("a"), Some((ValueKind::Json, false)));
        assert_eq!(kind("opt"), Some((ValueKind::Integer, true)));
        assert_eq!(kind("any"), Some((ValueKind::String, true)));
        assert_eq!(kind("untyped"), Some((ValueKind::String, false)));
        assert_eq!(kind("i64"), Some((ValueKind::Integer, false)));
        assert_eq!(kind("missing"), None);
        assert_eq!(schemas.param("g", "s"), None);
    }
}
