//! How the process logs (`--log-format text|json`), and `serve`'s start-up
//! summary: one block on stderr before `listening on …` (colour only on a
//! terminal without `NO_COLOR`), or one structured event in json mode.

use std::io::IsTerminal;
use std::sync::OnceLock;

use crate::plan::Plan;
use crate::plan::memory::Binding;
use crate::units::format_bytes;

/// `--log-format`: human text (the default) or one JSON object a line, for
/// log collectors.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

static LOG_FORMAT: OnceLock<LogFormat> = OnceLock::new();

/// Sets up tracing for the whole process, once, in `format`. Text goes to
/// stderr with ANSI colour only when stderr is a terminal and `NO_COLOR` is
/// unset; json never has colour.
pub fn init_logging(format: LogFormat) {
    let _ = LOG_FORMAT.set(format);
    let filter = tracing_subscriber::EnvFilter::try_from_env("SPARKRT_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false);
    match format {
        LogFormat::Text => builder.with_ansi(colour_on_stderr()).init(),
        LogFormat::Json => builder.json().with_ansi(false).init(),
    }
}

/// The format `init_logging` was given (text before it runs).
pub fn log_format() -> LogFormat {
    LOG_FORMAT.get().copied().unwrap_or_default()
}

/// Colour on stderr: a terminal, and no `NO_COLOR`.
pub fn colour_on_stderr() -> bool {
    colour(
        std::io::stderr().is_terminal(),
        std::env::var_os("NO_COLOR").as_deref(),
    )
}

/// Colour only on a terminal, and not when `NO_COLOR` is set to anything
/// but the empty string (<https://no-color.org>).
fn colour(terminal: bool, no_color: Option<&std::ffi::OsStr>) -> bool {
    terminal && no_color.is_none_or(|v| v.is_empty())
}

/// A line of `serve`'s own (`sparkrt: …` on stderr in text mode, an event
/// in json mode so every line parses).
pub fn say(message: &str) {
    match log_format() {
        LogFormat::Text => eprintln!("sparkrt: {message}"),
        LogFormat::Json => tracing::info!("{message}"),
    }
}

/// The `listening on URL` line tools wait for; in json mode an event with
/// a `listening_on` field.
pub fn listening(url: &str) {
    match log_format() {
        LogFormat::Text => eprintln!("sparkrt: listening on {url}"),
        LogFormat::Json => tracing::info!(listening_on = %url, "listening"),
    }
}

/// What `serve` says about itself before it listens.
#[derive(Debug, Clone)]
pub struct StartupSummary {
    pub model: String,
    pub architecture: String,
    pub quantization: String,
    pub backend: String,
    pub weights_residency: String,
    pub plan_total: u64,
    pub usable: i64,
    /// Which limit `usable` comes from: `host` or `kubelet`.
    pub binding: &'static str,
    pub kv_tokens: u64,
    /// Sequences of `max_model_len` tokens the KV cache holds at once.
    pub kv_full_sequences: u64,
    pub max_model_len: usize,
    pub max_num_seqs: usize,
    pub api_key: bool,
    /// The sampling defaults of requests that leave fields unset, and
    /// where they come from (`--generation-config`).
    pub sampling: String,
    /// The cross-origin policy (`--allowed-origins`), or `off`.
    pub cors: String,
    /// The queue's bound and where it comes from.
    pub queue: String,
    pub address: String,
}

impl StartupSummary {
    pub fn new(plan: &Plan, model: &str, backend: &str, residency: &str) -> StartupSummary {
        let serving = &plan.serving;
        let max_model_len = serving.max_model_len;
        StartupSummary {
            model: model.to_string(),
            architecture: format!("{:?}", plan.model.architecture).to_lowercase(),
            quantization: format!("{:?}", plan.model.quantization).to_lowercase(),
            backend: backend.to_string(),
            weights_residency: residency.to_string(),
            plan_total: plan.total,
            usable: plan.host.usable,
            binding: match plan.host.binding {
                Binding::Host => "host",
                Binding::Kubelet => "kubelet",
            },
            kv_tokens: plan.kv_cache.tokens,
            kv_full_sequences: plan.kv_cache.tokens / (max_model_len.max(1) as u64),
            max_model_len,
            max_num_seqs: serving.max_num_seqs,
            api_key: false,
            sampling: String::new(),
            cors: "off".into(),
            queue: String::new(),
            address: String::new(),
        }
    }

    /// The block, one `label  value` row a line; labels bold when `colour`.
    pub fn text(&self, colour: bool) -> String {
        let usable = if self.usable < 0 {
            "none".to_string()
        } else {
            format_bytes(self.usable as u64)
        };
        let rows = [
            ("model", self.model.clone()),
            (
                "arch",
                format!("{} · {}", self.architecture, self.quantization),
            ),
            ("backend", self.backend.clone()),
            ("weights", self.weights_residency.clone()),
            (
                "plan",
                format!(
                    "{} of usable {} (bound by {})",
                    format_bytes(self.plan_total),
                    usable,
                    self.binding
                ),
            ),
            (
                "kv cache",
                format!(
                    "{} tokens = {} sequences of max_model_len",
                    self.kv_tokens, self.kv_full_sequences
                ),
            ),
            ("max_model_len", self.max_model_len.to_string()),
            ("max_num_seqs", self.max_num_seqs.to_string()),
            ("queue", self.queue.clone()),
            (
                "api key",
                if self.api_key { "on" } else { "off" }.to_string(),
            ),
            ("sampling", self.sampling.clone()),
            ("cors", self.cors.clone()),
            ("address", self.address.clone()),
        ];
        let mut out = String::from("sparkrt serve\n");
        for (label, value) in rows {
            if colour {
                out.push_str(&format!("  \x1b[1m{label:<14}\x1b[0m {value}\n"));
            } else {
                out.push_str(&format!("  {label:<14} {value}\n"));
            }
        }
        out
    }

    /// Printed (text) or logged as one event (json).
    pub fn emit(&self) {
        match log_format() {
            LogFormat::Text => eprint!("{}", self.text(colour_on_stderr())),
            LogFormat::Json => tracing::info!(
                event = "startup_summary",
                model = %self.model,
                architecture = %self.architecture,
                quantization = %self.quantization,
                backend = %self.backend,
                weights_residency = %self.weights_residency,
                plan_total_bytes = self.plan_total,
                usable_bytes = self.usable,
                binding = self.binding,
                kv_tokens = self.kv_tokens,
                kv_full_sequences = self.kv_full_sequences,
                max_model_len = self.max_model_len as u64,
                max_num_seqs = self.max_num_seqs as u64,
                api_key = self.api_key,
                sampling = %self.sampling,
                cors = %self.cors,
                queue = %self.queue,
                address = %self.address,
                "start-up summary"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn colour_needs_a_terminal_and_no_no_color() {
        use std::ffi::OsStr;
        assert!(colour(true, None));
        assert!(colour(true, Some(OsStr::new(""))));
        assert!(!colour(true, Some(OsStr::new("1"))));
        assert!(!colour(false, None));
    }

    #[test]
    fn the_block_has_ansi_codes_only_with_colour() {
        let s = StartupSummary {
            model: "m".into(),
            architecture: "qwen3moe".into(),
            quantization: "bf16".into(),
            backend: "cpu".into(),
            weights_residency: "mapped".into(),
            plan_total: 1 << 30,
            usable: 4 << 30,
            binding: "host",
            kv_tokens: 8192,
            kv_full_sequences: 8,
            max_model_len: 1024,
            max_num_seqs: 8,
            api_key: true,
            sampling: "none".into(),
            cors: "off".into(),
            queue: "4 sequences".into(),
            address: "http://127.0.0.1:1".into(),
        };
        let plain = s.text(false);
        assert!(!plain.contains('\x1b'), "{plain}");
        assert!(
            plain.contains("kv cache       8192 tokens = 8 sequences"),
            "{plain}"
        );
        assert!(plain.contains("api key        on"), "{plain}");
        assert!(s.text(true).contains("\x1b[1mmodel"));
    }
}
