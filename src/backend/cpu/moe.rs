//! Routed experts on the CPU, through the ONE MoE workspace the plan sizes:
//! route, group the routed rows by expert (a counting sort), gather their
//! inputs, run every active expert's gate/up as one grouped matmul, the
//! activation, every down projection as another, then sum each token's
//! expert outputs weighted by its routing weights.

use std::sync::{Arc, Mutex, MutexGuard};

use rayon::prelude::*;

use super::kernels::{self, ActivationScratch, GroupedProblem};
use super::ops;
use crate::backend::charges::charge_workspace_buffer;
use crate::backend::error::BackendError;
use crate::backend::experts::{ExpertActivation, ExpertsSpec, GateUp, RouterKind};
use crate::checkpoint::linear::{LinearWeight, VectorWeight};
use crate::plan::ledger::{Charge, Ledger};
use crate::plan::memory::{
    ACTIVATION_BYTES, MoeWorkspace as MoeWorkspacePlan, QUANTIZED_CODE_BYTES,
};

/// Most experts a router may choose from (the selection's stack buffer).
const MAX_EXPERTS: usize = 1024;

/// One layer's experts, borrowed from the checkpoint.
pub struct CpuExperts<'w> {
    gate_up: GateUp<'w>,
    down: Vec<LinearWeight<'w>>,
    down_bias: Vec<VectorWeight<'w>>,
    activation: ExpertActivation,
    hidden: usize,
    intermediate: usize,
}

impl<'w> CpuExperts<'w> {
    pub(crate) fn new(spec: ExpertsSpec<'w>) -> Result<CpuExperts<'w>, BackendError> {
        let (h, i, e) = (spec.hidden_size, spec.intermediate_size, spec.num_experts());
        let bad = |what: String| Err(BackendError::Shape(what));
        let check = |w: &LinearWeight<'_>, rows: usize, cols: usize, what: &str| {
            if w.rows != rows || w.cols != cols {
                return Err(BackendError::Shape(format!(
                    "{what} is [{}, {}], expected [{rows}, {cols}]",
                    w.rows, w.cols
                )));
            }
            kernels::weights::check_weight(w).map_err(|e| BackendError::Kernel(e.to_string()))
        };
        match &spec.gate_up {
            GateUp::Split { gate, up } => {
                if gate.len() != e || up.len() != e {
                    return bad(format!(
                        "{e} experts but {} gate / {} up",
                        gate.len(),
                        up.len()
                    ));
                }
                for w in gate.iter().chain(up) {
                    check(w, i, h, "expert gate/up")?;
                }
            }
            GateUp::Interleaved { gate_up, bias } => {
                if gate_up.len() != e || bias.len() != e {
                    return bad(format!("{e} experts but {} gate_up", gate_up.len()));
                }
                for w in gate_up {
                    check(w, 2 * i, h, "expert gate_up")?;
                }
                if bias.iter().any(|b| b.len != 2 * i) {
                    return bad(format!("expert gate_up bias must have {} values", 2 * i));
                }
            }
        }
        for w in &spec.down {
            check(w, h, i, "expert down")?;
        }
        if !spec.down_bias.is_empty()
            && (spec.down_bias.len() != e || spec.down_bias.iter().any(|b| b.len != h))
        {
            return bad(format!("expert down bias must be {e} × {h}"));
        }
        Ok(CpuExperts {
            gate_up: spec.gate_up,
            down: spec.down,
            down_bias: spec.down_bias,
            activation: spec.activation,
            hidden: h,
            intermediate: i,
        })
    }
}

/// The MoE workspace: the plan's buffers, allocated once.
pub struct CpuWorkspace {
    /// Expert of each routed row (`token × k + rank`); after grouping, the
    /// row's position in expert order.
    topk_ids: Vec<u32>,
    topk_weights: Vec<f32>,
    /// Rows of expert `e` are `sorted_rows[offsets[e]..offsets[e + 1]]`.
    expert_offsets: Vec<u32>,
    sorted_rows: Vec<u32>,
    gathered_input: Vec<f32>,
    gate_up_output: Vec<f32>,
    activation: Vec<f32>,
    down_output: Vec<f32>,
    /// Where MXFP4 and NVFP4 matmuls quantize their inputs (empty when the
    /// plan has no such buffers: no linear is in those formats). Shared with
    /// the backend's other matmuls (`CpuBackend::workspace`), which never run
    /// during an expert call.
    quantized: SharedScratch,
    /// Rows routed by the last `route` call, and its k.
    routed: usize,
    top_k: usize,
    _charges: Vec<Charge>,
}

/// The planned scratch quantized activations go to, shared by the experts
/// and the backend's other matmuls.
pub(crate) type SharedScratch = Arc<Mutex<ActivationScratch>>;

