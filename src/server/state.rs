//! What every handler shares: the server's configuration (model, plan,
//! ledger, engine handle, access settings), its request counters and
//! latency histograms, the request limits and the preparation pool.
//! Built once at start-up; the router hands it to each handler.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use super::engine_loop::EngineHandle;
use super::guard::MemoryGuard;
use super::latency::LatencyMetrics;
use super::limits::RequestLimits;
use super::prep::PrepPool;
use crate::checkpoint::load::LoadProgress;
use crate::engine::grammar::LazyGrammarCompiler;
use crate::engine::{EngineCounters, EngineLimits};
use crate::plan::Plan;
use crate::plan::ledger::Ledger;
use crate::text::parsers::OutputParsers;
use crate::text::{ChatTemplate, RenderLimits, Tokenizer};

/// Largest request bodies prepared (parsed, rendered, tokenized) at once:
/// the tokenizer's memory is proportional to its input, so this bounds it.
const PREP_BUDGET_BODIES: usize = 2;

/// Requests to the generation routes by outcome, for `/metrics`: each is
/// counted once, by its answer's status or by how its stream ended.
#[derive(Debug, Default)]
pub struct RequestCounters {
    pub ok: AtomicU64,
    /// Answered 4xx (bad input, unknown model, a body too large).
    pub client_error: AtomicU64,
    /// Answered 5xx, or failed after its stream started.
    pub server_error: AtomicU64,
    /// Refused for capacity: 429 (queue full) or 503 (memory guard, engine
    /// stopped, shutting down).
    pub rejected: AtomicU64,
    /// Admitted, then the client went away before the answer ended.
    pub cancelled: AtomicU64,
}

impl RequestCounters {
    /// An answer that ran to its end (`ok`) or failed on the way (5xx).
    pub fn finished(&self, ok: bool) {
        let counter = if ok { &self.ok } else { &self.server_error };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// A request answered with an error `status` before any output.
    pub fn refused(&self, status: axum::http::StatusCode) {
        let counter = if status == axum::http::StatusCode::TOO_MANY_REQUESTS
            || status == axum::http::StatusCode::SERVICE_UNAVAILABLE
        {
            &self.rejected
        } else if status.is_client_error() {
            &self.client_error
        } else if status.is_success() {
            &self.ok
        } else {
            &self.server_error
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    pub fn cancelled(&self) {
        self.cancelled.fetch_add(1, Ordering::Relaxed);
    }
}

/// Everything the handlers share.
pub struct ServerState {
    /// What the server was started with.
    pub config: ServerConfig,
    pub started_unix: u64,
    pub counters: RequestCounters,
    /// What a client may size, and the pool prompts are prepared in.
    pub request_limits: RequestLimits,
    pub prep: PrepPool,
    /// Compiles the structured-output grammars (built on first use).
    pub grammars: LazyGrammarCompiler,
    /// The latency histograms (observed by the requests' event sinks and
    /// the engine loop).
    pub latency: Arc<LatencyMetrics>,
    request_ids: AtomicU64,
}

/// What the server is started with: the model, its plan and ledger, the
/// engine thread's handle and the access settings.
pub struct ServerConfig {
    /// Served in `/v1/models`.
    pub model_name: String,
    /// Further names requests may give as `model` (`--served-model-name`'s
    /// later values).
    pub model_aliases: Vec<String>,
    /// What a request's unset sampling fields default to (`--generation-config`).
    pub generation_defaults: crate::text::GenerationDefaults,
    /// `--seed`: where requests without a seed take theirs.
    pub default_seed: Option<super::seeds::SeedSequence>,
    pub limits: EngineLimits,
    pub plan: Plan,
    pub ledger: Arc<Ledger>,
    pub guard: Arc<MemoryGuard>,
    pub engine: EngineHandle,
    pub engine_counters: Arc<EngineCounters>,
    pub tokenizer: Option<Arc<Tokenizer>>,
    pub chat_template: Option<ChatTemplate>,
    /// How chat answers are split into reasoning, content and tool calls.
    pub output_parsers: OutputParsers,
    /// The key every route but `/health` and `/ready` requires; `None`
    /// leaves them open.
    pub api_key: Option<String>,
    /// `--metrics-no-auth`: `/metrics` answers without the key.
    pub metrics_no_auth: bool,
    /// Cross-origin requests (`--allowed-origins`); `None` adds no headers.
    pub cors: Option<super::cors::CorsPolicy>,
    /// The host tree the kubepods cgroup is read below.
    pub host_root: PathBuf,
    /// Start-up's progress, then the weights' measured residency.
    pub loading: Arc<LoadProgress>,
}

impl ServerState {
    pub fn new(mut config: ServerConfig) -> ServerState {
        let request_limits = RequestLimits::new(
            config.limits.max_model_len,
            config
                .tokenizer
                .as_deref()
                .map(Tokenizer::longest_token_bytes),
        );
        // A rendered prompt over max_prompt_bytes is refused anyway: the
        // template stops writing there instead of after the whole text.
        // (Without a tokenizer the bound is 0 and no text prompt is taken;
        // the routes say so before rendering.)
        let max_prompt_bytes = request_limits.max_prompt_bytes;
        config.chat_template = config.chat_template.take().map(|template| {
            let limits = template.limits();
            template.with_limits(RenderLimits {
                max_output_bytes: if max_prompt_bytes > 0 {
                    limits.max_output_bytes.min(max_prompt_bytes)
                } else {
                    limits.max_output_bytes
                },
                ..limits
            })
        });
        let prep = PrepPool::new(
            std::thread::available_parallelism().map_or(1, usize::from),
            PREP_BUDGET_BODIES.saturating_mul(request_limits.max_body_bytes),
        );
        ServerState {
            latency: Arc::new(LatencyMetrics::new(
                config.limits.max_model_len,
                &config.model_name,
            )),
            grammars: LazyGrammarCompiler::new(config.tokenizer.clone()),
            config,
            started_unix: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            counters: RequestCounters::default(),
            request_limits,
            prep,
            request_ids: AtomicU64::new(1),
        }
    }

    pub fn next_request_id(&self) -> u64 {
        self.request_ids.fetch_add(1, Ordering::Relaxed)
    }

    pub(crate) fn kubepods(&self) -> Option<crate::host::CgroupMemory> {
        crate::host::cgroup::read_kubepods(&self.config.host_root)
            .ok()
            .flatten()
    }
}
