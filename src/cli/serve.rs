//! `sparkrt serve`: plan, refuse if it does not fit, load, allocate exactly
//! the plan, serve the OpenAI-compatible API.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::{Context, Result};

use super::EXIT_DOES_NOT_FIT;
use super::common::{
    ChatTemplateArgs, ModelArgs, ParserArgs, ServingArgs, dummy_if_asked, resolve, set_threads,
};
use super::vllm_compat::VllmArgs;
use crate::backend::Backend;
use crate::checkpoint::load::LoadProgress;
use crate::checkpoint::{CheckpointError, PageCachePolicy};
use crate::runtime::{HostSource, Loaded, LoadedModel, RuntimeError, Startup};
use crate::server::cors::CorsPolicy;
use crate::server::engine_loop::{self, EngineHandle, Gauges};
use crate::server::guard::MemoryGuard;
use crate::server::listen::{self, BodyPace, ConnectionLimits};
use crate::server::loading::{LoadingState, RouterSwitch};
use crate::server::seeds::SeedSequence;
use crate::server::{ServerConfig, ServerState, expose, fds, router};
use crate::text::render_worker::{self, RenderWorkers};
use crate::text::{ChatTemplate, GenerationDefaults};
use crate::units::format_bytes;
use sparkrt_wire::LoadPhase;
use tokio::sync::watch;

#[derive(Debug, clap::Args)]
pub struct ServeArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub template: ChatTemplateArgs,
    #[command(flatten)]
    pub parsers: ParserArgs,
    #[command(flatten)]
    pub serving: ServingArgs,
    #[command(flatten)]
    pub vllm: VllmArgs,
    #[command(flatten)]
    pub cors: super::cors_args::CorsArgs,
    /// Listen on a non-loopback `--host` without an API key (logged as a
    /// warning): anyone who reaches the port can use the model.
    #[arg(long)]
    pub insecure_no_api_key: bool,
    /// With an API key, leave `/metrics` open (as vLLM does) so a scraper
    /// needs no key; it then shows anyone who reaches the port the served
    /// model's name, load and memory figures (no prompts or outputs).
    #[arg(long)]
    pub metrics_no_auth: bool,
    /// Concurrent connections; beyond them a connection gets 503 and is
    /// closed [default: RLIMIT_NOFILE less a reserve of 96, at most 4096].
    #[arg(long, value_name = "N")]
    pub max_connections: Option<usize>,
    /// Header read (and keep-alive idle) timeout in milliseconds (tests).
    #[arg(long, hide = true, default_value_t = listen::HEADER_READ_TIMEOUT.as_millis() as u64)]
    pub header_timeout_ms: u64,
    /// A request body must arrive within this many milliseconds (tests).
    #[arg(long, hide = true, default_value_t = listen::BODY_TIMEOUT.as_millis() as u64)]
    pub body_timeout_ms: u64,
    /// The least average rate of a body after the grace, bytes/s; 0: none (tests).
    #[arg(long, hide = true, default_value_t = listen::MIN_BODY_BYTES_PER_S)]
    pub min_body_rate: u64,
    /// How long a body may take before its rate counts, in milliseconds (tests).
    #[arg(long, hide = true, default_value_t = listen::BODY_RATE_GRACE.as_millis() as u64)]
    pub body_rate_grace_ms: u64,
    /// How long a server whose engine is gone answers 503 before it exits 1,
    /// in milliseconds (tests).
    #[arg(long, hide = true, default_value_t = engine_loop::ENGINE_FAILURE_GRACE.as_millis() as u64)]
    pub engine_failure_grace_ms: u64,
    /// Fault injection (tests): the engine thread panics after this many
    /// steps that ran the model.
    #[arg(long, hide = true, value_name = "N")]
    pub fault_engine_panic_after_steps: Option<u64>,
    /// Fault injection (tests): after this many steps that ran the model,
    /// the next step fails as a lost device does (a sticky CUDA error).
    #[arg(long, hide = true, value_name = "N")]
    pub fault_device_lost_after_steps: Option<u64>,
    /// How long answers in flight may finish after SIGTERM, in milliseconds (tests).
    #[arg(long, hide = true, default_value_t = listen::DRAIN_TIMEOUT.as_millis() as u64)]
    pub drain_timeout_ms: u64,
    /// Kubelet configuration file [default: <host-root>/var/lib/kubelet/config.yaml].
    #[arg(long, value_name = "FILE")]
    pub kubelet_config: Option<PathBuf>,
    /// Sequences allowed to wait for a slot (each choice counts) before new
    /// requests get 429 [default: the plan's `queue` line: as many
    /// worst-case queued sequences as fit in a quarter of the safety margin].
    #[arg(long)]
    pub max_queue: Option<usize>,
    /// How often the memory guard reads MemAvailable, in milliseconds.
    #[arg(long, default_value_t = 500)]
    pub guard_interval_ms: u64,
    /// Report ready once the weights are mapped, without reading them in
    /// first (`madvise(WILLNEED)` only): faster to ready, slower first
    /// requests on a cold page cache.
    #[arg(long)]
    pub lazy_load: bool,
    /// Holds the weights' reading to this many bytes per second (tests:
    /// watching a load in progress).
    #[arg(long, hide = true, value_name = "BYTES")]
    pub load_throttle_bytes_per_s: Option<u64>,
}

