//! From a model folder and a profile to a running engine, in the order the
//! design promises: plan (headers only), refuse if it does not fit, map the
//! checkpoint, then allocate exactly the plan and charge the ledger.
//!
//! `generate`, `bench` and `serve` all start here.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use thiserror::Error;

use crate::backend::cpu::CpuBackend;
use crate::backend::cuda::{CudaBackend, CudaOptions, WeightsPolicy};
use crate::backend::{Backend, BackendError, KvLayout};
use crate::checkpoint::config::ModelConfig;
use crate::checkpoint::kv_scales::{self, KvScaleError, KvScales};
use crate::checkpoint::load::LoadProgress;
use crate::checkpoint::{self, Checkpoint, CheckpointError, CheckpointFiles, PageCachePolicy};
use crate::engine::{Engine, EngineError, EngineLimits, ModelExecutor};
use crate::geometry::WeightGroup;
use crate::host::{HostError, HostReading, KubeletSource};
use crate::model::source::CheckpointSource;
use crate::model::{Buffers, ModelError, Transformer};
use crate::plan::ledger::{self, Category, Charge, Ledger, WeightsResidency};
use crate::plan::memory::{self, WeightBytes};
use crate::plan::profile::{
    CheckpointFacts, DeviceKind, KubeletMode, KvCacheDtype, Profile, ServingSection,
};
use crate::plan::{self, Plan, PlanDevice, PlanError};
use crate::text::{TextError, Tokenizer};
use sparkrt_wire::LoadPhase;

