//! The checkpoint's chat template (Jinja, from `tokenizer_config.json` or
//! `chat_template.jinja`), rendered with minijinja the way transformers'
//! `apply_chat_template` renders it with Jinja2.
//!
//! What transformers provides and templates rely on: `trim_blocks` and
//! `lstrip_blocks`, `{% break %}`/`{% continue %}`, the variables
//! `messages`, `add_generation_prompt`, `tools`/`documents` (none here) and
//! the special tokens (`bos_token`, `eos_token`, ...), the functions
//! `raise_exception(msg)` and `strftime_now(fmt)`, a `tojson` filter that
//! writes like Python's `json.dumps`, and Python string/dict methods
//! (`.strip()`, `.startswith()`, `.items()`, from minijinja-contrib's pycompat).

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use minijinja::{Environment, Error, ErrorKind, Value};
use serde::ser::{Serialize, SerializeMap, Serializer};

use super::config_files::{
    CHAT_TEMPLATE_FILE, SpecialTokens, TOKENIZER_CONFIG, read_text_if_exists, read_tokenizer_config,
};
use super::error::TextError;
use super::parsers::TextTools;
use super::python_json;
use super::render_limits::{CappedWriter, RenderLimits, TemplateLimit};
use super::render_worker::RenderWorkers;

const TEMPLATE_NAME: &str = "chat_template";

/// What transformers appends to the final message to find where it ends in
/// the rendered text (`continue_final_message`).
const CONTINUE_TAG: &str = "CONTINUE_FINAL_MESSAGE_TAG ";

/// The variables the renderer sets itself; `kwargs` may not replace them
/// (transformers takes them as its own arguments).
const RESERVED_VARIABLES: [&str; 5] = [
    "messages",
    "tools",
    "documents",
    "add_generation_prompt",
    "continue_final_message",
];

/// One chat turn, as the template sees it (a mapping with these keys; the
/// optional ones are absent when `None`, as transformers drops keys whose
/// value is `None`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ChatMessage {
    /// `system`, `developer`, `user`, `assistant`, `tool`, ... (the template
    /// decides what it accepts).
    pub role: String,
    pub content: String,
    /// The reasoning of an earlier assistant turn. Templates read it under
    /// different names (Qwen3: `reasoning_content`, gpt-oss: `thinking`,
    /// vLLM's newer name: `reasoning`); it is given under all three, as vLLM
    /// and transformers do together.
    pub reasoning: Option<String>,
    /// An assistant turn's tool calls.
    pub tool_calls: Option<Vec<ToolCall>>,
    /// A `tool` turn: the call it answers.
    pub tool_call_id: Option<String>,
    pub name: Option<String>,
}

impl ChatMessage {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> ChatMessage {
        ChatMessage {
            role: role.into(),
            content: content.into(),
            ..ChatMessage::default()
        }
    }
}

/// The mapping a template reads, keys in the order transformers gives them
/// (`thinking` first, from its aliasing of the reasoning fields).
impl Serialize for ChatMessage {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(None)?;
        if let Some(reasoning) = &self.reasoning {
            map.serialize_entry("thinking", reasoning)?;
        }
        map.serialize_entry("role", &self.role)?;
        map.serialize_entry("content", &self.content)?;
        if let Some(calls) = &self.tool_calls {
            map.serialize_entry("tool_calls", calls)?;
        }
        if let Some(reasoning) = &self.reasoning {
            map.serialize_entry("reasoning", reasoning)?;
            map.serialize_entry("reasoning_content", reasoning)?;
        }
        if let Some(id) = &self.tool_call_id {
            map.serialize_entry("tool_call_id", id)?;
        }
        if let Some(name) = &self.name {
            map.serialize_entry("name", name)?;
        }
        map.end()
    }
}

/// A tool call in an assistant turn of the history.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolCall {
    pub id: Option<String>,
    pub name: String,
    /// The arguments as a mapping: OpenAI clients send a JSON string, which
    /// is parsed first (as vLLM does), since templates write it with
    /// `tojson` (Qwen3 writes a string as it is, gpt-oss would quote it).
    pub arguments: Value,
}

/// `{"id", "type": "function", "function": {"name", "arguments"}}`.
impl Serialize for ToolCall {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(None)?;
        if let Some(id) = &self.id {
            map.serialize_entry("id", id)?;
        }
        map.serialize_entry("type", "function")?;
        map.serialize_entry(
            "function",
            &FunctionCall {
                name: &self.name,
                arguments: &self.arguments,
            },
        )?;
        map.end()
    }
}