/// The binary a template worker runs: this very one (`/proc/self/exe`
/// stays this binary even when the file is replaced by an upgrade).
fn worker_exe() -> Result<std::path::PathBuf> {
    let exe = std::path::PathBuf::from("/proc/self/exe");
    if exe.exists() {
        return Ok(exe);
    }
    std::env::current_exe().context("finding this binary to run chat-template workers")
}

pub fn run(args: &ServeArgs) -> Result<ExitCode> {
    set_threads(args.model.threads)?;
    let api_key = args.serving.api_key()?;
    // Where and how it listens is checked before the model loads.
    let address = expose::resolve(&args.serving.host, args.serving.port)?;
    if expose::check(
        &args.serving.host,
        address,
        api_key.is_some(),
        args.insecure_no_api_key,
    )? {
        tracing::warn!(
            "listening on {address} without an API key (--insecure-no-api-key): anyone who \
             reaches port {} can use the model",
            address.port()
        );
    }
    let open_files = fds::raise_open_file_limit()?;
    let connections = ConnectionLimits {
        header_read_timeout: Duration::from_millis(args.header_timeout_ms.max(1)),
        body: BodyPace {
            timeout: Duration::from_millis(args.body_timeout_ms.max(1)),
            min_bytes_per_s: args.min_body_rate,
            rate_grace: Duration::from_millis(args.body_rate_grace_ms),
        },
        max_connections: fds::connection_cap(open_files, args.max_connections)?,
        drain_timeout: Duration::from_millis(args.drain_timeout_ms),
    };
    args.vllm.check()?;
    // Checked before the load.
    let cors = args.cors.policy()?;
    let model_args = ModelArgs {
        model: args.vllm.model(args.model.model.as_deref())?,
        ..args.model.clone()
    };
    let (dir, profile) = resolve(&model_args, &args.serving)?;
    super::vllm_compat::check_quantization(args.vllm.quantization.as_deref(), &dir)?;
    // Read from the checkpoint itself, not a `--load-format dummy` copy.
    let generation = args.vllm.generation_config().load(&dir)?;
    let (dir, _dummy) = dummy_if_asked(&model_args, &dir)?;
    // Before the weights load: a broken template is a start-up error; none
    // at all leaves the chat routes answering 400.
    // Rendered in capped worker processes: a template that builds huge
    // values kills its worker, not the server.
    let chat_template = match args.template.load(&dir)? {
        Some(template) => {
            let workers = RenderWorkers::new(
                worker_exe()?,
                template.source().to_string(),
                render_worker::DEFAULT_WORKER_MEMORY_BYTES,
                render_worker::DEFAULT_WORKERS,
            );
            // One worker now: one that cannot run stops the start.
            workers.check()?;
            Some(template.isolated(workers))
        }
        None => None,
    };
    if chat_template.is_none() {
        tracing::info!("no chat template in the checkpoint: /v1/chat/completions answers 400");
    }
    let host = HostSource {
        root: &args.model.host_root,
        kubelet_config: args.kubelet_config.as_deref(),
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the HTTP runtime")?;
    // The server listens while the weights load: /health, /ready and
    // /v1/memory answer with the progress (see server::loading).
    let progress = Arc::new(LoadProgress::new());
    if let Some(rate) = args.load_throttle_bytes_per_s {
        progress.throttle(rate);
    }
    let listener = runtime
        .block_on(tokio::net::TcpListener::bind(address))
        .with_context(|| format!("binding {address}"))?;
    let url = format!("http://{}", listener.local_addr()?);
    let switch = RouterSwitch::new(LoadingState {
        progress: Arc::clone(&progress),
        api_key: api_key.clone(),
    });
    // A shutdown signal stops the load too, so SIGTERM while loading ends
    // the process within a read.
    let (stop, stopped) = watch::channel(false);
    let stop = Arc::new(stop);
    runtime.spawn({
        let progress = Arc::clone(&progress);
        let drain = connections.drain_timeout;
        let stop = Arc::clone(&stop);
        async move {
            shutdown_signal(drain).await;
            progress.cancel();
            let _ = stop.send(true);
        }
    });
    let accept_loop = runtime.spawn(listen::serve(
        listener,
        switch.router(),
        connections,
        wait_for_stop(stopped),
    ));
    super::summary::say(&format!(
        "loading the model; /health, /ready and /v1/memory answer on {url}"
    ));
    let startup = Startup {
        page_cache: PageCachePolicy::WillNeed,
        resident: !args.lazy_load,
        progress: &progress,
    };
    let opened = LoadedModel::start(
        &dir,
        Some(&profile),
        &host,
        &args.model.device_options(),
        &startup,
    );
    let loaded = match opened {
        Ok(loaded) => loaded,
        Err(e) => {
            progress.fail(e.to_string());
            // Cancelled: the signal has stopped the accept loop already.
            progress.cancel();
            accept_loop.abort();
            runtime.shutdown_timeout(Duration::from_secs(1));
            return match e {
                RuntimeError::Checkpoint(CheckpointError::Cancelled) => {
                    super::summary::say("stopped while loading");
                    Ok(ExitCode::SUCCESS)
                }
                RuntimeError::DoesNotFit(why) => {
                    eprintln!("error: the plan does not fit this host, not serving: {why}");
                    Ok(ExitCode::from(EXIT_DOES_NOT_FIT))
                }
                other => Err(other.into()),
            };
        }
    };
    let job = Serve {
        args,
        api_key,
        cors,
        generation,
        dir: &dir,
        url,
        connections,
        chat_template,
        runtime,
        accept_loop,
        switch,
        progress,
        stop,
    };
    match &loaded {
        LoadedModel::Cpu(loaded) => serve(job, loaded.as_ref()),
        LoadedModel::Cuda(loaded) => serve(job, loaded.as_ref()),
    }
}

/// Resolves once `stopped` turns true (or its sender is gone).
async fn wait_for_stop(mut stopped: watch::Receiver<bool>) {
    let _ = stopped.wait_for(|stop| *stop).await;
}

/// Serving the loaded model until a shutdown signal.
struct Serve<'a> {
    args: &'a ServeArgs,
    api_key: Option<String>,
    cors: Option<CorsPolicy>,
    /// The sampling defaults and the summary's line about them.
    generation: (GenerationDefaults, String),
    dir: &'a Path,
    url: String,
    connections: ConnectionLimits,
    chat_template: Option<ChatTemplate>,
    runtime: tokio::runtime::Runtime,
    /// Accepting since before the load, on `switch`'s router.
    accept_loop: tokio::task::JoinHandle<()>,
    switch: Arc<RouterSwitch>,
    progress: Arc<LoadProgress>,
    /// Stops the accept loop (the shutdown signal's, and a broken engine's
    /// after its grace).
    stop: Arc<watch::Sender<bool>>,
}