#[derive(Debug, Error)]
pub enum RuntimeError {
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    #[error(transparent)]
    Host(#[from] HostError),
    #[error(transparent)]
    Plan(#[from] PlanError),
    /// Boxed: a profile error carries its file and message.
    #[error(transparent)]
    Profile(Box<crate::plan::profile::ProfileError>),
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error(transparent)]
    Engine(#[from] EngineError),
    #[error(transparent)]
    Text(#[from] TextError),
    #[error("the CUDA backend cannot start")]
    Backend(#[from] BackendError),
    #[error("the plan does not fit this host: {0}")]
    DoesNotFit(String),
    #[error(transparent)]
    Ledger(#[from] crate::plan::ledger::LedgerError),
    #[error(transparent)]
    KvScales(#[from] KvScaleError),
    /// A serving setting this checkpoint cannot have.
    #[error("{0}")]
    Unsupported(String),
}

/// A model folder, planned and mapped, on backend `B`: everything an
/// engine borrows from.
pub struct Loaded<B: Backend> {
    pub dir: PathBuf,
    pub config: ModelConfig,
    pub profile: Profile,
    pub plan: Plan,
    pub ledger: Arc<Ledger>,
    pub backend: B,
    pub checkpoint: Checkpoint,
    pub tokenizer: Option<Arc<Tokenizer>>,
    pub eos: Vec<u32>,
    _charges: Vec<Charge>,
}

/// The model on the backend chosen at start-up. This is the one place the
/// CPU / CUDA choice is made: past it, everything is written once over
/// `B: Backend` and handed its backend's own buffers and weights, so a mix-up
/// cannot compile. A command matches on it once and calls its own generic
/// code with the [`Loaded`] inside.
pub enum LoadedModel {
    Cpu(Box<Loaded<CpuBackend>>),
    Cuda(Box<Loaded<CudaBackend>>),
}

/// Where the model runs: `--backend` over the profile's `[backend] device`,
/// and where the CUDA backend caches its compiled kernels.
#[derive(Clone, Debug, Default)]
pub struct DeviceOptions {
    /// Overrides the profile's `[backend] device`.
    pub device: Option<DeviceKind>,
    /// CUBIN cache directory (`--cache-dir`; see `backend::cuda::cache`).
    pub cache_dir: Option<PathBuf>,
    /// How the CUDA backend reaches the weights (`--weights-policy`).
    pub weights_policy: WeightsPolicy,
}

/// Whether a CUDA device is there to try, or why not.
fn cuda_present() -> Result<(), String> {
    match crate::host::gpu::probe() {
        crate::host::gpu::GpuProbe::Present { .. } => Ok(()),
        crate::host::gpu::GpuProbe::Absent { reason } => Err(reason),
    }
}

/// How the weights come in once mapped, and where start-up reports its
/// progress (and is asked to stop).
pub struct Startup<'a> {
    /// Applied to the checkpoint's pages when they are not read in first.
    pub page_cache: PageCachePolicy,
    /// Read every weight page into the page cache before returning
    /// ([`Checkpoint::load_pages`]); `serve` does, unless `--lazy-load`.
    pub resident: bool,
    pub progress: &'a LoadProgress,
}

impl<'a> Startup<'a> {
    /// Pages come in as the model first reads them (`generate`, `bench`).
    pub fn lazy(page_cache: PageCachePolicy, progress: &'a LoadProgress) -> Startup<'a> {
        Startup {
            page_cache,
            resident: false,
            progress,
        }
    }
}

/// Where the host figures of the plan come from.
pub struct HostSource<'a> {
    pub root: &'a Path,
    pub kubelet_config: Option<&'a Path>,
}

impl Default for HostSource<'_> {
    fn default() -> Self {
        HostSource {
            root: Path::new("/"),
            kubelet_config: None,
        }
    }
}

impl HostSource<'_> {
    pub fn read(&self, mode: KubeletMode) -> Result<HostReading, HostError> {
        let source = match (mode, self.kubelet_config) {
            (KubeletMode::None, _) => KubeletSource::None,
            (KubeletMode::Auto, Some(path)) => KubeletSource::File(path.to_path_buf()),
            (KubeletMode::Auto, None) => KubeletSource::Auto,
        };
        crate::host::read_host(self.root, &source)
    }
}

/// The MTP layers `serving` runs of the checkpoint `config` and `headers`
/// describe: its one-layer MTP head when speculative decoding drafts with it.
fn served_mtp_layers(
    config: &ModelConfig,
    headers: &checkpoint::HeaderSet,
    serving: &ServingSection,
) -> Result<usize, RuntimeError> {
    use crate::geometry::MTP_PREFIX;
    let wanted = serving.mtp_layers();
    if wanted == 0 {
        return Ok(0);
    }
    let arch = config.geometry.architecture;
    let reason = if !arch.is_hybrid() {
        Some(format!("{} checkpoints have no MTP head", arch.name()))
    } else if config.mtp_num_hidden_layers == 0 {
        Some("the checkpoint has no MTP head (its config has no mtp_num_hidden_layers)".to_string())
    } else if config.mtp_num_hidden_layers != wanted {
        Some(format!(
            "the checkpoint's MTP head has {} layers; sparkrt serves one-layer heads",
            config.mtp_num_hidden_layers
        ))
    } else if !headers
        .tensors
        .iter()
        .any(|t| t.name.starts_with(MTP_PREFIX))
    {
        // Quantized exports often drop the head that their config still names.
        Some(format!(
            "the checkpoint's config names an MTP head but its files hold no `{MTP_PREFIX}*` tensors"
        ))
    } else {
        None
    };
    match reason {
        Some(reason) => Err(RuntimeError::Unsupported(format!(
            "speculative config \"mtp\": {reason}; draft with \"ngram\" instead"
        ))),
        None => Ok(wanted),
    }
}

/// Exact weight bytes by group from a checkpoint's headers (a served MTP
/// head's `mtp.*` tensors in [`WeightGroup::Mtp`]).
pub fn header_weight_bytes(config: &ModelConfig, headers: &checkpoint::HeaderSet) -> WeightBytes {
    let mut bytes = WeightBytes::zero();
    for t in &headers.tensors {
        let arch = config.geometry.architecture;
        if config.geometry.mtp_layers > 0 && t.name.starts_with(crate::geometry::MTP_PREFIX) {
            bytes.add(WeightGroup::Mtp, t.byte_len);
            continue;
        }
        if let Some(prefix) = checkpoint::groups::unused_prefix(arch, &t.name) {
            bytes.add_unused(prefix, t.byte_len);
            continue;
        }
        let group = checkpoint::groups::group_of(arch, &t.name).unwrap_or(WeightGroup::Attention);
        bytes.add(group, t.byte_len);
    }
    bytes
}

/// A checkpoint planned for a device: what the plan was made from and the
/// plan, with the checkpoint's files still open so that they are mapped
/// without a header being read again ([`CheckpointFiles::map`]).
pub struct Planned {
    pub config: ModelConfig,
    pub profile: Profile,
    pub plan: Plan,
    pub files: CheckpointFiles,
}

/// Plans for the checkpoint in `dir` with `profile` (or defaults made from
/// its config) on the host `host` describes: headers only, nothing mapped.
pub fn plan_checkpoint(
    dir: &Path,
    profile: Option<&Profile>,
    host: &HostSource<'_>,
    device: PlanDevice,
) -> Result<Planned, RuntimeError> {
    let (config, profile, files) = match profile {
        Some(p) => {
            let (config, files) = open_for_profile(dir, p)?;
            (config, p.clone(), files)
        }
        None => {
            let config = ModelConfig::load(dir)?;
            let profile = Profile::for_checkpoint(
                CheckpointFacts {
                    geometry: &config.geometry,
                    max_position_embeddings: config.max_position_embeddings,
                },
                Some(dir.to_path_buf()),
            )
            .map_err(|e| RuntimeError::Profile(Box::new(e)))?;
            let files = open_checked(dir, &config)?;
            (config, profile, files)
        }
    };
    let reading = host.read(profile.host.kubelet)?;
    let plan = plan::compute(
        &profile,
        &plan::host_figures(&reading),
        Some(header_weight_bytes(&config, files.headers())),
        device,
    );
    Ok(Planned {
        config,
        profile,
        plan,
        files,
    })
}

/// The checkpoint in `dir` as `profile` serves it: its config checked
/// against the profile's geometry, with the MTP layers served, and its
/// files' headers checked (a served head's tensors among them).
fn open_for_profile(
    dir: &Path,
    profile: &Profile,
) -> Result<(ModelConfig, CheckpointFiles), RuntimeError> {
    let mut config = ModelConfig::load(dir)?;
    plan::check_geometry(&profile.model.geometry, &config.geometry)?;
    let files = open_checked(dir, &config)?;
    config.geometry.mtp_layers = served_mtp_layers(&config, files.headers(), &profile.serving)?;
    Ok((config, files))
}

/// The files of the checkpoint in `dir`, each header read and validated
/// once, checked to hold exactly the tensors `config` needs.
fn open_checked(dir: &Path, config: &ModelConfig) -> Result<CheckpointFiles, RuntimeError> {
    let files = CheckpointFiles::open(dir)?;
    checkpoint::check_tensors(config, files.headers())?;
    Ok(files)
}

/// Plans `profile` on the host `host` describes, for the device the profile
/// names (`auto`: CUDA when a GPU is present): the weight bytes exact from
/// the headers of the checkpoint in `checkpoint` when one is given, else
/// estimated from the profile's geometry. What `plan` and `k8s` print.
pub fn plan_profile(
    profile: &Profile,
    checkpoint: Option<&Path>,
    host: &HostSource<'_>,
) -> Result<Plan, RuntimeError> {
    let reading = host.read(profile.host.kubelet)?;
    plan_profile_on(
        profile,
        checkpoint,
        &plan::host_figures(&reading),
        plan_device(profile),
    )
}

/// The device a plan is made for: the profile's, `auto` resolved by
/// whether a GPU is present.
pub fn plan_device(profile: &Profile) -> PlanDevice {
    let gpu_present = crate::host::gpu::probe().first().is_some();
    PlanDevice::resolve(profile.backend.device, gpu_present)
}

/// [`plan_profile`] on given host figures (a node model, not a reading)
/// and device.
pub fn plan_profile_on(
    profile: &Profile,
    checkpoint: Option<&Path>,
    host: &memory::HostFigures,
    device: PlanDevice,
) -> Result<Plan, RuntimeError> {
    let weights = match checkpoint {
        Some(dir) => {
            let (config, files) = open_for_profile(dir, profile)?;
            Some(header_weight_bytes(&config, files.headers()))
        }
        None => None,
    };
    Ok(plan::compute(profile, host, weights, device))
}

impl LoadedModel {
    /// Plans, refuses if the plan does not fit, then maps the checkpoint and
    /// loads the tokenizer, on the device the profile names.
    pub fn open(
        dir: &Path,
        profile: Option<&Profile>,
        host: &HostSource<'_>,
        page_cache: PageCachePolicy,
    ) -> Result<LoadedModel, RuntimeError> {
        LoadedModel::open_with(dir, profile, host, page_cache, &DeviceOptions::default())
    }

    /// [`LoadedModel::open`] with the device chosen by `options`. `auto`
    /// takes CUDA when a GPU is present and its backend starts, else the
    /// CPU, saying why in one log line; `cuda` fails with the reason instead.
    pub fn open_with(
        dir: &Path,
        profile: Option<&Profile>,
        host: &HostSource<'_>,
        page_cache: PageCachePolicy,
        options: &DeviceOptions,
    ) -> Result<LoadedModel, RuntimeError> {
        let progress = LoadProgress::new();
        let startup = Startup::lazy(page_cache, &progress);
        LoadedModel::start(dir, profile, host, options, &startup)
    }

    /// [`LoadedModel::open_with`] as `startup` says, with its progress shown
    /// on stderr while it runs (see [`crate::progress`]).
    pub fn start(
        dir: &Path,
        profile: Option<&Profile>,
        host: &HostSource<'_>,
        options: &DeviceOptions,
        startup: &Startup<'_>,
    ) -> Result<LoadedModel, RuntimeError> {
        let stop = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|scope| {
            let reporter = scope.spawn(|| crate::progress::report_until(startup.progress, &stop));
            let result = LoadedModel::start_on(dir, profile, host, options, startup);
            stop.store(true, std::sync::atomic::Ordering::Release);
            reporter.thread().unpark();
            result
        })
    }

    fn start_on(
        dir: &Path,
        profile: Option<&Profile>,
        host: &HostSource<'_>,
        options: &DeviceOptions,
        startup: &Startup<'_>,
    ) -> Result<LoadedModel, RuntimeError> {
        let kind = options
            .device
            .or(profile.map(|p| p.backend.device))
            .unwrap_or(DeviceKind::Auto);
        // A weights policy other than auto is a CUDA request: never
        // quietly dropped by running on the CPU.
        let policy = options.weights_policy;
        let cpu = || {
            if policy != WeightsPolicy::Auto {
                return Err(RuntimeError::Backend(BackendError::Unavailable(format!(
                    "--weights-policy {} applies to the CUDA backend, and this model would run on the CPU",
                    policy.name()
                ))));
            }
            Loaded::start_cpu(dir, profile, host, startup)
                .map(|loaded| LoadedModel::Cpu(Box::new(loaded)))
        };
        let cuda = || {
            Loaded::start_cuda(dir, profile, host, startup, options)
                .map(|loaded| LoadedModel::Cuda(Box::new(loaded)))
        };
        match kind {
            DeviceKind::Cpu => cpu(),
            DeviceKind::Cuda => {
                cuda_present()
                    .map_err(|why| RuntimeError::Backend(BackendError::Unavailable(why)))?;
                cuda()
            }
            DeviceKind::Auto => {
                if let Err(why) = cuda_present() {
                    tracing::info!("backend auto: running on the CPU ({why})");
                    return cpu();
                }
                match cuda() {
                    Err(RuntimeError::Backend(why)) if policy == WeightsPolicy::Auto => {
                        tracing::info!(
                            "backend auto: running on the CPU (CUDA did not start: {why})"
                        );
                        cpu()
                    }
                    other => other,
                }
            }
        }
    }
}

/// A checkpoint planned for a device and mapped, its ledger made: what is
/// done before a backend exists.
struct Mapped {
    dir: PathBuf,
    config: ModelConfig,
    profile: Profile,
    plan: Plan,
    ledger: Arc<Ledger>,
    checkpoint: Checkpoint,
}

impl Mapped {
    /// Plans for `device`, refuses if the plan does not fit, maps the
    /// checkpoint, then reads it in or applies the page cache policy.
    fn open(
        dir: &Path,
        profile: Option<&Profile>,
        host: &HostSource<'_>,
        startup: &Startup<'_>,
        device: PlanDevice,
    ) -> Result<Mapped, RuntimeError> {
        let (progress, page_cache) = (startup.progress, startup.page_cache);
        progress.begin(LoadPhase::Mapping, 0);
        let Planned {
            config,
            profile,
            plan,
            files,
        } = plan_checkpoint(dir, profile, host, device)?;
        if !plan.fits {
            let advice = plan
                .shortfall
                .as_ref()
                .map(|s| s.advice.join("; "))
                .unwrap_or_default();
            return Err(RuntimeError::DoesNotFit(advice));
        }
        let ledger = Ledger::from_plan(&plan);
        // The files the plan counted, mapped: no header is read again.
        let checkpoint = files.map()?;
        progress.set_probe(checkpoint.residency_probe()?);
        if startup.resident {
            load_resident(&checkpoint, progress)?;
            // Read ahead, as WILLNEED asks, and known to be in.
            ledger.set_page_cache_policy(PageCachePolicy::WillNeed);
        } else {
            match page_cache {
                PageCachePolicy::Keep => {}
                PageCachePolicy::WillNeed => checkpoint.prefetch()?,
                PageCachePolicy::DontNeed => checkpoint.release()?,
            }
            ledger.set_page_cache_policy(page_cache);
        }
        Ok(Mapped {
            dir: dir.to_path_buf(),
            config,
            profile,
            plan,
            ledger,
            checkpoint,
        })
    }

    /// The loaded model: the mapping, `backend`, and the tokenizer.
    fn with_backend<B: Backend>(
        self,
        backend: B,
        charges: Vec<Charge>,
    ) -> Result<Loaded<B>, RuntimeError> {
        let dir = self.dir;
        // `exists`, not `is_file`: a tokenizer.json that is a FIFO or a
        // folder is refused by `from_dir`, not taken for "no tokenizer".
        let (tokenizer, eos) = if dir.join("tokenizer.json").exists() {
            let t = Tokenizer::from_dir(&dir)?;
            let eos = t.eos_token_ids().to_vec();
            (Some(Arc::new(t)), eos)
        } else {
            (None, Vec::new())
        };
        Ok(Loaded {
            dir,
            backend,
            config: self.config,
            profile: self.profile,
            plan: self.plan,
            ledger: self.ledger,
            checkpoint: self.checkpoint,
            tokenizer,
            eos,
            _charges: charges,
        })
    }
}

impl Loaded<CpuBackend> {
    /// [`LoadedModel::open`] on the CPU: the weights are read in place from
    /// the mapping.
    pub fn open_cpu(
        dir: &Path,
        profile: Option<&Profile>,
        host: &HostSource<'_>,
        page_cache: PageCachePolicy,
    ) -> Result<Self, RuntimeError> {
        let progress = LoadProgress::new();
        let startup = Startup::lazy(page_cache, &progress);
        Loaded::start_cpu(dir, profile, host, &startup)
    }

    fn start_cpu(
        dir: &Path,
        profile: Option<&Profile>,
        host: &HostSource<'_>,
        startup: &Startup<'_>,
    ) -> Result<Self, RuntimeError> {
        let mapped = Mapped::open(dir, profile, host, startup, PlanDevice::Cpu)?;
        let ledger = &mapped.ledger;
        ledger.set_weights_residency(WeightsResidency::Mapped);
        // The mapped weights are the plan's weights: charge exactly them.
        let weights = ledger.charge(
            Category::Weights,
            mapped.plan.weights.total,
            ledger::WEIGHTS,
        )?;
        let overhead = charge_process_overhead(ledger, &mapped.plan)?;
        let backend = CpuBackend::new(Arc::clone(ledger));
        mapped.with_backend(backend, vec![weights, overhead])
    }
}

impl Loaded<CudaBackend> {
    /// [`LoadedModel::open`] on CUDA: kernels loaded, weights made
    /// device-readable (in place on unified memory, else copied once and
    /// the page cache released).
    pub fn open_cuda(
        dir: &Path,
        profile: Option<&Profile>,
        host: &HostSource<'_>,
        page_cache: PageCachePolicy,
        options: &DeviceOptions,
    ) -> Result<Self, RuntimeError> {
        let progress = LoadProgress::new();
        let startup = Startup {
            page_cache,
            resident: false,
            progress: &progress,
        };
        Loaded::start_cuda(dir, profile, host, &startup, options)
    }

    fn start_cuda(
        dir: &Path,
        profile: Option<&Profile>,
        host: &HostSource<'_>,
        startup: &Startup<'_>,
        options: &DeviceOptions,
    ) -> Result<Self, RuntimeError> {
        let mapped = Mapped::open(dir, profile, host, startup, PlanDevice::Cuda)?;
        if mapped.config.geometry.architecture.is_hybrid() {
            // Refused before a context is made, so `auto` runs the CPU.
            return Err(BackendError::NotSupported {
                backend: "cuda",
                what: "Gated DeltaNet (qwen3_5, qwen3_5_moe, qwen3_next)",
            }
            .into());
        }
        // Also before a context, so `auto` runs an FP8 KV cache on the CPU.
        crate::backend::cuda::check_kv_dtype(mapped.plan.serving.kv_cache_dtype)?;
        let (ledger, plan) = (&mapped.ledger, &mapped.plan);
        let mut backend = CudaBackend::new(
            Arc::clone(ledger),
            &CudaOptions {
                ordinal: 0,
                cache_dir: options.cache_dir.clone(),
            },
        )
        .map_err(BackendError::from)?;
        let checkpoint = &mapped.checkpoint;
        let regions = checkpoint.tensor_regions()?;
        // The device copy or registration is part of the same load phase.
        let progress = startup.progress;
        progress.begin(
            LoadPhase::Device,
            regions.iter().map(|r| r.len() as u64).sum(),
        );
        // A copy drops each chunk's pages once the device has it, so the
        // host never holds the checkpoint twice.
        let mut release = |chunk: &[u8]| {
            if let Err(e) = checkpoint.release_range(chunk) {
                tracing::warn!("weights: releasing copied pages failed: {e}");
            }
        };
        let residency = backend.attach_weights(
            &regions,
            options.weights_policy,
            &mut |done, total| progress.set_done(done, total),
            &mut release,
        )?;
        if residency == WeightsResidency::DeviceCopy {
            // The device has its copy: the page cache would hold it twice.
            checkpoint.release()?;
            ledger.set_page_cache_policy(PageCachePolicy::DontNeed);
        }
        tracing::info!(
            "backend: cuda on {} ({}), weights {:?}",
            backend.info().name,
            backend.info().arch(),
            residency
        );
        // The backend charges its own tables to the runtime overhead; the
        // runtime charges the rest (context, modules, allocator slack).
        let overhead = charge_process_overhead(ledger, plan)?;
        mapped.with_backend(backend, vec![overhead])
    }
}

impl<B: Backend> Loaded<B> {
    pub fn source(&self) -> CheckpointSource<'_> {
        CheckpointSource {
            checkpoint: &self.checkpoint,
            config: &self.config,
        }
    }

    /// The KV cache geometry of the plan.
    pub fn kv_layout(&self) -> KvLayout {
        self.plan.kv_cache.layout.clone()
    }

    /// Builds the model over the mapped weights and allocates the plan's
    /// activations, MoE workspace and KV cache.
    pub fn engine<'w>(
        &'w self,
        source: &'w CheckpointSource<'w>,
    ) -> Result<Engine<'w>, RuntimeError> {
        let model = Transformer::load(&self.backend, &self.config, source)?;
        let kv_scales = kv_scales_for(self.plan.kv_cache.dtype, source)?;
        let buffers = Buffers::allocate(&self.backend, &self.plan, &self.kv_layout(), &kv_scales)?;
        // Every start-up allocation is made: each must be exactly its plan.
        self.ledger.verify_complete()?;
        let s = &self.plan.serving;
        let limits = EngineLimits {
            max_num_seqs: s.max_num_seqs,
            max_num_batched_tokens: s.max_num_batched_tokens,
            max_model_len: s.max_model_len,
            kv_blocks: self.plan.kv_cache.blocks as usize,
            kv_block_size: s.kv_block_size,
            sliding_window: sliding_window(&self.kv_layout()),
            state_slots: self.plan.recurrent_state.live_slots
                * usize::from(self.plan.recurrent_state.bytes > 0),
            snapshot_slots: self.plan.recurrent_state.snapshot_slots
                * usize::from(self.plan.recurrent_state.bytes > 0),
            snapshot_interval: self.plan.recurrent_state.snapshot_interval,
            prefix_caching: s.enable_prefix_caching,
            speculative: s.speculative,
        };
        Ok(Engine::new(
            ModelExecutor::new(&self.backend, model, buffers),
            limits,
            self.tokenizer.clone(),
            self.eos.clone(),
        )?)
    }
}