/// The scratch, for one matmul call.
pub(crate) fn lock_scratch(
    scratch: &SharedScratch,
) -> Result<MutexGuard<'_, ActivationScratch>, BackendError> {
    scratch.lock().map_err(|_| {
        BackendError::Kernel("a matmul panicked holding the activation scratch".into())
    })
}

impl CpuWorkspace {
    /// The quantized-activation scratch, for the backend's other matmuls.
    pub(crate) fn quantized_scratch(&self) -> SharedScratch {
        Arc::clone(&self.quantized)
    }

    pub(crate) fn allocate(
        plan: &MoeWorkspacePlan,
        ledger: &Arc<Ledger>,
    ) -> Result<CpuWorkspace, BackendError> {
        let mut charges = Vec::new();
        let mut bytes = |name: &str| -> Result<usize, BackendError> {
            let (bytes, charge) = charge_workspace_buffer(plan, ledger, name)?;
            charges.push(charge);
            Ok(bytes)
        };
        let quantized = if plan.buffers.iter().any(|b| b.name == "quantized_input") {
            ActivationScratch::from_buffers(
                vec![0; bytes("quantized_input")? / QUANTIZED_CODE_BYTES as usize],
                vec![0.0; bytes("quantized_scales")? / ACTIVATION_BYTES as usize],
            )
        } else {
            ActivationScratch::from_buffers(Vec::new(), Vec::new())
        };
        let quantized = Arc::new(Mutex::new(quantized));
        // Every other buffer holds 4-byte values (f32 or i32).
        let mut elements = |name: &str| bytes(name).map(|b| b / ACTIVATION_BYTES as usize);
        let ws = CpuWorkspace {
            topk_ids: vec![0; elements("topk_ids")?],
            topk_weights: vec![0.0; elements("topk_weights")?],
            expert_offsets: vec![0; elements("expert_offsets")?],
            sorted_rows: vec![0; elements("sorted_rows")?],
            gathered_input: vec![0.0; elements("gathered_input")?],
            gate_up_output: vec![0.0; elements("gate_up_output")?],
            activation: vec![0.0; elements("activation")?],
            down_output: vec![0.0; elements("down_output")?],
            quantized,
            routed: 0,
            top_k: 0,
            _charges: Vec::new(),
        };
        Ok(CpuWorkspace {
            _charges: charges,
            ..ws
        })
    }

    /// Picks each token's top-k experts and their weights.
    pub(crate) fn route(
        &mut self,
        logits: &[f32],
        rows: usize,
        num_experts: usize,
        top_k: usize,
        kind: RouterKind,
    ) -> Result<(), BackendError> {
        BackendError::check_capacity("router logits", rows * num_experts, logits.len())?;
        BackendError::check_capacity("routed rows", rows * top_k, self.topk_ids.len())?;
        if self.expert_offsets.len() < num_experts + 1
            || top_k == 0
            || top_k > num_experts
            || num_experts > MAX_EXPERTS
        {
            return Err(BackendError::Shape(format!(
                "top-{top_k} of {num_experts} experts does not fit the workspace"
            )));
        }
        self.topk_ids[..rows * top_k]
            .par_chunks_mut(top_k)
            .zip(self.topk_weights[..rows * top_k].par_chunks_mut(top_k))
            .zip(logits[..rows * num_experts].par_chunks(num_experts))
            .for_each(|((ids, weights), row)| top_k_of_row(row, kind, ids, weights));
        self.routed = rows * top_k;
        self.top_k = top_k;
        Ok(())
    }

