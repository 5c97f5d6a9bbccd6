//! From a model folder and a profile to a running engine, in the order the
//! design promises: plan (headers only), refuse if it does not fit, map the
//! checkpoint, then allocate exactly the plan and charge the ledger.
//!
//! `generate`, `bench` and `serve` all start here.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use thiserror::Error;

use crate::backend::KvLayout;
use crate::backend::cpu::CpuBackend;
use crate::checkpoint::config::ModelConfig;
use crate::checkpoint::{self, Checkpoint, CheckpointError, PageCachePolicy};
use crate::engine::{Engine, EngineError, EngineLimits};
use crate::host::{HostError, HostReading, KubeletSource};
use crate::model::source::CheckpointSource;
use crate::model::{Buffers, ModelError, Transformer};
use crate::plan::geometry::LayerAttention;
use crate::plan::ledger::{Category, Ledger, WeightsResidency};
use crate::plan::memory::{WeightBytes, WeightGroup};
use crate::plan::profile::{KubeletMode, Profile};
use crate::plan::{self, Plan, PlanDevice, PlanError};
use crate::text::{TextError, Tokenizer};

#[derive(Debug, Error)]
pub enum RuntimeError {
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    #[error(transparent)]
    Host(#[from] HostError),
    #[error(transparent)]
    Plan(#[from] PlanError),
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error(transparent)]
    Engine(#[from] EngineError),
    #[error(transparent)]
    Text(#[from] TextError),
    #[error("the plan does not fit this host: {0}")]
    DoesNotFit(String),
    #[error(transparent)]
    Ledger(#[from] crate::plan::ledger::LedgerError),
}

/// A model folder, planned and mapped: everything an engine borrows from.
pub struct Loaded {
    pub dir: PathBuf,
    pub config: ModelConfig,
    pub profile: Profile,
    pub plan: Plan,
    pub ledger: Arc<Ledger>,
    pub backend: CpuBackend,
    pub checkpoint: Checkpoint,
    pub tokenizer: Option<Arc<Tokenizer>>,
    pub eos: Vec<u32>,
    _charges: Vec<crate::plan::ledger::Charge>,
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

/// Exact weight bytes by group from a checkpoint's headers.
pub fn header_weight_bytes(config: &ModelConfig, headers: &checkpoint::HeaderSet) -> WeightBytes {
    let mut bytes = WeightBytes::zero();
    for t in &headers.tensors {
        let group = checkpoint::groups::group_of(config.architecture, &t.name)
            .unwrap_or(WeightGroup::Attention);
        bytes.add(group, t.byte_len);
    }
    bytes
}

/// Plans for the checkpoint in `dir` with `profile` (or defaults made from
/// its config) on the host `host` describes: headers only, nothing mapped.
pub fn plan_checkpoint(
    dir: &Path,
    profile: Option<&Profile>,
    host: &HostSource<'_>,
    device: PlanDevice,
) -> Result<(ModelConfig, Profile, Plan), RuntimeError> {
    let config = ModelConfig::load(dir)?;
    let geometry = config.geometry();
    let profile = match profile {
        Some(p) => {
            plan::check_geometry(&p.model.geometry(), &geometry)?;
            p.clone()
        }
        None => Profile::for_geometry(&geometry, Some(dir.to_path_buf())),
    };
    let headers = checkpoint::read_headers(dir)?;
    checkpoint::check_tensors(&config, &headers)?;
    let reading = host.read(profile.host.kubelet)?;
    let plan = plan::compute(
        &profile,
        &plan::host_figures(&reading),
        Some(header_weight_bytes(&config, &headers)),
        device,
    );
    Ok((config, profile, plan))
}

impl Loaded {
    /// Plans, refuses if the plan does not fit, then maps the checkpoint and
    /// loads the tokenizer. Nothing else is allocated yet.
    pub fn open(
        dir: &Path,
        profile: Option<&Profile>,
        host: &HostSource<'_>,
        page_cache: PageCachePolicy,
    ) -> Result<Loaded, RuntimeError> {
        // Only the CPU backend is built into the runtime so far.
        let (config, profile, plan) = plan_checkpoint(dir, profile, host, PlanDevice::Cpu)?;
        if !plan.fits {
            let advice = plan
                .shortfall
                .as_ref()
                .map(|s| s.advice.join("; "))
                .unwrap_or_default();
            return Err(RuntimeError::DoesNotFit(advice));
        }
        let ledger = Ledger::from_plan(&plan);
        let checkpoint = Checkpoint::open(dir)?;
        match page_cache {
            PageCachePolicy::Keep => {}
            PageCachePolicy::WillNeed => checkpoint.prefetch()?,
            PageCachePolicy::DontNeed => checkpoint.release()?,
        }
        ledger.set_page_cache_policy(page_cache.name());
        ledger.set_weights_residency(WeightsResidency::Mapped);
        // The mapped weights are the plan's weights: charge exactly them.
        let weights = ledger.charge(Category::Weights, plan.weights.total, "mapped checkpoint")?;
        // A reservation: the process's code, tokenizer and allocator slack.
        let overhead = ledger.charge(
            Category::RuntimeOverhead,
            plan.runtime_overhead.bytes,
            "process, tokenizer, allocator slack",
        )?;
        let (tokenizer, eos) = if dir.join("tokenizer.json").is_file() {
            let t = Tokenizer::from_dir(dir)?;
            let eos = t.eos_token_ids().to_vec();
            (Some(Arc::new(t)), eos)
        } else {
            (None, Vec::new())
        };
        Ok(Loaded {
            dir: dir.to_path_buf(),
            backend: CpuBackend::new(Arc::clone(&ledger)),
            config,
            profile,
            plan,
            ledger,
            checkpoint,
            tokenizer,
            eos,
            _charges: vec![weights, overhead],
        })
    }

    pub fn source(&self) -> CheckpointSource<'_> {
        CheckpointSource {
            checkpoint: &self.checkpoint,
            config: &self.config,
        }
    }

    /// The KV cache geometry of the plan.
    pub fn kv_layout(&self) -> KvLayout {
        let g = self.profile.model.geometry();
        let s = &self.plan.serving;
        KvLayout {
            kv_heads: g.num_kv_heads,
            head_dim: g.head_dim,
            block_size: s.kv_block_size,
            blocks: self.plan.kv_cache.blocks as usize,
            ring_slots: s.max_num_seqs,
            window: self.plan.kv_cache.sliding.window_tokens as usize,
            sliding_layers: (0..g.num_layers)
                .map(|i| g.layer_attention(i) == LayerAttention::SlidingAttention)
                .collect(),
            dtype: s.kv_cache_dtype,
        }
    }

    /// Builds the model over the mapped weights and allocates the plan's
    /// activations, MoE workspace and KV cache.
    pub fn engine<'w>(
        &'w self,
        source: &'w CheckpointSource<'w>,
    ) -> Result<Engine<'w, CpuBackend>, RuntimeError> {
        let model = Transformer::load(&self.backend, &self.config, source)?;
        let buffers = Buffers::allocate(&self.backend, &self.plan, &self.kv_layout())?;
        let s = &self.plan.serving;
        let limits = EngineLimits {
            max_num_seqs: s.max_num_seqs,
            max_num_batched_tokens: s.max_num_batched_tokens,
            max_model_len: s.max_model_len,
            kv_blocks: self.plan.kv_cache.blocks as usize,
            kv_block_size: s.kv_block_size,
        };
        Ok(Engine::new(
            &self.backend,
            model,
            buffers,
            limits,
            self.tokenizer.clone(),
            self.eos.clone(),
        )?)
    }
}
