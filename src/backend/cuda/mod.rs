//! The CUDA backend: the same [`Backend`] as the CPU's, computed by the
//! kernels in `kernels/*.cu` (compiled by NVRTC for the device's own
//! architecture, cached on disk), launched eagerly on one stream.
//!
//! - Activations are f32 like the CPU's; keys and values are rounded to the
//!   cache dtype the same way; the router breaks ties the same way; every
//!   formula is the CPU backend's, so results agree up to summation order.
//! - No host synchronisation inside a step: only [`Backend::read`] (the
//!   logits, host-mapped) waits for the stream.
//! - Memory is exactly the plan: the activation set, the step metadata, the
//!   KV cache and the MoE workspace are allocated once and charged to the
//!   ledger; the weights are attached once ([`CudaBackend::attach_weights`]):
//!   used in place on an integrated GPU, else copied once.
//! - A missing driver, device or NVRTC is an error, never a panic: cudarc
//!   loads libraries lazily and panics on missing symbols, so the first
//!   uses run under `catch_unwind` after checking the libraries are there.

mod attention;
mod backend;
pub mod cache;
pub mod constants;
mod driver;
mod error;
mod handles;
pub mod kernels;
mod memory;
mod moe;
pub mod nvrtc;
mod options;
pub mod params;
pub mod sass;
mod weights;

use std::marker::PhantomData;

use super::charges::f32_bytes;
use super::error::BackendError;
use super::experts::{ExpertsSpec, RouterKind};
use super::interface::{Backend, DeltaRuleGates, Matmul};
use super::shapes::{AttentionShape, DeltaNetShape};
use crate::checkpoint::kv_scales::KvScales;
use crate::checkpoint::linear::{LinearWeight, VectorData, VectorWeight};
use crate::plan::ledger::Category;
use crate::plan::memory::{
    KvLayout, MoeWorkspace as MoeWorkspacePlan, Placement, RecurrentStatePlan, StepMetadataPlan,
};
use crate::plan::profile::KvCacheDtype;
use crate::step::StepBatch;
use backend::u32_of;
use constants::{
    BLOCK_THREADS, FMT_F32, MATMUL_WARPS, MAX_HEAD_DIM, MAX_JOBS, MAX_ROPE_HALF, MMA_M, MMA_TOKENS,
    MMA_WARPS, NORM_THREADS, Q_TILE, ROPE_THREADS, WARP,
};
use kernels::Kernel;
use memory::check;
use params as p;

pub use backend::CudaBackend;
pub use error::CudaError;
pub use handles::{CudaLinear, CudaVector};
pub use memory::{CudaBuffer, CudaKvCache, CudaStep, CudaWorkspace};
pub use moe::CudaExperts;
pub use options::{CudaOptions, MatmulPath, TENSOR_CORE_MIN_ROWS};
pub use weights::WeightsPolicy;
/// The CUDA backend has no Gated DeltaNet kernels yet: no state to hold.
pub struct NoRecurrentState;

fn not_supported(what: &'static str) -> BackendError {
    BackendError::NotSupported {
        backend: "cuda",
        what,
    }
}

/// Refuses a KV cache dtype the kernels cannot read or write: they keep
/// bf16 or f32 keys and values, not FP8 (`--kv-cache-dtype fp8` runs on the
/// CPU backend).
pub fn check_kv_dtype(dtype: KvCacheDtype) -> Result<(), BackendError> {
    match dtype {
        KvCacheDtype::Bf16 | KvCacheDtype::F32 => Ok(()),
        KvCacheDtype::Fp8 => Err(not_supported("--kv-cache-dtype fp8 (an FP8 E4M3 KV cache)")),
    }
}

impl Backend for CudaBackend {
    type Buffer = CudaBuffer;
    type Linear<'w> = CudaLinear<'w>;
    type Vector<'w> = CudaVector<'w>;
    type Experts<'w> = CudaExperts<'w>;
    type Workspace = CudaWorkspace;
    type KvCache = CudaKvCache;
    type Step = CudaStep;
    type RecurrentState = NoRecurrentState;

