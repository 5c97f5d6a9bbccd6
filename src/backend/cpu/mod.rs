//! The CPU backend: f32 activations, weights read in place from the mapped
//! checkpoint and decoded inside the SIMD matmul kernels, rayon threads.
//! It is the reference the CUDA backend is checked against.

mod attention;
mod delta_net;
pub mod kernels;
mod kv;
mod moe;
mod ops;

use std::sync::{Arc, Mutex};

use rayon::prelude::*;

use super::charges::f32_bytes;
use super::error::BackendError;
use super::experts::{ExpertsSpec, RouterKind};
use super::interface::{Backend, DeltaRuleGates, Matmul};
use super::shapes::{AttentionShape, DeltaNetShape};
use crate::checkpoint::kv_scales::KvScales;
use crate::checkpoint::linear::{LinearWeight, VectorWeight};
use crate::plan::ledger::{Category, Charge, Ledger};
use crate::plan::memory::{
    KvLayout, MoeWorkspace as MoeWorkspacePlan, Placement, RecurrentStatePlan, STEP_METADATA,
    StepMetadataPlan,
};
use crate::step::StepBatch;

pub use delta_net::CpuRecurrentState;
pub use kv::CpuKvCache;
pub use moe::{CpuExperts, CpuWorkspace};
use moe::{SharedScratch, lock_scratch};

/// An f32 buffer and the ledger charge that pays for it.
pub struct CpuBuffer {
    data: Vec<f32>,
    _charge: Charge,
}

impl CpuBuffer {
    pub fn as_slice(&self) -> &[f32] {
        &self.data
    }

    /// Writable values (tests fill inputs with it).
    pub fn as_mut_slice(&mut self) -> &mut [f32] {
        &mut self.data
    }
}

/// The step's metadata, host-side (the CPU reads it where it is).
pub struct CpuStep {
    batch: StepBatch,
    _charge: Charge,
}

pub struct CpuBackend {
    ledger: Arc<Ledger>,
    /// The workspace's quantized-activation scratch, once one exists: the
    /// planned room where NVFP4 linears outside the experts quantize their
    /// inputs. Before that (kernels driven directly, in tests) they use
    /// the calling thread's own scratch.
    quantized: Mutex<Option<SharedScratch>>,
}

impl CpuBackend {
    /// A backend charging its allocations to `ledger`. Threads are rayon's
    /// global pool (sized by the CLI's `--threads`).
    pub fn new(ledger: Arc<Ledger>) -> CpuBackend {
        CpuBackend {
            ledger,
            quantized: Mutex::new(None),
        }
    }