#[derive(serde::Serialize)]
struct FunctionCall<'a> {
    name: &'a str,
    arguments: &'a Value,
}

/// Everything a template is rendered with.
#[derive(Clone, Debug, Default)]
pub struct ChatPrompt {
    pub messages: Vec<ChatMessage>,
    /// Tool definitions as the client sent them (`None`: the template sees
    /// `tools` as none, as without tools).
    pub tools: Option<Vec<Value>>,
    pub documents: Option<Vec<Value>>,
    /// End with the header of a new assistant turn.
    pub add_generation_prompt: bool,
    /// End inside the final message, without its end-of-turn tokens, so
    /// the model continues it (exclusive with `add_generation_prompt`).
    pub continue_final_message: bool,
    /// Further variables (`chat_template_kwargs`, `reasoning_effort`); they
    /// win over the special tokens, as in transformers.
    pub kwargs: Vec<(String, Value)>,
}

/// A compiled chat template and the special tokens it may refer to.
pub struct ChatTemplate {
    env: Environment<'static>,
    special_tokens: SpecialTokens,
    /// Whether the source names `content` at all (transformers refuses
    /// `continue_final_message` otherwise).
    mentions_content: bool,
    /// The bounds of every rendering (see `render_limits`).
    limits: RenderLimits,
    /// The tool-call format the template teaches the model, if it is one
    /// of the `<tool_call>` formats.
    tool_call_format: Option<TextTools>,
    source: String,
    /// Where renderings run: in worker processes ([`Self::isolated`]), else
    /// here.
    isolation: Option<std::sync::Arc<RenderWorkers>>,
}

impl ChatTemplate {
    /// Loads the template of a checkpoint directory: `chat_template.jinja` if
    /// present (newer transformers save it there), otherwise the
    /// `chat_template` of `tokenizer_config.json`. A checkpoint without one
    /// (a base model) gives [`TextError::NoChatTemplate`].
    ///
    /// A template that does not compile gives
    /// [`TextError::TemplateSyntaxIn`], naming the file it came from.
    pub fn from_dir(dir: &Path) -> Result<ChatTemplate, TextError> {
        let config = read_tokenizer_config(dir)?;
        let file = dir.join(CHAT_TEMPLATE_FILE);
        let (source, path) = match read_text_if_exists(&file)? {
            Some(source) => (source, file),
            None => (
                config
                    .chat_template
                    .ok_or_else(|| TextError::NoChatTemplate {
                        dir: dir.to_path_buf(),
                    })?,
                dir.join(TOKENIZER_CONFIG),
            ),
        };
        ChatTemplate::from_source(source, config.special_tokens).map_err(|e| in_file(e, path))
    }

