//! Host side of the routed experts: one table of expert weights per layer
//! in device memory (charged to the runtime overhead), and the launches of
//! route + grouping, gate/up + activation, down, and the weighted sum.

use std::marker::PhantomData;

use super::backend::{CudaBackend, u32_of};
use super::constants::{
    BLOCK_THREADS, EXPERT_MMA_WARPS, EXPERT_WARPS, FMT_F32, MAX_EXPERTS, MAX_TOP_K, MMA_M,
    ROUTE_WARPS, ROUTER_SOFTMAX_TOPK, ROUTER_SOFTMAX_TOPK_RENORM, ROUTER_TOPK_SOFTMAX, WARP,
};
use super::driver::DeviceMemory;
use super::kernels::Kernel;
use super::memory::check;
use super::memory::{CudaBuffer, CudaWorkspace};
use super::params as p;
use crate::backend::error::BackendError;
use crate::backend::experts::{ExpertActivation, ExpertsSpec, GateUp, RouterKind};
use crate::checkpoint::linear::{LinearWeight, VectorData, VectorWeight};
use crate::plan::ledger::{Category, Charge};
use crate::plan::memory::EXPERT_TABLES;

/// One MoE layer's experts: their weights stay where the checkpoint put
/// them; the table of their device addresses is uploaded once.
#[derive(Debug)]
pub struct CudaExperts<'w> {
    table: DeviceMemory,
    num_experts: usize,
    hidden: usize,
    inter: usize,
    interleaved: bool,
    bias_bf16: bool,
    limit: f32,
    alpha: f32,
    /// No expert weight is F32 (the tensor-core kernels take the others).
    mma_formats: bool,
    _charge: Charge,
    _borrow: PhantomData<&'w [u8]>,
}

impl<'w> CudaExperts<'w> {
    pub(super) fn new(
        b: &CudaBackend,
        spec: ExpertsSpec<'w>,
    ) -> Result<CudaExperts<'w>, BackendError> {
        let (h, i, e) = (spec.hidden_size, spec.intermediate_size, spec.num_experts());
        if e == 0 || e > MAX_EXPERTS {
            return Err(BackendError::Shape(format!(
                "{e} experts (the CUDA backend routes up to {})",
                MAX_EXPERTS
            )));
        }
        let shape = |w: &LinearWeight<'_>, rows: usize, cols: usize, what: &str| {
            if w.rows != rows || w.cols != cols {
                return Err(BackendError::Shape(format!(
                    "{what} is [{}, {}], expected [{rows}, {cols}]",
                    w.rows, w.cols
                )));
            }
            b.weight(w)
        };
        let mut bias_bf16: Option<bool> = None;
        let mut vector =
            |v: &VectorWeight<'_>, len: usize, what: &'static str| -> Result<u64, BackendError> {
                if v.len != len {
                    return Err(BackendError::Shape(format!(
                        "{what} has {} values, expected {len}",
                        v.len
                    )));
                }
                let (bytes, bf16) = match v.data {
                    VectorData::Bf16(bytes) => (bytes, true),
                    VectorData::F32(bytes) => (bytes, false),
                };
                if *bias_bf16.get_or_insert(bf16) != bf16 {
                    return Err(BackendError::Shape(
                        "expert biases mix bf16 and f32".to_string(),
                    ));
                }
                check(what, len * if bf16 { 2 } else { 4 }, bytes.len())?;
                b.weights.translate(bytes)
            };
        let mut table = vec![p::ExpertWeights::default(); e];
        let interleaved = match &spec.gate_up {
            GateUp::Split { gate, up } => {
                if gate.len() != e || up.len() != e {
                    return Err(BackendError::Shape(format!(
                        "{e} experts but {} gate / {} up",
                        gate.len(),
                        up.len()
                    )));
                }
                for (entry, (g, u)) in table.iter_mut().zip(gate.iter().zip(up)) {
                    entry.gate = shape(g, i, h, "expert gate")?;
                    entry.up = shape(u, i, h, "expert up")?;
                }
                false
            }
            GateUp::Interleaved { gate_up, bias } => {
                if gate_up.len() != e || bias.len() != e {
                    return Err(BackendError::Shape(format!(
                        "{e} experts but {} gate_up",
                        gate_up.len()
                    )));
                }
                for (entry, (w, bias)) in table.iter_mut().zip(gate_up.iter().zip(bias)) {
                    entry.gate = shape(w, 2 * i, h, "expert gate_up")?;
                    entry.gate_up_bias = vector(bias, 2 * i, "expert gate_up bias")?;
                }
                true
            }
        };
        if spec.down.len() != e {
            return Err(BackendError::Shape(format!(
                "{e} experts but {} down",
                spec.down.len()
            )));
        }
        for (entry, w) in table.iter_mut().zip(&spec.down) {
            entry.down = shape(w, h, i, "expert down")?;
        }
        if !spec.down_bias.is_empty() {
            if spec.down_bias.len() != e {
                return Err(BackendError::Shape(format!(
                    "expert down bias must be {e} × {h}"
                )));
            }
            for (entry, bias) in table.iter_mut().zip(&spec.down_bias) {
                entry.down_bias = vector(bias, h, "expert down bias")?;
            }
        }
        // As on the CPU: interleaved experts take the clamped SwiGLU (a plain
        // one without limit when configured as SiluMul); split ones silu·mul.
        let (limit, alpha) = match spec.activation {
            ExpertActivation::ClampedSwiglu { limit, alpha } => (limit, alpha),
            ExpertActivation::SiluMul => (f32::INFINITY, 1.0),
        };
        let mma_formats = table.iter().all(|entry| {
            let down = entry.down.format != FMT_F32;
            let gate = entry.gate.format != FMT_F32;
            down && gate && (interleaved || entry.up.format != FMT_F32)
        });
        let bytes = std::mem::size_of_val(table.as_slice());
        let charge = b
            .ledger
            .charge(Category::RuntimeOverhead, bytes as u64, EXPERT_TABLES)?;
        let memory = DeviceMemory::uninit(&b.device, bytes)?;
        memory.upload(&table)?;
        Ok(CudaExperts {
            table: memory,
            num_experts: e,
            hidden: h,
            inter: i,
            interleaved,
            bias_bf16: bias_bf16.unwrap_or(true),
            limit,
            alpha,
            mma_formats,
            _charge: charge,
            _borrow: PhantomData,
        })
    }
}