/// The scales an FP8 KV cache (`dtype`) quantizes with: the checkpoint's,
/// or 1.0 with one warning when it has none. Other dtypes store values as
/// they are: 1.0 everywhere, the checkpoint's scales not read.
fn kv_scales_for(
    dtype: KvCacheDtype,
    source: &CheckpointSource<'_>,
) -> Result<KvScales, KvScaleError> {
    let layers = source.config.geometry.num_kv_layers();
    if dtype != KvCacheDtype::Fp8 {
        return Ok(KvScales::unit(layers));
    }
    match kv_scales::read(source.checkpoint, source.config)? {
        Some(scales) => {
            tracing::info!("FP8 KV cache: the checkpoint's per-layer k_scale and v_scale");
            Ok(scales)
        }
        None => {
            tracing::warn!(
                "FP8 KV cache: the checkpoint has no k_scale / v_scale, so every layer's scales \
                 are 1.0 (keys and values past ±448 saturate; accuracy may suffer)"
            );
            Ok(KvScales::unit(layers))
        }
    }
}

/// The window of the layout's sliding-window layers (0 without any).
fn sliding_window(layout: &KvLayout) -> usize {
    if layout.sliding_layers.iter().any(|&sliding| sliding) {
        layout.window
    } else {
        0
    }
}