    /// As [`ChatTemplate::from_dir`], with `None` for a checkpoint that has
    /// no template at all (a base model: chat routes then answer 400). A
    /// template that is there but broken stays an error: the server refuses
    /// to start rather than serve a chat route that cannot work.
    pub fn from_dir_if_any(dir: &Path) -> Result<Option<ChatTemplate>, TextError> {
        match ChatTemplate::from_dir(dir) {
            Ok(template) => Ok(Some(template)),
            Err(TextError::NoChatTemplate { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The template of `file` (`--chat-template`) instead of the
    /// checkpoint's, with the special tokens of the checkpoint in `dir`. A
    /// file that cannot be read or does not compile is an error naming it.
    pub fn from_file(file: &Path, dir: &Path) -> Result<ChatTemplate, TextError> {
        let source = read_text_if_exists(file)?.ok_or_else(|| TextError::Io {
            path: file.to_path_buf(),
            source: std::io::ErrorKind::NotFound.into(),
        })?;
        let config = read_tokenizer_config(dir)?;
        ChatTemplate::from_source(source, config.special_tokens)
            .map_err(|e| in_file(e, file.to_path_buf()))
    }

    /// `--chat-template FILE` if given, else the checkpoint's (if any).
    pub fn load(dir: &Path, file: Option<&Path>) -> Result<Option<ChatTemplate>, TextError> {
        match file {
            Some(file) => ChatTemplate::from_file(file, dir).map(Some),
            None => ChatTemplate::from_dir_if_any(dir),
        }
    }

    /// Compiles a template given as text.
    pub fn from_source(
        source: String,
        special_tokens: SpecialTokens,
    ) -> Result<ChatTemplate, TextError> {
        let mentions_content = source.contains("content");
        let tool_call_format = tool_call_format(&source);
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_filter("tojson", python_json::tojson);
        env.add_template_owned(TEMPLATE_NAME, source.clone())
            .map_err(|source| TextError::TemplateSyntax { source })?;
        let limits = RenderLimits::default();
        env.set_fuel(Some(limits.fuel));
        Ok(ChatTemplate {
            env,
            special_tokens,
            mentions_content,
            limits,
            tool_call_format,
            source,
            isolation: None,
        })
    }

    /// The template renders in worker processes from now on (the server:
    /// a template that exhausts memory kills its worker, not the server).
    pub fn isolated(mut self, workers: RenderWorkers) -> ChatTemplate {
        self.isolation = Some(std::sync::Arc::new(workers));
        self
    }

    /// The template's Jinja source.
    pub fn source(&self) -> &str {
        &self.source
    }

    pub(crate) fn set_limits(&mut self, limits: RenderLimits) {
        self.env.set_fuel(Some(limits.fuel));
        self.limits = limits;
    }

    /// The same template under other bounds (the server: the output cap is
    /// its `max_prompt_bytes`).
    pub fn with_limits(mut self, limits: RenderLimits) -> ChatTemplate {
        self.set_limits(limits);
        self
    }

    pub fn limits(&self) -> RenderLimits {
        self.limits
    }

    /// The `<tool_call>` format the template writes tool calls in (and
    /// tells the model to answer in): XML (`<function=NAME>`, Qwen3-Coder,
    /// Qwen3.5, Qwen3.6) or hermes JSON (Qwen3); `None` for any other.
    pub fn tool_call_format(&self) -> Option<TextTools> {
        self.tool_call_format
    }

    /// The same template with `strftime_now` fixed at `unix_seconds` (UTC):
    /// renderings that do not depend on the day (tests against reference
    /// renderings).
    pub fn with_fixed_time(mut self, unix_seconds: i64) -> ChatTemplate {
        self.env.add_function(
            "strftime_now",
            move |format: String| -> Result<Value, Error> {
                format_utc_timestamp(unix_seconds, &format).map(Value::from)
            },
        );
        self
    }

    /// Renders a conversation of plain messages. With
    /// `add_generation_prompt` the text ends with the header of an assistant
    /// turn, ready for the model to continue. Encode the result with
    /// `add_special_tokens = false`.
    pub fn render(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String, TextError> {
        self.render_prompt(&ChatPrompt {
            messages: messages.to_vec(),
            add_generation_prompt,
            ..ChatPrompt::default()
        })
    }

    /// Renders a conversation with everything else the template reads, as
    /// transformers' `apply_chat_template(..., tokenize=False)` does.
    pub fn render_prompt(&self, prompt: &ChatPrompt) -> Result<String, TextError> {
        if prompt.continue_final_message {
            self.render_continuing(prompt)
        } else {
            self.render_context(prompt, &prompt.messages)
        }
    }

    /// `continue_final_message`, as transformers does it: the final message
    /// is rendered with a tag after its content, and the text is cut where
    /// the tag is (and right-trimmed if the template trimmed the message).
    fn render_continuing(&self, prompt: &ChatPrompt) -> Result<String, TextError> {
        let refuse = |why: &str| TextError::ContinueFinalMessage {
            why: why.to_owned(),
        };
        if prompt.add_generation_prompt {
            return Err(refuse(
                "it cannot be combined with add_generation_prompt (that starts a new assistant turn)",
            ));
        }
        let Some((last, earlier)) = prompt.messages.split_last() else {
            return Err(refuse("the conversation is empty"));
        };
        if !self.mentions_content {
            return Err(refuse("the chat template does not read `content`"));
        }
        let final_text = last.content.trim().to_owned();
        let mut messages = earlier.to_vec();
        messages.push(ChatMessage {
            content: format!("{}{CONTINUE_TAG}", last.content),
            ..last.clone()
        });
        let rendered = self.render_context(prompt, &messages)?;
        let tag = CONTINUE_TAG.trim();
        let cut = rendered
            .rfind(tag)
            .filter(|_| rendered.contains(&final_text));
        let Some(at) = cut else {
            return Err(refuse(
                "the final message does not appear in the rendered chat (the template drops it)",
            ));
        };
        if rendered[at..].starts_with(CONTINUE_TAG) {
            Ok(rendered[..at].to_owned())
        } else {
            Ok(rendered[..at].trim_end().to_owned())
        }
    }

    fn render_context(
        &self,
        prompt: &ChatPrompt,
        messages: &[ChatMessage],
    ) -> Result<String, TextError> {
        let mut context: BTreeMap<&str, Value> = BTreeMap::new();
        let tokens = &self.special_tokens;
        for (name, token) in [
            ("bos_token", &tokens.bos),
            ("eos_token", &tokens.eos),
            ("pad_token", &tokens.pad),
            ("unk_token", &tokens.unk),
        ] {
            if let Some(token) = token {
                context.insert(name, Value::from(token.as_str()));
            }
        }
        for (name, value) in &prompt.kwargs {
            if RESERVED_VARIABLES.contains(&name.as_str()) {
                return Err(TextError::ReservedTemplateVariable { name: name.clone() });
            }
            context.insert(name, value.clone());
        }
        context.insert("messages", Value::from_serialize(messages));
        context.insert(
            "add_generation_prompt",
            Value::from(prompt.add_generation_prompt),
        );
        // transformers passes these as None when the request has none.
        context.insert(
            "tools",
            prompt
                .tools
                .as_ref()
                .map_or(Value::from(()), |t| Value::from(t.clone())),
        );
        context.insert(
            "documents",
            prompt
                .documents
                .as_ref()
                .map_or(Value::from(()), |d| Value::from(d.clone())),
        );
        match &self.isolation {
            Some(workers) => workers.render(&context, self.limits),
            None => self.render_here(&context),
        }
    }

    /// Renders `context` (every variable the template sees) in this process.
    pub(crate) fn render_here(&self, context: &impl Serialize) -> Result<String, TextError> {
        let template = self
            .env
            .get_template(TEMPLATE_NAME)
            .map_err(|source| TextError::TemplateRender { source })?;
        let mut out = CappedWriter::new(&self.limits);
        let rendered = template.render_captured_to(context, &mut out);
        if let Some(limit) = out.over {
            return Err(TextError::TemplateOverLimit { limit });
        }
        match rendered {
            // minijinja writes whole `str`s, so the bytes are UTF-8.
            Ok(_) => String::from_utf8(out.text).map_err(|e| TextError::TemplateRender {
                source: Error::new(ErrorKind::BadSerialization, e.to_string()),
            }),
            Err(source) if source.kind() == ErrorKind::OutOfFuel => {
                Err(TextError::TemplateOverLimit {
                    limit: TemplateLimit::Fuel(self.limits.fuel),
                })
            }
            Err(source) => Err(TextError::TemplateRender { source }),
        }
    }
}

/// A compile error of a template read from `path`, naming it.
fn in_file(error: TextError, path: std::path::PathBuf) -> TextError {
    match error {
        TextError::TemplateSyntax { source } => TextError::TemplateSyntaxIn { path, source },
        other => other,
    }
}

/// `raise_exception(message)`: templates call it to reject a conversation
/// (e.g. roles out of order); the message reaches the caller's error.
fn raise_exception(message: String) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, message))
}

/// `strftime_now(format)`: the current date, in UTC (sparkrt carries no
/// time-zone database; transformers uses local time).
fn strftime_now(format: String) -> Result<Value, Error> {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX));
    format_utc_timestamp(now, &format).map(Value::from)
}