impl CudaBackend {
    pub(super) fn run_route(
        &self,
        logits: &CudaBuffer,
        rows: usize,
        num_experts: usize,
        top_k: usize,
        kind: RouterKind,
        ws: &mut CudaWorkspace,
    ) -> Result<(), BackendError> {
        check("router logits", rows * num_experts, logits.len())?;
        check(
            "routed rows",
            rows * top_k,
            ws.topk_ids.elements.min(ws.topk_weights.elements),
        )?;
        check("sorted rows", rows * top_k, ws.sorted_rows.elements)?;
        if ws.expert_offsets.elements < num_experts + 1
            || top_k == 0
            || top_k > num_experts
            || top_k > MAX_TOP_K
            || num_experts > MAX_EXPERTS
        {
            return Err(BackendError::Shape(format!(
                "top-{top_k} of {num_experts} experts does not fit the workspace"
            )));
        }
        ws.routed = 0;
        if rows == 0 {
            return Ok(());
        }
        let params = p::RouteParams {
            logits: logits.ptr(),
            topk_ids: ws.topk_ids.ptr(),
            topk_weights: ws.topk_weights.ptr(),
            offsets: ws.expert_offsets.ptr(),
            sorted_rows: ws.sorted_rows.ptr(),
            counter: ws.counter(),
            rows: u32_of("rows", rows)?,
            num_experts: num_experts as u32,
            top_k: top_k as u32,
            kind: match kind {
                RouterKind::SoftmaxTopK { renormalize: false } => ROUTER_SOFTMAX_TOPK,
                RouterKind::SoftmaxTopK { renormalize: true } => ROUTER_SOFTMAX_TOPK_RENORM,
                RouterKind::TopKSoftmax => ROUTER_TOPK_SOFTMAX,
            },
        };
        let blocks = params.rows.div_ceil(ROUTE_WARPS);
        self.launch(
            Kernel::RouteGroup,
            (blocks, 1, 1),
            ROUTE_WARPS * WARP,
            0,
            &params,
        )?;
        ws.routed = rows * top_k;
        ws.top_k = top_k;
        ws.experts = num_experts;
        Ok(())
    }