    fn name(&self) -> &'static str {
        "cuda"
    }

    fn alloc(
        &self,
        category: Category,
        what: &'static str,
        elements: usize,
        placement: Placement,
    ) -> Result<CudaBuffer, BackendError> {
        self.device.bind()?;
        let charge = self.ledger.charge(category, f32_bytes(elements), what)?;
        CudaBuffer::allocate(&self.device, charge, elements, placement)
    }

    fn linear<'w>(&self, w: LinearWeight<'w>) -> Result<CudaLinear<'w>, BackendError> {
        Ok(CudaLinear {
            weight: self.weight(&w)?,
            rows: w.rows,
            cols: w.cols,
            _borrow: PhantomData,
        })
    }

    fn vector<'w>(&self, v: VectorWeight<'w>) -> Result<CudaVector<'w>, BackendError> {
        if v.offset != 0.0 {
            return Err(not_supported(
                "a zero-centred RMSNorm (qwen3_5, qwen3_next)",
            ));
        }
        let (bytes, bf16, size) = match v.data {
            VectorData::Bf16(b) => (b, true, 2),
            VectorData::F32(b) => (b, false, 4),
        };
        check("vector", v.len * size, bytes.len())?;
        Ok(CudaVector {
            ptr: self.weights.translate(bytes)?,
            len: v.len,
            bf16,
            _borrow: PhantomData,
        })
    }

    fn experts<'w>(&self, spec: ExpertsSpec<'w>) -> Result<CudaExperts<'w>, BackendError> {
        self.device.bind()?;
        CudaExperts::new(self, spec)
    }

    fn workspace(&self, plan: &MoeWorkspacePlan) -> Result<CudaWorkspace, BackendError> {
        self.device.bind()?;
        CudaWorkspace::allocate(&self.device, &self.ledger, plan)
    }

    fn kv_cache(
        &self,
        layout: &KvLayout,
        layers: usize,
        _scales: &KvScales,
    ) -> Result<CudaKvCache, BackendError> {
        // Refused before anything is charged or allocated.
        check_kv_dtype(layout.dtype)?;
        self.device.bind()?;
        CudaKvCache::allocate(&self.device, &self.ledger, layout, layers)
    }

    fn step_storage(&self, plan: &StepMetadataPlan) -> Result<CudaStep, BackendError> {
        self.device.bind()?;
        CudaStep::allocate(&self.device, &self.ledger, plan)
    }

    fn recurrent_state(&self, plan: &RecurrentStatePlan) -> Result<NoRecurrentState, BackendError> {
        // Named first: a bf16 pool is a serving key this backend refuses,
        // whatever comes of the state itself.
        if plan.dtype == crate::plan::profile::StateDtype::Bf16 {
            return Err(not_supported("[serving] state_dtype = \"bf16\""));
        }
        Err(not_supported("the Gated DeltaNet recurrent state"))
    }

    fn copy_state_slots(
        &self,
        _state: &mut NoRecurrentState,
        _pairs: &[(u32, u32)],
    ) -> Result<(), BackendError> {
        Err(not_supported("the recurrent-state pool"))
    }

    fn gdn_conv(
        &self,
        _qkv: &mut CudaBuffer,
        _weight: &CudaVector<'_>,
        _state: &mut NoRecurrentState,
        _layer: usize,
        _step: &CudaStep,
        _shape: &DeltaNetShape,
    ) -> Result<(), BackendError> {
        Err(not_supported("the Gated DeltaNet convolution"))
    }

    fn gdn_delta_rule(
        &self,
        _qkv: &mut CudaBuffer,
        _gates: &DeltaRuleGates<'_, '_, Self>,
        _state: &mut NoRecurrentState,
        _layer: usize,
        _step: &CudaStep,
        _shape: &DeltaNetShape,
        _out: &mut CudaBuffer,
    ) -> Result<(), BackendError> {
        Err(not_supported("the gated delta rule"))
    }

    fn gdn_unfuse(
        &self,
        _qkvz: &CudaBuffer,
        _ba: &CudaBuffer,
        _rows: usize,
        _shape: &DeltaNetShape,
        _qkv: &mut CudaBuffer,
        _z: &mut CudaBuffer,
        _b: &mut CudaBuffer,
        _a: &mut CudaBuffer,
    ) -> Result<(), BackendError> {
        Err(not_supported("qwen3_next's fused projections"))
    }

    fn gated_rmsnorm(
        &self,
        _x: &mut CudaBuffer,
        _z: &CudaBuffer,
        _w: &CudaVector<'_>,
        _eps: f32,
        _width: usize,
        _n: usize,
    ) -> Result<(), BackendError> {
        Err(not_supported("the gated RMSNorm"))
    }

    fn split_query_gate(
        &self,
        _query_gate: &CudaBuffer,
        _rows: usize,
        _heads: usize,
        _head_dim: usize,
        _q: &mut CudaBuffer,
        _gate: &mut CudaBuffer,
    ) -> Result<(), BackendError> {
        Err(not_supported("gated attention"))
    }

    fn sigmoid_mul(
        &self,
        _x: &mut CudaBuffer,
        _gate: &CudaBuffer,
        _n: usize,
    ) -> Result<(), BackendError> {
        Err(not_supported("gated attention"))
    }

    fn concat_rows(
        &self,
        _left: &CudaBuffer,
        _right: &CudaBuffer,
        _rows: usize,
        _width: usize,
        _out: &mut CudaBuffer,
    ) -> Result<(), BackendError> {
        Err(not_supported("the MTP head"))
    }

    fn add_gated(
        &self,
        _out: &mut CudaBuffer,
        _x: &CudaBuffer,
        _logits: &CudaBuffer,
        _rows: usize,
        _width: usize,
    ) -> Result<(), BackendError> {
        Err(not_supported("the shared expert"))
    }

    fn load_step(&self, batch: &StepBatch, step: &mut CudaStep) -> Result<(), BackendError> {
        self.device.bind()?;
        step.load(batch, Q_TILE as usize)
    }

    fn embed(
        &self,
        table: &CudaLinear<'_>,
        step: &CudaStep,
        out: &mut CudaBuffer,
    ) -> Result<(), BackendError> {
        self.device.bind()?;
        check("embedding output", step.rows * table.cols, out.len())?;
        if let Some(&bad) = step.tokens.iter().find(|&&t| t as usize >= table.rows) {
            return Err(BackendError::Shape(format!(
                "token {bad} is outside the {}-token embedding table",
                table.rows
            )));
        }
        let params = p::EmbedParams {
            table: table.weight,
            meta: step.meta(),
            out: out.ptr(),
            rows: u32_of("rows", step.rows)?,
            pad: 0,
        };
        self.launch(
            Kernel::Embed,
            (params.rows, 1, 1),
            BLOCK_THREADS,
            0,
            &params,
        )
    }

    fn rmsnorm(
        &self,
        x: &CudaBuffer,
        w: &CudaVector<'_>,
        eps: f32,
        rows: usize,
        width: usize,
        out: &mut CudaBuffer,
    ) -> Result<(), BackendError> {
        self.device.bind()?;
        check("rmsnorm", rows * width, x.len().min(out.len()))?;
        check("rmsnorm weight", width, w.len)?;
        let params = p::NormParams {
            x: x.ptr(),
            delta: 0,
            weight: w.ptr,
            out: out.ptr(),
            weight_bf16: w.bf16.into(),
            width: u32_of("width", width)?,
            eps,
            rows: u32_of("rows", rows)?,
        };
        self.launch(
            Kernel::RmsNorm,
            (params.rows, 1, 1),
            NORM_THREADS,
            0,
            &params,
        )
    }

    fn add_rmsnorm(
        &self,
        residual: &mut CudaBuffer,
        delta: &CudaBuffer,
        w: &CudaVector<'_>,
        eps: f32,
        rows: usize,
        width: usize,
        out: &mut CudaBuffer,
    ) -> Result<(), BackendError> {
        self.device.bind()?;
        check(
            "add_rmsnorm",
            rows * width,
            residual.len().min(delta.len()).min(out.len()),
        )?;
        check("rmsnorm weight", width, w.len)?;
        let params = p::NormParams {
            x: residual.ptr(),
            delta: delta.ptr(),
            weight: w.ptr,
            out: out.ptr(),
            weight_bf16: w.bf16.into(),
            width: u32_of("width", width)?,
            eps,
            rows: u32_of("rows", rows)?,
        };
        self.launch(
            Kernel::RmsNorm,
            (params.rows, 1, 1),
            NORM_THREADS,
            0,
            &params,
        )
    }

    fn matmul(&self, jobs: &mut [Matmul<'_, '_, Self>]) -> Result<(), BackendError> {
        self.device.bind()?;
        for chunk in jobs.chunks(MAX_JOBS) {
            // One launch per chunk, on one kernel: the tensor cores when
            // the chunk's largest job crosses over and no weight is F32.
            let most_rows = chunk.iter().map(|j| j.rows).max().unwrap_or(0);
            let mma_formats = chunk.iter().all(|j| j.w.weight.format != FMT_F32);
            let mma = self.tensor_cores_for(most_rows, mma_formats);
            let features_per_block = if mma { MMA_WARPS * MMA_M } else { MATMUL_WARPS };
            let mut params = p::MatmulParams::default();
            let mut blocks = 0u32;
            for job in chunk {
                let (k, n) = (job.w.cols, job.w.rows);
                if job.rows == 0 {
                    continue;
                }
                check("matmul input", (job.x_row + job.rows) * k, job.x.len())?;
                check("matmul output", job.rows * n, job.out.len())?;
                let (bias, bias_bf16) = match job.bias {
                    Some(b) => {
                        check("matmul bias", n, b.len)?;
                        (b.ptr, u32::from(b.bf16))
                    }
                    None => (0, 0),
                };
                params.jobs[params.count as usize] = p::MatmulJob {
                    w: job.w.weight,
                    x: job.x.at(job.x_row * k),
                    out: job.out.ptr(),
                    bias,
                    bias_bf16,
                    rows: u32_of("rows", job.rows)?,
                    first_block: blocks,
                    pad: 0,
                };
                params.count += 1;
                blocks = blocks
                    .checked_add(u32_of("output features", n)?.div_ceil(features_per_block))
                    .ok_or_else(|| BackendError::Shape("matmul grid too large".to_string()))?;
            }
            if params.count == 0 {
                continue;
            }
            if mma {
                let row_blocks = u32_of("rows", most_rows)?.div_ceil(MMA_TOKENS);
                self.launch(
                    Kernel::MatmulMma,
                    (blocks, row_blocks, 1),
                    MMA_WARPS * WARP,
                    0,
                    &params,
                )?;
            } else {
                self.launch(
                    Kernel::Matmul,
                    (blocks, 1, 1),
                    MATMUL_WARPS * WARP,
                    0,
                    &params,
                )?;
            }
        }
        Ok(())
    }

    fn rope_table(
        &self,
        step: &CudaStep,
        inv_freq: &[f32],
        attention_factor: f32,
        rows: usize,
        out: &mut CudaBuffer,
    ) -> Result<(), BackendError> {
        self.device.bind()?;
        let half = inv_freq.len();
        if half > MAX_ROPE_HALF {
            return Err(BackendError::Shape(format!(
                "head_dim {} exceeds the CUDA backend's {}",
                2 * half,
                2 * MAX_ROPE_HALF
            )));
        }
        check("rope rows", rows, step.rows)?;
        check("rope table", rows * 2 * half, out.len())?;
        let mut params = p::RopeTableParams {
            meta: step.meta(),
            out: out.ptr(),
            max_tokens: u32_of("tokens", step.max_tokens)?,
            max_seqs: u32_of("sequences", step.max_seqs)?,
            num_seqs: u32_of("sequences", step.num_seqs)?,
            rows: u32_of("rows", rows)?,
            half: half as u32,
            attention_factor,
            inv_freq: [0.0; MAX_ROPE_HALF],
        };
        params.inv_freq[..half].copy_from_slice(inv_freq);
        self.launch(
            Kernel::RopeTable,
            (params.rows, 1, 1),
            ROPE_THREADS,
            0,
            &params,
        )
    }

    fn qk_norm_rope(
        &self,
        q: &mut CudaBuffer,
        k: &mut CudaBuffer,
        norms: Option<(&CudaVector<'_>, &CudaVector<'_>, f32)>,
        rope: &CudaBuffer,
        rows: usize,
        shape: &AttentionShape,
    ) -> Result<(), BackendError> {
        self.device.bind()?;
        let hd = shape.head_dim;
        if hd > MAX_HEAD_DIM || !hd.is_multiple_of(2) {
            return Err(BackendError::Shape(format!("unsupported head_dim {hd}")));
        }
        if shape.rotary_dim != hd {
            return Err(not_supported("partial RoPE"));
        }
        check("q", rows * shape.heads * hd, q.len())?;
        check("k", rows * shape.kv_heads * hd, k.len())?;
        check("rope table", rows * hd, rope.len())?;
        let (q_norm, k_norm, eps) = match norms {
            Some((qn, kn, eps)) => {
                check("q norm", hd, qn.len)?;
                check("k norm", hd, kn.len)?;
                (Some(qn), Some(kn), eps)
            }
            None => (None, None, 0.0),
        };
        let params = p::QkRopeParams {
            q: q.ptr(),
            k: k.ptr(),
            q_norm: q_norm.map_or(0, |v| v.ptr),
            k_norm: k_norm.map_or(0, |v| v.ptr),
            rope: rope.ptr(),
            q_norm_bf16: q_norm.is_some_and(|v| v.bf16).into(),
            k_norm_bf16: k_norm.is_some_and(|v| v.bf16).into(),
            rows: u32_of("rows", rows)?,
            heads: u32_of("heads", shape.heads)?,
            kv_heads: u32_of("kv heads", shape.kv_heads)?,
            head_dim: hd as u32,
            eps,
            pad: 0,
        };
        let grid = (params.rows, params.heads + params.kv_heads, 1);
        self.launch(Kernel::QkNormRope, grid, WARP, 0, &params)
    }

    fn attention(
        &self,
        q: &CudaBuffer,
        k: &mut CudaBuffer,
        v: &mut CudaBuffer,
        kv: &CudaKvCache,
        layer: usize,
        step: &CudaStep,
        shape: &AttentionShape,
        sinks: Option<&CudaVector<'_>>,
        ws: &mut CudaWorkspace,
        out: &mut CudaBuffer,
    ) -> Result<(), BackendError> {
        self.device.bind()?;
        self.run_attention(q, k, v, kv, layer, step, shape, sinks, ws, out)
    }

    fn kv_append(
        &self,
        k: &CudaBuffer,
        v: &CudaBuffer,
        kv: &mut CudaKvCache,
        layer: usize,
        step: &CudaStep,
    ) -> Result<(), BackendError> {
        self.device.bind()?;
        self.run_kv_append(k, v, kv, layer, step)
    }

    fn kv_copy_blocks(
        &self,
        kv: &mut CudaKvCache,
        pairs: &[(u32, u32)],
    ) -> Result<(), BackendError> {
        self.device.bind()?;
        self.run_kv_copy_blocks(kv, pairs)
    }

    fn route(
        &self,
        logits: &CudaBuffer,
        rows: usize,
        num_experts: usize,
        top_k: usize,
        kind: RouterKind,
        ws: &mut CudaWorkspace,
    ) -> Result<(), BackendError> {
        self.device.bind()?;
        self.run_route(logits, rows, num_experts, top_k, kind, ws)
    }

    fn moe(
        &self,
        x: &CudaBuffer,
        rows: usize,
        experts: &CudaExperts<'_>,
        ws: &mut CudaWorkspace,
        out: &mut CudaBuffer,
    ) -> Result<(), BackendError> {
        self.device.bind()?;
        self.run_experts(x, rows, experts, ws, out)
    }

    fn silu_mul(
        &self,
        gate: &mut CudaBuffer,
        up: &CudaBuffer,
        n: usize,
    ) -> Result<(), BackendError> {
        self.pair_op(Kernel::SiluMul, "silu_mul", gate, up, n)
    }

    fn add(
        &self,
        residual: &mut CudaBuffer,
        delta: &CudaBuffer,
        n: usize,
    ) -> Result<(), BackendError> {
        self.pair_op(Kernel::Add, "add", residual, delta, n)
    }

    fn compact_rows(
        &self,
        buf: &mut CudaBuffer,
        step: &CudaStep,
        width: usize,
    ) -> Result<(), BackendError> {
        self.device.bind()?;
        if let Some(&last) = step.logit_rows.last() {
            check("logit row", (last as usize + 1) * width, buf.len())?;
        }
        let moves = step
            .logit_rows
            .iter()
            .enumerate()
            .any(|(i, &r)| r as usize != i);
        if !moves {
            return Ok(());
        }
        let params = p::CompactParams {
            buf: buf.ptr(),
            meta: step.meta(),
            max_tokens: u32_of("tokens", step.max_tokens)?,
            count: u32_of("logit rows", step.logit_rows.len())?,
            width: u32_of("width", width)?,
            pad: 0,
        };
        self.launch(Kernel::CompactRows, (1, 1, 1), BLOCK_THREADS, 0, &params)
    }

    fn read(
        &self,
        buf: &CudaBuffer,
        n: usize,
        f: &mut dyn FnMut(&[f32]),
    ) -> Result<(), BackendError> {
        self.device.bind()?;
        buf.read(n, f)
    }

    fn launches(&self) -> Option<u64> {
        Some(self.kernels.total_launches())
    }

    fn buffer_memory(&self) -> crate::backend::BufferMemory {
        if self.info().integrated {
            crate::backend::BufferMemory::IntegratedGpu
        } else {
            crate::backend::BufferMemory::DiscreteGpu
        }
    }
}