/// Formats seconds since the Unix epoch with the `strftime` directives chat
/// templates use: `%Y %y %m %d %H %M %S %j %b %B %a %A %%`.
pub(crate) fn format_utc_timestamp(unix_seconds: i64, format: &str) -> Result<String, Error> {
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    const WEEKDAYS: [&str; 7] = [
        "Sunday",
        "Monday",
        "Tuesday",
        "Wednesday",
        "Thursday",
        "Friday",
        "Saturday",
    ];

    let days = unix_seconds.div_euclid(86_400);
    let seconds_of_day = unix_seconds.rem_euclid(86_400);
    let (year, month, day) = civil_from_days(days);
    let day_of_year = days - days_from_civil(year, 1, 1) + 1;
    // 1970-01-01 was a Thursday.
    let weekday = (days + 4).rem_euclid(7) as usize;
    let month_name = MONTHS[(month - 1) as usize];

    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('Y') => out.push_str(&year.to_string()),
            Some('y') => out.push_str(&format!("{:02}", year.rem_euclid(100))),
            Some('m') => out.push_str(&format!("{month:02}")),
            Some('d') => out.push_str(&format!("{day:02}")),
            Some('H') => out.push_str(&format!("{:02}", seconds_of_day / 3600)),
            Some('M') => out.push_str(&format!("{:02}", seconds_of_day / 60 % 60)),
            Some('S') => out.push_str(&format!("{:02}", seconds_of_day % 60)),
            Some('j') => out.push_str(&format!("{day_of_year:03}")),
            Some('B') => out.push_str(month_name),
            Some('b') => out.push_str(&month_name[..3]),
            Some('A') => out.push_str(WEEKDAYS[weekday]),
            Some('a') => out.push_str(&WEEKDAYS[weekday][..3]),
            Some('%') => out.push('%'),
            other => {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    format!(
                        "strftime_now: unsupported directive %{}",
                        other.map(String::from).unwrap_or_default()
                    ),
                ));
            }
        }
    }
    Ok(out)
}