    pub(super) fn run_experts(
        &self,
        x: &CudaBuffer,
        rows: usize,
        experts: &CudaExperts<'_>,
        ws: &mut CudaWorkspace,
        out: &mut CudaBuffer,
    ) -> Result<(), BackendError> {
        let (h, i, k) = (experts.hidden, experts.inter, ws.top_k);
        let n = rows * k;
        if n != ws.routed {
            return Err(BackendError::Shape(format!(
                "{rows} rows but {} were routed",
                ws.routed
            )));
        }
        if ws.experts != experts.num_experts {
            return Err(BackendError::Shape(format!(
                "routed over {} experts, the layer has {}",
                ws.experts, experts.num_experts
            )));
        }
        if rows == 0 {
            return Ok(());
        }
        check("moe input", rows * h, x.len())?;
        check("moe output", rows * h, out.len())?;
        check("expert activation", n * i, ws.activation.elements)?;
        check("down output", n * h, ws.down_output.elements)?;
        check(
            "expert offsets",
            experts.num_experts + 1,
            ws.expert_offsets.elements,
        )?;
        let gate_up = p::GateUpParams {
            experts: experts.table.ptr(),
            x: x.ptr(),
            sorted_rows: ws.sorted_rows.ptr(),
            offsets: ws.expert_offsets.ptr(),
            act: ws.activation.ptr(),
            num_experts: experts.num_experts as u32,
            top_k: k as u32,
            hidden: u32_of("hidden", h)?,
            inter: u32_of("intermediate", i)?,
            interleaved: experts.interleaved.into(),
            bias_bf16: experts.bias_bf16.into(),
            limit: experts.limit,
            alpha: experts.alpha,
        };
        // The crossover on the step's tokens (see TENSOR_CORE_MIN_ROWS): one
        // launch per projection either way.
        let mma = self.tensor_cores_for(rows, experts.mma_formats);
        let experts_count = gate_up.num_experts;
        if mma {
            let blocks = gate_up.inter.div_ceil(EXPERT_MMA_WARPS * MMA_M);
            self.launch(
                Kernel::ExpertGateUpMma,
                (blocks, experts_count, 1),
                EXPERT_MMA_WARPS * WARP,
                0,
                &gate_up,
            )?;
        } else {
            let blocks = gate_up.inter.div_ceil(EXPERT_WARPS);
            self.launch(
                Kernel::ExpertGateUp,
                (blocks, 1, 1),
                EXPERT_WARPS * WARP,
                0,
                &gate_up,
            )?;
        }
        let down = p::DownParams {
            experts: experts.table.ptr(),
            act: ws.activation.ptr(),
            offsets: ws.expert_offsets.ptr(),
            down_out: ws.down_output.ptr(),
            num_experts: experts.num_experts as u32,
            hidden: gate_up.hidden,
            inter: gate_up.inter,
            bias_bf16: experts.bias_bf16.into(),
        };
        if mma {
            let blocks = down.hidden.div_ceil(EXPERT_MMA_WARPS * MMA_M);
            self.launch(
                Kernel::ExpertDownMma,
                (blocks, experts_count, 1),
                EXPERT_MMA_WARPS * WARP,
                0,
                &down,
            )?;
        } else {
            let blocks = down.hidden.div_ceil(EXPERT_WARPS);
            self.launch(
                Kernel::ExpertDown,
                (blocks, 1, 1),
                EXPERT_WARPS * WARP,
                0,
                &down,
            )?;
        }
        let combine = p::CombineParams {
            down_out: ws.down_output.ptr(),
            positions: ws.topk_ids.ptr(),
            weights: ws.topk_weights.ptr(),
            out: out.ptr(),
            rows: u32_of("rows", rows)?,
            top_k: k as u32,
            hidden: gate_up.hidden,
            pad: 0,
        };
        self.launch(
            Kernel::MoeCombine,
            (combine.rows, 1, 1),
            BLOCK_THREADS,
            0,
            &combine,
        )
    }
}