fn serve<B: Backend>(job: Serve<'_>, loaded: &Loaded<B>) -> Result<ExitCode> {
    let Serve {
        args,
        api_key,
        cors,
        generation: (generation_defaults, sampling_line),
        dir,
        url,
        connections,
        chat_template,
        runtime,
        accept_loop,
        switch,
        progress,
        stop,
    } = job;
    progress.begin(LoadPhase::Allocating, 0);
    // `--served-model-name` is laid over `[model] name` in the profile.
    let model_name = loaded.profile.model.name.clone().unwrap_or_else(|| {
        dir.file_name()
            .map_or("model".to_string(), |n| n.to_string_lossy().into_owned())
    });
    let output_parsers = args.parsers.output_parsers(
        loaded.config.geometry.architecture,
        chat_template
            .as_ref()
            .and_then(ChatTemplate::tool_call_format),
        loaded.tokenizer.as_deref(),
    )?;
    let source = loaded.source();
    let engine = loaded.engine(&source)?;
    let limits = engine.limits().clone();
    // The plan's bound (from memory, see `plan::memory::QueuePlan`).
    let max_queue = args.max_queue.unwrap_or(loaded.plan.queue.max_queue);
    let engine_counters = Arc::clone(&engine.counters);

    let guard = MemoryGuard::new(
        args.model.host_root.clone(),
        loaded.plan.host.eviction_hard,
        loaded.plan.host.safety_margin,
    );
    guard.account_for(Arc::clone(&loaded.ledger), loaded.backend.buffer_memory());
    guard.check();
    let stop_guard = Arc::new(AtomicBool::new(false));
    let guard_thread = guard.spawn(
        Duration::from_millis(args.guard_interval_ms.max(10)),
        Arc::clone(&stop_guard),
    );

    let (commands, receiver) = std::sync::mpsc::channel();
    let gauges = Arc::new(Gauges::default());
    let state = Arc::new(ServerState::new(ServerConfig {
        model_name,
        model_aliases: args
            .serving
            .served_model_name
            .iter()
            .skip(1)
            .cloned()
            .collect(),
        generation_defaults,
        default_seed: args.vllm.seed.map(SeedSequence::new),
        limits,
        plan: loaded.plan.clone(),
        ledger: Arc::clone(&loaded.ledger),
        guard: Arc::clone(&guard),
        engine: EngineHandle {
            commands,
            gauges: Arc::clone(&gauges),
        },
        engine_counters,
        tokenizer: loaded.tokenizer.clone(),
        chat_template,
        output_parsers,
        api_key,
        cors,
        metrics_no_auth: args.metrics_no_auth,
        host_root: args.model.host_root.clone(),
        loading: Arc::clone(&progress),
    }));

    let mut summary = super::summary::StartupSummary::new(
        &loaded.plan,
        &state.config.model_name,
        &format!("{} ({:?})", loaded.backend.name(), loaded.plan.device).to_lowercase(),
        &format!(
            "{:?}",
            loaded
                .ledger
                .snapshot()
                .weights_residency
                .unwrap_or(sparkrt_wire::WeightsResidency::Mapped)
        )
        .to_lowercase(),
    );
    summary.api_key = state.config.api_key.is_some();
    if let Some(cors) = &state.config.cors {
        summary.cors = cors.describe();
    }
    summary.sampling = match args.vllm.seed {
        Some(seed) => format!("{sampling_line}; seed {seed}"),
        None => sampling_line,
    };
    summary.queue = format!(
        "{max_queue} sequences{}",
        if args.max_queue.is_some() {
            " (--max-queue)".to_owned()
        } else {
            format!(
                " ({} of the safety margin / {} per queued sequence)",
                format_bytes(loaded.plan.queue.budget),
                format_bytes(loaded.plan.queue.bytes_per_sequence)
            )
        }
    );
    summary.address = url;

    let latency = Arc::clone(&state.latency);
    switch.serve_with(router(state));
    // From here only the accept loop holds the router (and through it the
    // engine's command sender): once it ends, the engine thread ends too.
    drop(switch);
    progress.begin(LoadPhase::Ready, 0);
    let loop_options = engine_loop::LoopOptions {
        max_queue,
        panic_after_steps: args.fault_engine_panic_after_steps,
        device_lost_after_steps: args.fault_device_lost_after_steps,
    };
    let grace = Duration::from_millis(args.engine_failure_grace_ms);
    let handle = runtime.handle().clone();
    let served = std::thread::scope(|scope| {
        scope.spawn(|| {
            engine_loop::run(engine, receiver, &gauges, &loop_options, &latency);
            // A broken engine (failed steps, a panic): the server answers
            // 503 with the reason for the grace, then stops and exits 1.
            if let Some(why) = gauges.failure() {
                tracing::error!(
                    grace_ms = grace.as_millis() as u64,
                    "the engine is gone ({why}); exiting after the grace period"
                );
                handle.spawn(async move {
                    tokio::time::sleep(grace).await;
                    let _ = stop.send(true);
                });
            }
        });
        summary.emit();
        super::summary::listening(&summary.address);
        tracing::info!(
            max_connections = connections.max_connections,
            header_timeout_ms = connections.header_read_timeout.as_millis() as u64,
            body_timeout_ms = connections.body.timeout.as_millis() as u64,
            min_body_rate = connections.body.min_bytes_per_s,
            "serving"
        );
        let result = runtime.block_on(accept_loop);
        // Whatever is left (a task still holding the router) goes now, so
        // the engine thread sees its command sender gone, finishes and stops.
        runtime.shutdown_timeout(Duration::from_secs(1));
        result
    });
    stop_guard.store(true, Ordering::Release);
    let _ = guard_thread.join();
    served.map_err(|e| super::RuntimeFailure(anyhow::Error::new(e)))?;
    if let Some(why) = gauges.failure() {
        return Err(super::RuntimeFailure(anyhow::anyhow!("the engine failed: {why}")).into());
    }
    super::summary::say("stopped");
    Ok(ExitCode::SUCCESS)
}

/// Resolves on Ctrl-C or SIGTERM.
async fn shutdown_signal(drain: Duration) {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = terminate => {},
    }
    super::summary::say(&format!(
        "shutting down (finishing requests in flight for up to {} s)",
        drain.as_secs_f64()
    ));
}