/// (year, month 1..=12, day 1..=31) of a day counted from 1970-01-01, in the
/// proleptic Gregorian calendar. Counts in 400-year eras of 146,097 days,
/// with years starting on March 1 so that the leap day falls last.
fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468; // days from 0000-03-01
    let era = z.div_euclid(146_097);
    let day_of_era = z.rem_euclid(146_097);
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_from_march = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * month_from_march + 2) / 5 + 1;
    let month = if month_from_march < 10 {
        month_from_march + 3
    } else {
        month_from_march - 9
    };
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// Inverse of [`civil_from_days`].
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let year_of_era = year.rem_euclid(400);
    let month_from_march = if month > 2 { month - 3 } else { month + 9 };
    let day_of_year = (153 * month_from_march + 2) / 5 + day - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
}

/// Which `<tool_call>` format a template's source writes (see
/// [`ChatTemplate::tool_call_format`]).
fn tool_call_format(source: &str) -> Option<TextTools> {
    if source.contains("<function=") {
        Some(TextTools::Qwen3Coder)
    } else if source.contains("<tool_call>") {
        Some(TextTools::Hermes)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The official templates say which `<tool_call>` format they teach.
    #[test]
    fn official_templates_name_their_tool_call_format() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/templates");
        for (file, want) in [
            ("qwen3.jinja", Some(TextTools::Hermes)),
            ("qwen3_instruct_2507.jinja", Some(TextTools::Hermes)),
            ("qwen3_6.jinja", Some(TextTools::Qwen3Coder)),
            ("gptoss.jinja", None),
        ] {
            let source = std::fs::read_to_string(dir.join(file)).unwrap();
            let template = ChatTemplate::from_source(source, SpecialTokens::default()).unwrap();
            assert_eq!(template.tool_call_format(), want, "{file}");
        }
    }

    /// Expected strings from Python:
    /// `datetime.fromtimestamp(t, timezone.utc).strftime(fmt)`.
    #[test]
    fn formats_timestamps_like_python_strftime() {
        let cases = [
            (
                0,
                "%Y-%m-%d %H:%M:%S %a %A %b %B %j %y",
                "1970-01-01 00:00:00 Thu Thursday Jan January 001 70",
            ),
            (
                951_827_696,
                "%Y-%m-%d %H:%M:%S %a %j",
                "2000-02-29 12:34:56 Tue 060",
            ),
            (
                1_767_225_599,
                "%d %b %Y %H:%M:%S %A %j",
                "31 Dec 2025 23:59:59 Wednesday 365",
            ),
            (-1, "%Y-%m-%d %H:%M:%S %%", "1969-12-31 23:59:59 %"),
        ];
        for (t, fmt, want) in cases {
            assert_eq!(format_utc_timestamp(t, fmt).unwrap(), want, "t={t}");
        }
        assert!(format_utc_timestamp(0, "%Q").is_err());
    }

    #[test]
    fn days_round_trip_through_the_civil_calendar() {
        for days in (-800_000..800_000).step_by(997) {
            let (y, m, d) = civil_from_days(days);
            assert_eq!(days_from_civil(y, m, d), days);
        }
    }
}