    /// The planned scratch matmuls quantize into, if a workspace exists.
    fn quantized_scratch(&self) -> Option<SharedScratch> {
        match self.quantized.lock() {
            Ok(slot) => slot.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    pub fn ledger(&self) -> &Arc<Ledger> {
        &self.ledger
    }

    fn charge(&self, category: Category, bytes: u64, what: &str) -> Result<Charge, BackendError> {
        Ok(self.ledger.charge(category, bytes, what)?)
    }
}

fn shape_error(message: String) -> BackendError {
    BackendError::Shape(message)
}

fn check_len(what: &'static str, needed: usize, capacity: usize) -> Result<(), BackendError> {
    BackendError::check_capacity(what, needed, capacity)
}

impl Backend for CpuBackend {
    const COMPUTES_ON_HOST_POOL: bool = true;

    type Buffer = CpuBuffer;
    type Linear<'w> = LinearWeight<'w>;
    type Vector<'w> = VectorWeight<'w>;
    type Experts<'w> = CpuExperts<'w>;
    type Workspace = CpuWorkspace;
    type KvCache = CpuKvCache;
    type Step = CpuStep;
    type RecurrentState = CpuRecurrentState;

    fn name(&self) -> &'static str {
        "cpu"
    }

    fn alloc(
        &self,
        category: Category,
        what: &'static str,
        elements: usize,
        // One memory: host and kernels read the same buffer.
        _placement: Placement,
    ) -> Result<CpuBuffer, BackendError> {
        let charge = self.charge(category, f32_bytes(elements), what)?;
        Ok(CpuBuffer {
            data: vec![0.0; elements],
            _charge: charge,
        })
    }

    fn linear<'w>(&self, w: LinearWeight<'w>) -> Result<LinearWeight<'w>, BackendError> {
        kernels::weights::check_weight(&w).map_err(|e| BackendError::Kernel(e.to_string()))?;
        Ok(w)
    }

    fn vector<'w>(&self, v: VectorWeight<'w>) -> Result<VectorWeight<'w>, BackendError> {
        Ok(v)
    }

    fn experts<'w>(&self, spec: ExpertsSpec<'w>) -> Result<CpuExperts<'w>, BackendError> {
        CpuExperts::new(spec)
    }

    fn workspace(&self, plan: &MoeWorkspacePlan) -> Result<CpuWorkspace, BackendError> {
        let workspace = CpuWorkspace::allocate(plan, &self.ledger)?;
        let scratch = workspace.quantized_scratch();
        match self.quantized.lock() {
            Ok(mut slot) => *slot = Some(scratch),
            Err(poisoned) => *poisoned.into_inner() = Some(scratch),
        }
        Ok(workspace)
    }

    fn kv_cache(
        &self,
        layout: &KvLayout,
        layers: usize,
        scales: &KvScales,
    ) -> Result<CpuKvCache, BackendError> {
        CpuKvCache::allocate(layout, layers, scales, &self.ledger)
    }

    fn step_storage(&self, plan: &StepMetadataPlan) -> Result<CpuStep, BackendError> {
        // The host batch is the metadata: charge what the plan sizes it at.
        Ok(CpuStep {
            batch: StepBatch::with_capacity(
                plan.max_tokens,
                plan.max_seqs,
                plan.max_blocks_per_seq,
            ),
            _charge: self.charge(Category::Activations, plan.bytes, STEP_METADATA)?,
        })
    }

    fn recurrent_state(
        &self,
        plan: &RecurrentStatePlan,
    ) -> Result<CpuRecurrentState, BackendError> {
        CpuRecurrentState::allocate(plan, &self.ledger)
    }

    fn load_step(&self, batch: &StepBatch, step: &mut CpuStep) -> Result<(), BackendError> {
        step.batch.clone_from(batch);
        Ok(())
    }

    fn embed(
        &self,
        table: &LinearWeight<'_>,
        step: &CpuStep,
        out: &mut CpuBuffer,
    ) -> Result<(), BackendError> {
        let (vocab, width) = (table.rows, table.cols);
        let tokens = &step.batch.tokens;
        check_len("embedding output", tokens.len() * width, out.data.len())?;
        if let Some(&bad) = tokens.iter().find(|&&t| t as usize >= vocab) {
            return Err(shape_error(format!(
                "token {bad} is outside the {vocab}-token embedding table"
            )));
        }
        out.data[..tokens.len() * width]
            .par_chunks_mut(width)
            .zip(tokens.par_iter())
            .try_for_each(|(row, &token)| table.decode_row(token as usize, row))
            .map_err(|e| BackendError::Kernel(e.to_string()))
    }

    fn rmsnorm(
        &self,
        x: &CpuBuffer,
        w: &VectorWeight<'_>,
        eps: f32,
        rows: usize,
        width: usize,
        out: &mut CpuBuffer,
    ) -> Result<(), BackendError> {
        check_len("rmsnorm", rows * width, x.data.len().min(out.data.len()))?;
        out.data[..rows * width]
            .par_chunks_mut(width)
            .zip(x.data[..rows * width].par_chunks(width))
            .for_each(|(o, x)| ops::rmsnorm(x, w, eps, o));
        Ok(())
    }

    fn add_rmsnorm(
        &self,
        residual: &mut CpuBuffer,
        delta: &CpuBuffer,
        w: &VectorWeight<'_>,
        eps: f32,
        rows: usize,
        width: usize,
        out: &mut CpuBuffer,
    ) -> Result<(), BackendError> {
        let n = rows * width;
        check_len(
            "add_rmsnorm",
            n,
            residual
                .data
                .len()
                .min(delta.data.len())
                .min(out.data.len()),
        )?;
        residual.data[..n]
            .par_chunks_mut(width)
            .zip(delta.data[..n].par_chunks(width))
            .zip(out.data[..n].par_chunks_mut(width))
            .for_each(|((r, d), o)| ops::add_rmsnorm(r, d, w, eps, o));
        Ok(())
    }

    fn matmul(&self, jobs: &mut [Matmul<'_, '_, Self>]) -> Result<(), BackendError> {
        let mut problems = Vec::with_capacity(jobs.len());
        for job in jobs.iter_mut() {
            let (k, n) = (job.w.cols, job.w.rows);
            let start = job.x_row * k;
            let end = start + job.rows * k;
            check_len("matmul input", end, job.x.data.len())?;
            check_len("matmul output", job.rows * n, job.out.data.len())?;
            problems.push(kernels::GroupedProblem {
                x: &job.x.data[start..end],
                tokens: job.rows,
                weight: *job.w,
                out: &mut job.out.data[..job.rows * n],
            });
        }
        match self.quantized_scratch() {
            Some(scratch) => {
                kernels::matmul_grouped_in(&mut problems, &mut *lock_scratch(&scratch)?)
            }
            None => kernels::matmul_grouped(&mut problems),
        }
        .map_err(|e| BackendError::Kernel(e.to_string()))?;
        drop(problems);
        for job in jobs.iter_mut() {
            if let Some(bias) = job.bias {
                let n = job.w.rows;
                ops::add_bias(&mut job.out.data[..job.rows * n], bias);
            }
        }
        Ok(())
    }

    fn rope_table(
        &self,
        step: &CpuStep,
        inv_freq: &[f32],
        attention_factor: f32,
        rows: usize,
        out: &mut CpuBuffer,
    ) -> Result<(), BackendError> {
        let half = inv_freq.len();
        let width = 2 * half;
        check_len("rope table", rows * width, out.data.len())?;
        let positions = &step.batch.positions[..rows];
        out.data[..rows * width]
            .par_chunks_mut(width)
            .zip(positions.par_iter())
            .for_each(|(row, &pos)| {
                let (cos, sin) = row.split_at_mut(half);
                for j in 0..half {
                    // f32 angle, as transformers computes it.
                    let angle = f64::from(pos as f32 * inv_freq[j]);
                    cos[j] = angle.cos() as f32 * attention_factor;
                    sin[j] = angle.sin() as f32 * attention_factor;
                }
            });
        Ok(())
    }

    fn qk_norm_rope(
        &self,
        q: &mut CpuBuffer,
        k: &mut CpuBuffer,
        norms: Option<(&VectorWeight<'_>, &VectorWeight<'_>, f32)>,
        rope: &CpuBuffer,
        rows: usize,
        shape: &AttentionShape,
    ) -> Result<(), BackendError> {
        let hd = shape.head_dim;
        // The table rotates the first `rotary_dim` dims of each head.
        let rd = shape.rotary_dim;
        if rd == 0 || rd > hd || !rd.is_multiple_of(2) {
            return Err(shape_error(format!("{rd} rotary dims of a {hd}-wide head")));
        }
        let qw = shape.heads * hd;
        let kw = shape.kv_heads * hd;
        check_len("q", rows * qw, q.data.len())?;
        check_len("k", rows * kw, k.data.len())?;
        check_len("rope table", rows * rd, rope.data.len())?;
        let table = &rope.data[..rows * rd];
        let apply = |data: &mut [f32], width: usize, norm: Option<(&VectorWeight<'_>, f32)>| {
            data[..rows * width]
                .par_chunks_mut(width)
                .zip(table.par_chunks(rd))
                .for_each(|(row, cos_sin)| {
                    let (cos, sin) = cos_sin.split_at(rd / 2);
                    for head in row.chunks_mut(hd) {
                        if let Some((w, eps)) = norm {
                            ops::rmsnorm_in_place(head, w, eps);
                        }
                        ops::rotate_half(&mut head[..rd], cos, sin);
                    }
                });
        };
        apply(&mut q.data, qw, norms.map(|(qn, _, eps)| (qn, eps)));
        apply(&mut k.data, kw, norms.map(|(_, kn, eps)| (kn, eps)));
        Ok(())
    }

    fn attention(
        &self,
        q: &CpuBuffer,
        k: &mut CpuBuffer,
        v: &mut CpuBuffer,
        kv: &CpuKvCache,
        layer: usize,
        step: &CpuStep,
        shape: &AttentionShape,
        sinks: Option<&VectorWeight<'_>>,
        _ws: &mut CpuWorkspace,
        out: &mut CpuBuffer,
    ) -> Result<(), BackendError> {
        attention::attention(
            &q.data,
            &mut k.data,
            &mut v.data,
            kv,
            layer,
            &step.batch,
            shape,
            sinks,
            &mut out.data,
        )
    }

    fn kv_append(
        &self,
        k: &CpuBuffer,
        v: &CpuBuffer,
        kv: &mut CpuKvCache,
        layer: usize,
        step: &CpuStep,
    ) -> Result<(), BackendError> {
        kv.append(layer, &k.data, &v.data, &step.batch)
    }

    fn kv_copy_blocks(
        &self,
        kv: &mut CpuKvCache,
        pairs: &[(u32, u32)],
    ) -> Result<(), BackendError> {
        kv.copy_blocks(pairs)
    }

    fn copy_state_slots(
        &self,
        state: &mut CpuRecurrentState,
        pairs: &[(u32, u32)],
    ) -> Result<(), BackendError> {
        state.copy_slots(pairs)
    }

    fn route(
        &self,
        logits: &CpuBuffer,
        rows: usize,
        num_experts: usize,
        top_k: usize,
        kind: RouterKind,
        ws: &mut CpuWorkspace,
    ) -> Result<(), BackendError> {
        ws.route(&logits.data, rows, num_experts, top_k, kind)
    }

    fn moe(
        &self,
        x: &CpuBuffer,
        rows: usize,
        experts: &CpuExperts<'_>,
        ws: &mut CpuWorkspace,
        out: &mut CpuBuffer,
    ) -> Result<(), BackendError> {
        ws.run_experts(&x.data, rows, experts, &mut out.data)
    }

    fn gdn_conv(
        &self,
        qkv: &mut CpuBuffer,
        weight: &VectorWeight<'_>,
        state: &mut CpuRecurrentState,
        layer: usize,
        step: &CpuStep,
        shape: &DeltaNetShape,
    ) -> Result<(), BackendError> {
        delta_net::conv(&mut qkv.data, weight, state, layer, &step.batch, shape)
    }

    fn gdn_delta_rule(
        &self,
        qkv: &mut CpuBuffer,
        gates: &DeltaRuleGates<'_, '_, Self>,
        state: &mut CpuRecurrentState,
        layer: usize,
        step: &CpuStep,
        shape: &DeltaNetShape,
        out: &mut CpuBuffer,
    ) -> Result<(), BackendError> {
        delta_net::delta_rule(
            &mut qkv.data,
            &gates.b.data,
            &gates.a.data,
            gates.a_log,
            gates.dt_bias,
            state,
            layer,
            &step.batch,
            shape,
            &mut out.data,
        )
    }

    fn gdn_unfuse(
        &self,
        qkvz: &CpuBuffer,
        ba: &CpuBuffer,
        rows: usize,
        shape: &DeltaNetShape,
        qkv: &mut CpuBuffer,
        z: &mut CpuBuffer,
        b: &mut CpuBuffer,
        a: &mut CpuBuffer,
    ) -> Result<(), BackendError> {
        delta_net::unfuse(
            &qkvz.data,
            &ba.data,
            rows,
            shape,
            &mut qkv.data,
            &mut z.data,
            &mut b.data,
            &mut a.data,
        )
    }

    fn gated_rmsnorm(
        &self,
        x: &mut CpuBuffer,
        z: &CpuBuffer,
        w: &VectorWeight<'_>,
        eps: f32,
        width: usize,
        n: usize,
    ) -> Result<(), BackendError> {
        check_len("gated rmsnorm", n, x.data.len().min(z.data.len()))?;
        if width == 0 || w.len != width || !n.is_multiple_of(width) {
            return Err(shape_error(format!(
                "a gated RMSNorm of {} weights over groups of {width}",
                w.len
            )));
        }
        x.data[..n]
            .par_chunks_mut(width)
            .zip(z.data[..n].par_chunks(width))
            .for_each(|(x, z)| ops::gated_rmsnorm(x, z, w, eps));
        Ok(())
    }

    fn split_query_gate(
        &self,
        query_gate: &CpuBuffer,
        rows: usize,
        heads: usize,
        head_dim: usize,
        q: &mut CpuBuffer,
        gate: &mut CpuBuffer,
    ) -> Result<(), BackendError> {
        let width = heads * head_dim;
        check_len("q_proj output", rows * 2 * width, query_gate.data.len())?;
        check_len("q", rows * width, q.data.len().min(gate.data.len()))?;
        let pairs = query_gate.data[..rows * 2 * width].chunks_exact(2 * head_dim);
        let outs = q.data[..rows * width]
            .chunks_exact_mut(head_dim)
            .zip(gate.data[..rows * width].chunks_exact_mut(head_dim));
        for (pair, (q, g)) in pairs.zip(outs) {
            let (query, gate) = pair.split_at(head_dim);
            q.copy_from_slice(query);
            g.copy_from_slice(gate);
        }
        Ok(())
    }

    fn sigmoid_mul(
        &self,
        x: &mut CpuBuffer,
        gate: &CpuBuffer,
        n: usize,
    ) -> Result<(), BackendError> {
        check_len("sigmoid_mul", n, x.data.len().min(gate.data.len()))?;
        x.data[..n]
            .par_chunks_mut(4096)
            .zip(gate.data[..n].par_chunks(4096))
            .for_each(|(x, g)| {
                for (x, &g) in x.iter_mut().zip(g) {
                    *x *= ops::sigmoid(g);
                }
            });
        Ok(())
    }

    fn add_gated(
        &self,
        out: &mut CpuBuffer,
        x: &CpuBuffer,
        logits: &CpuBuffer,
        rows: usize,
        width: usize,
    ) -> Result<(), BackendError> {
        let n = rows * width;
        check_len("add_gated", n, out.data.len().min(x.data.len()))?;
        check_len("gate logits", rows, logits.data.len())?;
        out.data[..n]
            .par_chunks_mut(width)
            .zip(x.data[..n].par_chunks(width))
            .zip(logits.data[..rows].par_iter())
            .for_each(|((o, x), &logit)| {
                let gate = ops::sigmoid(logit);
                for (o, &x) in o.iter_mut().zip(x) {
                    *o += gate * x;
                }
            });
        Ok(())
    }

    fn silu_mul(&self, gate: &mut CpuBuffer, up: &CpuBuffer, n: usize) -> Result<(), BackendError> {
        check_len("silu_mul", n, gate.data.len().min(up.data.len()))?;
        gate.data[..n]
            .par_chunks_mut(4096)
            .zip(up.data[..n].par_chunks(4096))
            .for_each(|(g, u)| ops::silu_mul(g, u));
        Ok(())
    }

    fn add(
        &self,
        residual: &mut CpuBuffer,
        delta: &CpuBuffer,
        n: usize,
    ) -> Result<(), BackendError> {
        check_len("add", n, residual.data.len().min(delta.data.len()))?;
        for (r, d) in residual.data[..n].iter_mut().zip(&delta.data[..n]) {
            *r += d;
        }
        Ok(())
    }

    fn concat_rows(
        &self,
        left: &CpuBuffer,
        right: &CpuBuffer,
        rows: usize,
        width: usize,
        out: &mut CpuBuffer,
    ) -> Result<(), BackendError> {
        let n = rows * width;
        check_len(
            "concat_rows input",
            n,
            left.data.len().min(right.data.len()),
        )?;
        check_len("concat_rows output", 2 * n, out.data.len())?;
        out.data[..2 * n]
            .par_chunks_mut(2 * width)
            .zip(left.data[..n].par_chunks(width))
            .zip(right.data[..n].par_chunks(width))
            .for_each(|((o, l), r)| {
                o[..width].copy_from_slice(l);
                o[width..].copy_from_slice(r);
            });
        Ok(())
    }

    fn compact_rows(
        &self,
        buf: &mut CpuBuffer,
        step: &CpuStep,
        width: usize,
    ) -> Result<(), BackendError> {
        for (i, &row) in step.batch.logit_rows.iter().enumerate() {
            let row = row as usize;
            if row < i {
                return Err(shape_error("logit rows must ascend".to_string()));
            }
            check_len("logit row", (row + 1) * width, buf.data.len())?;
            if row != i {
                buf.data
                    .copy_within(row * width..(row + 1) * width, i * width);
            }
        }
        Ok(())
    }

    fn read(
        &self,
        buf: &CpuBuffer,
        n: usize,
        f: &mut dyn FnMut(&[f32]),
    ) -> Result<(), BackendError> {
        check_len("read", n, buf.data.len())?;
        f(&buf.data[..n]);
        Ok(())
    }
}