    /// Runs the routed experts and writes the weighted sum per token to `out`.
    pub(crate) fn run_experts(
        &mut self,
        x: &[f32],
        rows: usize,
        experts: &CpuExperts<'_>,
        out: &mut [f32],
    ) -> Result<(), BackendError> {
        let (h, i, k) = (experts.hidden, experts.intermediate, self.top_k);
        let n = rows * k;
        if n != self.routed {
            return Err(BackendError::Shape(format!(
                "{rows} rows but {} were routed",
                self.routed
            )));
        }
        BackendError::check_capacity("moe input", rows * h, x.len())?;
        BackendError::check_capacity("moe output", rows * h, out.len())?;
        BackendError::check_capacity("gathered input", n * h, self.gathered_input.len())?;
        BackendError::check_capacity("gate/up output", n * 2 * i, self.gate_up_output.len())?;
        BackendError::check_capacity("expert activation", n * i, self.activation.len())?;
        BackendError::check_capacity("down output", n * h, self.down_output.len())?;
        let num_experts = experts.down.len();
        self.group_by_expert(n, num_experts)?;

        // Gather each routed row's token input, in expert order.
        let sorted = &self.sorted_rows[..n];
        self.gathered_input[..n * h]
            .par_chunks_mut(h)
            .zip(sorted.par_iter())
            .for_each(|(dst, &slot)| {
                let token = slot as usize / k;
                dst.copy_from_slice(&x[token * h..(token + 1) * h]);
            });

        let offsets = &self.expert_offsets[..=num_experts];
        let ranges: Vec<(usize, usize, usize)> = (0..num_experts)
            .map(|e| (e, offsets[e] as usize, offsets[e + 1] as usize))
            .filter(|&(_, a, b)| b > a)
            .collect();

        self.gate_up(experts, &ranges, n)?;
        self.activate(experts, &ranges, n);
        self.down(experts, &ranges)?;

        // out[t] = Σ_rank weight · down(row): ranks in routing order, the same
        // order whatever else is in the batch. topk_ids now maps a routed row
        // to its position in expert order.
        let (positions, weights, down) = (&self.topk_ids, &self.topk_weights, &self.down_output);
        out[..rows * h]
            .par_chunks_mut(h)
            .enumerate()
            .for_each(|(token, o)| {
                o.iter_mut().for_each(|v| *v = 0.0);
                for rank in 0..k {
                    let slot = token * k + rank;
                    let w = weights[slot];
                    let row = &down[positions[slot] as usize * h..][..h];
                    for (o, &d) in o.iter_mut().zip(row) {
                        *o += w * d;
                    }
                }
            });
        Ok(())
    }

    /// Counting sort of the routed rows by expert: fills `expert_offsets`
    /// and `sorted_rows`, then turns `topk_ids` into each row's position.
    fn group_by_expert(&mut self, n: usize, num_experts: usize) -> Result<(), BackendError> {
        let offsets = &mut self.expert_offsets[..=num_experts];
        offsets.iter_mut().for_each(|o| *o = 0);
        for &e in &self.topk_ids[..n] {
            if e as usize >= num_experts {
                return Err(BackendError::Shape(format!(
                    "routed to expert {e} of {num_experts}"
                )));
            }
            offsets[e as usize + 1] += 1;
        }
        for e in 0..num_experts {
            offsets[e + 1] += offsets[e];
        }
        // Stable: within an expert, rows keep token order.
        for slot in 0..n {
            let e = self.topk_ids[slot] as usize;
            let position = offsets[e];
            self.sorted_rows[position as usize] = slot as u32;
            offsets[e] += 1;
        }
        // Shift the offsets back to starts.
        for e in (1..=num_experts).rev() {
            offsets[e] = offsets[e - 1];
        }
        offsets[0] = 0;
        for (position, &slot) in self.sorted_rows[..n].iter().enumerate() {
            self.topk_ids[slot as usize] = position as u32;
        }
        Ok(())
    }

    fn gate_up(
        &mut self,
        experts: &CpuExperts<'_>,
        ranges: &[(usize, usize, usize)],
        n: usize,
    ) -> Result<(), BackendError> {
        let (h, i) = (experts.hidden, experts.intermediate);
        let x = &self.gathered_input;
        let mut problems = Vec::with_capacity(2 * ranges.len());
        match &experts.gate_up {
            GateUp::Split { gate, up } => {
                // gate rows in the first n × i values, up rows in the next.
                let (gate_out, up_out) = self.gate_up_output[..2 * n * i].split_at_mut(n * i);
                let mut gate_rest = gate_out;
                let mut up_rest = up_out;
                let mut done = 0;
                for &(e, a, b) in ranges {
                    let skip = (a - done) * i;
                    let (g, gr) = std::mem::take(&mut gate_rest)[skip..].split_at_mut((b - a) * i);
                    let (u, ur) = std::mem::take(&mut up_rest)[skip..].split_at_mut((b - a) * i);
                    gate_rest = gr;
                    up_rest = ur;
                    done = b;
                    let input = &x[a * h..b * h];
                    problems.push(GroupedProblem {
                        x: input,
                        tokens: b - a,
                        weight: gate[e],
                        out: g,
                    });
                    problems.push(GroupedProblem {
                        x: input,
                        tokens: b - a,
                        weight: up[e],
                        out: u,
                    });
                }
            }
            GateUp::Interleaved { gate_up, .. } => {
                let mut rest = &mut self.gate_up_output[..2 * n * i];
                let mut done = 0;
                for &(e, a, b) in ranges {
                    let skip = (a - done) * 2 * i;
                    let (o, r) = std::mem::take(&mut rest)[skip..].split_at_mut((b - a) * 2 * i);
                    rest = r;
                    done = b;
                    problems.push(GroupedProblem {
                        x: &x[a * h..b * h],
                        tokens: b - a,
                        weight: gate_up[e],
                        out: o,
                    });
                }
            }
        }
        kernels::matmul_grouped_in(&mut problems, &mut *lock_scratch(&self.quantized)?)
            .map_err(|e| BackendError::Kernel(e.to_string()))
    }