/// Charges the runtime overhead's `process` share: what the process itself
/// takes beyond the buffers the backend allocates.
fn charge_process_overhead(ledger: &Arc<Ledger>, plan: &Plan) -> Result<Charge, RuntimeError> {
    let process = plan
        .runtime_overhead
        .buffers
        .iter()
        .find(|b| b.name == memory::PROCESS)
        .map_or(0, |b| b.bytes);
    Ok(ledger.charge(Category::RuntimeOverhead, process, memory::PROCESS)?)
}

/// Reads every weight page in (see `checkpoint::load`) and says how long it
/// took and how much the page cache holds, measured, at its end.
fn load_resident(checkpoint: &Checkpoint, progress: &LoadProgress) -> Result<(), RuntimeError> {
    let started = std::time::Instant::now();
    checkpoint.load_pages(progress)?;
    let seconds = started.elapsed().as_secs_f64();
    let bytes = checkpoint.load_bytes();
    let resident = checkpoint.residency()?;
    tracing::info!(
        bytes,
        seconds,
        resident_bytes = resident.resident,
        "weights read in: {:.2} GB in {seconds:.2} s ({:.2} GB/s), {:.1}% of the mapping resident",
        bytes as f64 / 1e9,
        bytes as f64 / 1e9 / seconds.max(1e-9),
        100.0 * resident.fraction()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::files::HEADERS_READ;

    /// The walk from a folder to a loaded model reads each file's header
    /// once: the plan's reading is the one the mapping uses.
    #[test]
    fn start_up_reads_each_header_once() {
        let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
        let host_root = repo.join("tests/fixtures/hosts/box24");
        let host = HostSource {
            root: &host_root,
            kubelet_config: None,
        };
        let profile = Profile::load(&repo.join("profiles/qwen3-moe-tiny.toml")).unwrap();
        let dir = repo.join("tests/fixtures/qwen3-moe-tiny");
        let before = HEADERS_READ.with(|count| count.get());
        let loaded = Loaded::open_cpu(&dir, Some(&profile), &host, PageCachePolicy::Keep).unwrap();
        let read = HEADERS_READ.with(|count| count.get()) - before;
        assert_eq!(loaded.checkpoint.files().len(), 1);
        assert_eq!(read, 1, "headers read during start-up");
    }
}