    fn activate(&mut self, experts: &CpuExperts<'_>, ranges: &[(usize, usize, usize)], n: usize) {
        let i = experts.intermediate;
        match (&experts.gate_up, experts.activation) {
            (GateUp::Split { .. }, _) => {
                let (gate, up) = self.gate_up_output[..2 * n * i].split_at(n * i);
                self.activation[..n * i]
                    .par_chunks_mut(i)
                    .zip(gate.par_chunks(i).zip(up.par_chunks(i)))
                    .for_each(|(a, (g, u))| {
                        for ((a, &g), &u) in a.iter_mut().zip(g).zip(u) {
                            *a = ops::silu(g) * u;
                        }
                    });
            }
            (GateUp::Interleaved { bias, .. }, activation) => {
                let (limit, alpha) = match activation {
                    ExpertActivation::ClampedSwiglu { limit, alpha } => (limit, alpha),
                    ExpertActivation::SiluMul => (f32::INFINITY, 1.0),
                };
                let gu = &self.gate_up_output[..2 * n * i];
                let act = &mut self.activation[..n * i];
                for &(e, a, b) in ranges {
                    let bias = &bias[e];
                    act[a * i..b * i]
                        .par_chunks_mut(i)
                        .zip(gu[a * 2 * i..b * 2 * i].par_chunks(2 * i))
                        .for_each(|(out, row)| {
                            for (j, o) in out.iter_mut().enumerate() {
                                let gate = (row[2 * j] + bias.get(2 * j)).min(limit);
                                let up =
                                    (row[2 * j + 1] + bias.get(2 * j + 1)).clamp(-limit, limit);
                                *o = (up + 1.0) * gate * sigmoid(alpha * gate);
                            }
                        });
                }
            }
        }
    }

    fn down(
        &mut self,
        experts: &CpuExperts<'_>,
        ranges: &[(usize, usize, usize)],
    ) -> Result<(), BackendError> {
        let (h, i) = (experts.hidden, experts.intermediate);
        let act = &self.activation;
        let mut rest = &mut self.down_output[..];
        let mut done = 0;
        let mut problems = Vec::with_capacity(ranges.len());
        let mut outs: Vec<(usize, usize, usize)> = Vec::with_capacity(ranges.len());
        for &(e, a, b) in ranges {
            let skip = (a - done) * h;
            let (o, r) = std::mem::take(&mut rest)[skip..].split_at_mut((b - a) * h);
            rest = r;
            done = b;
            problems.push(GroupedProblem {
                x: &act[a * i..b * i],
                tokens: b - a,
                weight: experts.down[e],
                out: o,
            });
            outs.push((e, a, b));
        }
        kernels::matmul_grouped_in(&mut problems, &mut *lock_scratch(&self.quantized)?)
            .map_err(|e| BackendError::Kernel(e.to_string()))?;
        drop(problems);
        if !experts.down_bias.is_empty() {
            for (e, a, b) in outs {
                ops::add_bias(&mut self.down_output[a * h..b * h], &experts.down_bias[e]);
            }
        }
        Ok(())
    }
}

#[inline]
fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// The top-k experts of one token and their routing weights, best first
/// (ties go to the lower expert id).
fn top_k_of_row(logits: &[f32], kind: RouterKind, ids: &mut [u32], weights: &mut [f32]) {
    // Selection by repeated maximum: k is small (≤ 8) and E ≤ a few hundred.
    let mut taken = [false; MAX_EXPERTS];
    let e = logits.len().min(MAX_EXPERTS);
    for id in ids.iter_mut() {
        let mut best = usize::MAX;
        for j in 0..e {
            if !taken[j] && (best == usize::MAX || logits[j] > logits[best]) {
                best = j;
            }
        }
        taken[best] = true;
        *id = best as u32;
    }
    match kind {
        RouterKind::SoftmaxTopK { renormalize } => {
            // Softmax over all experts, then keep the chosen probabilities.
            let max = logits[ids[0] as usize];
            let total: f32 = logits.iter().map(|&l| (l - max).exp()).sum();
            for (w, &id) in weights.iter_mut().zip(ids.iter()) {
                *w = (logits[id as usize] - max).exp() / total;
            }
            if renormalize {
                let sum: f32 = weights.iter().sum();
                weights.iter_mut().for_each(|w| *w /= sum);
            }
        }
        RouterKind::TopKSoftmax => {
            let max = logits[ids[0] as usize];
            for (w, &id) in weights.iter_mut().zip(ids.iter()) {
                *w = (logits[id as usize] - max).exp();
            }
            let sum: f32 = weights.iter().sum();
            weights.iter_mut().for_each(|w| *w /= sum);
        }
    }
}
