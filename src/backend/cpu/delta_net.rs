//! Gated DeltaNet on the host: the causal convolution, the gated delta rule
//! (recurrent for one-token chunks, chunked for longer ones) and the pool of
//! recurrent states they read and write.
//!
//! The pool holds, per Gated DeltaNet layer and sequence slot, the last
//! `kernel − 1` inputs of each convolution channel and one `key_dim ×
//! value_dim` state per value head, in f32. A step's sequence names its
//! slot (`SeqChunk::state_slot`); a chunk starting at position 0 starts from
//! zeros, so a slot needs no clearing when a sequence ends.
//!
//! The delta rule runs one task per (sequence, value head): the task owns
//! that head's state and writes that head's output rows, nothing else.

use std::sync::Arc;

use rayon::prelude::*;

use crate::backend::error::BackendError;
use crate::backend::shapes::DeltaNetShape;
use crate::checkpoint::linear::VectorWeight;
use crate::plan::ledger::{Category, Charge, Ledger};
use crate::plan::memory::RECURRENT_STATE;
use crate::plan::memory::RecurrentStatePlan;
use crate::step::StepBatch;

/// Tokens of one chunk of the chunked delta rule (transformers and FLA use 64).
pub const CHUNK: usize = 64;
/// Widest key or value head the stack scratch of a task holds.
pub const MAX_HEAD_DIM: usize = 256;
/// Channels of one convolution task.
const CHANNEL_BLOCK: usize = 64;
/// Longest convolution kernel the per-channel scratch holds.
const MAX_KERNEL: usize = crate::limits::MAX_CONV_KERNEL;

/// The recurrent states of every Gated DeltaNet layer and sequence slot.
pub struct CpuRecurrentState {
    /// `[layer][slot][channel][kernel − 1]`.
    conv: Vec<f32>,
    /// `[layer][slot][value_head][key_dim][value_dim]`.
    ssm: Vec<f32>,
    layers: usize,
    slots: usize,
    conv_elements: usize,
    ssm_elements: usize,
    _charge: Charge,
}

impl CpuRecurrentState {
    /// Charges the plan's pool, then allocates it zeroed.
    pub(crate) fn allocate(
        plan: &RecurrentStatePlan,
        ledger: &Arc<Ledger>,
    ) -> Result<CpuRecurrentState, BackendError> {
        let charge = ledger.charge(Category::KvCache, plan.bytes, RECURRENT_STATE)?;
        let per_slot = plan.conv_elements + plan.ssm_elements;
        let elements = plan.layers * plan.slots * per_slot;
        if elements as u64 * 4 != plan.bytes {
            return Err(BackendError::Shape(format!(
                "the recurrent-state plan lists {} bytes for {elements} f32 values",
                plan.bytes
            )));
        }
        Ok(CpuRecurrentState {
            conv: vec![0.0; plan.layers * plan.slots * plan.conv_elements],
            ssm: vec![0.0; plan.layers * plan.slots * plan.ssm_elements],
            layers: plan.layers,
            slots: plan.slots,
            conv_elements: plan.conv_elements,
            ssm_elements: plan.ssm_elements,
            _charge: charge,
        })
    }

    /// Bytes the pool holds (tests compare it with the plan).
    pub fn allocated_bytes(&self) -> u64 {
        ((self.conv.len() + self.ssm.len()) * 4) as u64
    }

    /// Copies slot `from` onto slot `to` in every layer, for each pair;
    /// checked first: slots inside the pool, a `to` once and never a `from`.
    pub(crate) fn copy_slots(&mut self, pairs: &[(u32, u32)]) -> Result<(), BackendError> {
        let mut role = vec![0u8; self.slots];
        for &(from, to) in pairs {
            let (from, to) = (from as usize, to as usize);
            if from >= self.slots || to >= self.slots {
                return Err(BackendError::Shape(format!(
                    "state slot copy {from} → {to} outside the pool of {} slots",
                    self.slots
                )));
            }
            if role[to] != 0 || role[from] == 2 || from == to {
                return Err(BackendError::Shape(format!(
                    "state slot copy {from} → {to}: a slot is the target of two copies, or both a source and a target"
                )));
            }
            role[to] = 2;
            role[from] = 1;
        }
        for layer in 0..self.layers {
            for &(from, to) in pairs {
                for (values, n) in [
                    (&mut self.conv, self.conv_elements),
                    (&mut self.ssm, self.ssm_elements),
                ] {
                    let at = |slot: u32| (layer * self.slots + slot as usize) * n;
                    values.copy_within(at(from)..at(from) + n, at(to));
                }
            }
        }
        Ok(())
    }

    /// The slot of each of the batch's sequences, checked: inside the pool
    /// and no slot twice.
    fn slots_of(&self, batch: &StepBatch) -> Result<Vec<usize>, BackendError> {
        let mut taken = vec![false; self.slots];
        batch
            .seqs
            .iter()
            .map(|chunk| {
                let slot = chunk.state_slot as usize;
                match taken.get_mut(slot) {
                    None => Err(BackendError::Shape(format!(
                        "state slot {slot} is outside the pool of {} slots",
                        self.slots
                    ))),
                    Some(true) => Err(BackendError::Shape(format!(
                        "two sequences of one step share state slot {slot}"
                    ))),
                    Some(seen) => {
                        *seen = true;
                        Ok(slot)
                    }
                }
            })
            .collect()
    }

    fn check(&self, layer: usize, shape: &DeltaNetShape) -> Result<(), BackendError> {
        if layer >= self.layers {
            return Err(BackendError::Shape(format!(
                "no Gated DeltaNet layer {layer} in a pool of {}",
                self.layers
            )));
        }
        if shape.conv_state_elements() != self.conv_elements
            || shape.ssm_state_elements() != self.ssm_elements
        {
            return Err(BackendError::Shape(
                "the layer's shape is not the recurrent-state pool's".to_string(),
            ));
        }
        if shape.key_dim > MAX_HEAD_DIM || shape.value_dim > MAX_HEAD_DIM {
            return Err(BackendError::Shape(format!(
                "Gated DeltaNet heads of {} × {} are wider than the CPU backend's {MAX_HEAD_DIM}",
                shape.key_dim, shape.value_dim
            )));
        }
        if shape.conv_kernel < 2 || shape.conv_kernel > MAX_KERNEL {
            return Err(BackendError::Shape(format!(
                "a convolution kernel of {} is outside 2..={MAX_KERNEL}",
                shape.conv_kernel
            )));
        }
        Ok(())
    }
}

/// The causal convolution (see `Backend::gdn_conv`), channel blocks of a
/// sequence in parallel.
pub(crate) fn conv(
    qkv: &mut [f32],
    weight: &VectorWeight<'_>,
    state: &mut CpuRecurrentState,
    layer: usize,
    batch: &StepBatch,
    shape: &DeltaNetShape,
) -> Result<(), BackendError> {
    state.check(layer, shape)?;
    let (channels, kernel) = (shape.conv_channels(), shape.conv_kernel);
    let kept = kernel - 1;
    if weight.len != channels * kernel {
        return Err(BackendError::Shape(format!(
            "a convolution weight of {} values for {channels} channels × {kernel}",
            weight.len
        )));
    }
    BackendError::check_capacity("gdn qkv", batch.rows() * channels, qkv.len())?;
    let slots = state.slots_of(batch)?;
    let per_layer = state.slots * state.conv_elements;
    let layer_state = &mut state.conv[layer * per_layer..][..per_layer];
    let qkv = SharedRows(qkv.as_mut_ptr());
    for (chunk, &slot) in batch.seqs.iter().zip(&slots) {
        let slot_state = &mut layer_state[slot * state.conv_elements..][..state.conv_elements];
        if chunk.past == 0 {
            slot_state.fill(0.0);
        }
        let rows = chunk.rows();
        slot_state
            .par_chunks_mut(kept * CHANNEL_BLOCK)
            .enumerate()
            .for_each(|(block, kept_block)| {
                let first = block * CHANNEL_BLOCK;
                for (c, kept_inputs) in kept_block.chunks_mut(kept).enumerate() {
                    let channel = first + c;
                    let taps: [f32; MAX_KERNEL] = std::array::from_fn(|k| {
                        if k < kernel {
                            weight.get(channel * kernel + k)
                        } else {
                            0.0
                        }
                    });
                    // SAFETY: this task reads and writes only column
                    // `channel` of the sequence's rows, which no other
                    // task touches; the rows lie in the buffer (checked).
                    unsafe {
                        conv_channel(
                            qkv,
                            channels,
                            channel,
                            rows.clone(),
                            &taps[..kernel],
                            kept_inputs,
                        )
                    };
                }
            });
    }
    Ok(())
}

/// Rows of a buffer that tasks write at disjoint places.
#[derive(Clone, Copy)]
struct SharedRows(*mut f32);
// SAFETY: every task writes only places no other task reads or writes
// (its channel, or its head's slice of its sequence's rows), inside a
// buffer that outlives the parallel region.
unsafe impl Send for SharedRows {}
// SAFETY: as above.
unsafe impl Sync for SharedRows {}

impl SharedRows {
    /// # Safety
    /// `at` must lie inside the buffer and no other task may access it.
    unsafe fn at(self, at: usize) -> *mut f32 {
        // SAFETY: the caller's contract.
        unsafe { self.0.add(at) }
    }
}

/// One channel of one sequence: outputs from the last row back, so every
/// input a row reads is still the raw input; the last `kernel − 1` inputs
/// become the channel's kept inputs.
///
/// # Safety
/// Column `channel` of `rows` (rows of `width`) must lie in the buffer and
/// belong to the caller alone.
unsafe fn conv_channel(
    qkv: SharedRows,
    width: usize,
    channel: usize,
    rows: std::ops::Range<usize>,
    taps: &[f32],
    kept: &mut [f32],
) {
    let kernel = taps.len();
    let len = rows.len();
    // SAFETY: the caller's contract.
    let cell = |t: usize| unsafe { qkv.at((rows.start + t) * width + channel) };
    // Input `t − back` of the sequence: a row of the step, or a kept one.
    let mut window = [0.0f32; MAX_KERNEL];
    let mut next_kept = [0.0f32; MAX_KERNEL];
    let old = kept.len();
    for (j, slot) in next_kept[..old].iter_mut().enumerate() {
        // Position `len + j` of [kept | rows] (the last `old` of them).
        let at = len + j;
        *slot = if at >= old {
            // SAFETY: reads the caller's column.
            unsafe { *cell(at - old) }
        } else {
            kept[at]
        };
    }
    for t in (0..len).rev() {
        for (k, w) in window[..kernel].iter_mut().enumerate() {
            // Tap k reads input t − (kernel − 1 − k).
            let back = kernel - 1 - k;
            *w = if t >= back {
                // SAFETY: reads the caller's column.
                unsafe { *cell(t - back) }
            } else {
                kept[old + t - back]
            };
        }
        let sum: f32 = window[..kernel].iter().zip(taps).map(|(x, w)| x * w).sum();
        // SAFETY: writes the caller's column.
        unsafe { *cell(t) = super::ops::silu(sum) };
    }
    kept.copy_from_slice(&next_kept[..old]);
}

/// `x ← x / √(Σx² + 1e-6)` per head of `dim`, then `× scale`.
fn l2_normalise(x: &mut [f32], scale: f32) {
    let sum: f32 = x.iter().map(|v| v * v).sum();
    let inv = 1.0 / (sum + 1e-6).sqrt();
    for v in x {
        *v = *v * inv * scale;
    }
}

/// torch's softplus: `ln(1 + eˣ)`, `x` itself above 20.
fn softplus(x: f32) -> f32 {
    if x > 20.0 { x } else { x.exp().ln_1p() }
}

fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// Everything a delta-rule task reads.
struct RuleInputs<'a> {
    qkv: &'a [f32],
    b: &'a [f32],
    a: &'a [f32],
    a_log: &'a VectorWeight<'a>,
    dt_bias: &'a VectorWeight<'a>,
    shape: &'a DeltaNetShape,
}

impl RuleInputs<'_> {
    fn width(&self) -> usize {
        self.shape.conv_channels()
    }
    fn query(&self, row: usize, key_head: usize) -> &[f32] {
        let d = self.shape.key_dim;
        &self.qkv[row * self.width() + key_head * d..][..d]
    }
    fn key(&self, row: usize, key_head: usize) -> &[f32] {
        let d = self.shape.key_dim;
        &self.qkv[row * self.width() + self.shape.key_width() + key_head * d..][..d]
    }
    fn value(&self, row: usize, head: usize) -> &[f32] {
        let d = self.shape.value_dim;
        &self.qkv[row * self.width() + 2 * self.shape.key_width() + head * d..][..d]
    }
    /// `(β, g)` of value head `head` at `row`.
    fn gates(&self, row: usize, head: usize) -> (f32, f32) {
        let at = row * self.shape.value_heads + head;
        let beta = sigmoid(self.b[at]);
        let g = -self.a_log.get(head).exp() * softplus(self.a[at] + self.dt_bias.get(head));
        (beta, g)
    }
}

/// The gated delta rule (see `Backend::gdn_delta_rule`).
#[allow(clippy::too_many_arguments)]
pub(crate) fn delta_rule(
    qkv: &mut [f32],
    b: &[f32],
    a: &[f32],
    a_log: &VectorWeight<'_>,
    dt_bias: &VectorWeight<'_>,
    state: &mut CpuRecurrentState,
    layer: usize,
    batch: &StepBatch,
    shape: &DeltaNetShape,
    out: &mut [f32],
) -> Result<(), BackendError> {
    state.check(layer, shape)?;
    let rows = batch.rows();
    let heads = shape.value_heads;
    BackendError::check_capacity("gdn qkv", rows * shape.conv_channels(), qkv.len())?;
    BackendError::check_capacity("gdn b", rows * heads, b.len())?;
    BackendError::check_capacity("gdn a", rows * heads, a.len())?;
    BackendError::check_capacity("gdn output", rows * shape.value_width(), out.len())?;
    if a_log.len != heads || dt_bias.len != heads || shape.key_heads == 0 {
        return Err(BackendError::Shape(format!(
            "A_log / dt_bias of {} / {} values for {heads} value heads",
            a_log.len, dt_bias.len
        )));
    }
    let slots = state.slots_of(batch)?;

    // q and k L2-normalised per key head, q also scaled by 1/√key_dim.
    let (kd, kw, width) = (shape.key_dim, shape.key_width(), shape.conv_channels());
    let scale = 1.0 / (kd as f32).sqrt();
    qkv[..rows * width].par_chunks_mut(width).for_each(|row| {
        let (q, rest) = row.split_at_mut(kw);
        q.chunks_mut(kd).for_each(|h| l2_normalise(h, scale));
        rest[..kw].chunks_mut(kd).for_each(|h| l2_normalise(h, 1.0));
    });

    let inputs = RuleInputs {
        qkv: &*qkv,
        b,
        a,
        a_log,
        dt_bias,
        shape,
    };
    let per_head = shape.key_dim * shape.value_dim;
    let per_layer = state.slots * state.ssm_elements;
    let layer_state = &mut state.ssm[layer * per_layer..][..per_layer];
    // One task per (sequence, value head), each with its head's state.
    let mut tasks: Vec<(usize, usize, &mut [f32])> = Vec::with_capacity(batch.seqs.len() * heads);
    let mut by_slot: Vec<Option<&mut [f32]>> = layer_state
        .chunks_mut(state.ssm_elements)
        .map(Some)
        .collect();
    for (seq, &slot) in slots.iter().enumerate() {
        if let Some(slot_state) = by_slot.get_mut(slot).and_then(Option::take) {
            for (head, s) in slot_state.chunks_mut(per_head).enumerate() {
                tasks.push((seq, head, s));
            }
        }
    }
    let out = SharedRows(out.as_mut_ptr());
    tasks.par_iter_mut().for_each(|(seq, head, s)| {
        let chunk = &batch.seqs[*seq];
        if chunk.past == 0 {
            s.fill(0.0);
        }
        let rows = chunk.rows();
        if rows.len() == 1 {
            recurrent_token(&inputs, *head, rows.start, s, out);
        } else {
            let mut first = rows.start;
            while first < rows.end {
                let last = (first + CHUNK).min(rows.end);
                chunked(&inputs, *head, first..last, s, out);
                first = last;
            }
        }
    });
    Ok(())
}

/// Head `head`'s output slice of `row`.
///
/// # Safety
/// The (row, head) place must be the calling task's alone.
#[allow(clippy::mut_from_ref)]
unsafe fn output<'o>(
    out: SharedRows,
    shape: &DeltaNetShape,
    row: usize,
    head: usize,
) -> &'o mut [f32] {
    let d = shape.value_dim;
    // SAFETY: the caller's contract; the place lies in the output (checked
    // in `delta_rule`).
    unsafe { std::slice::from_raw_parts_mut(out.at(row * shape.value_width() + head * d), d) }
}

/// One token of the recurrence: `S ← e^g S; δ = β (v − Sᵀk); S ← S + k δᵀ;
/// o = Sᵀq`, in two passes over `S`.
fn recurrent_token(inputs: &RuleInputs, head: usize, row: usize, s: &mut [f32], out: SharedRows) {
    let shape = inputs.shape;
    let (kd, vd) = (shape.key_dim, shape.value_dim);
    let key_head = head / shape.group();
    let (q, k, v) = (
        inputs.query(row, key_head),
        inputs.key(row, key_head),
        inputs.value(row, head),
    );
    let (beta, g) = inputs.gates(row, head);
    let decay = g.exp();
    let mut delta = [0.0f32; MAX_HEAD_DIM];
    let delta = &mut delta[..vd];
    for (i, state_row) in s.chunks_exact_mut(vd).enumerate().take(kd) {
        for (d, x) in delta.iter_mut().zip(state_row.iter_mut()) {
            *x *= decay;
            *d += k[i] * *x;
        }
    }
    for (d, &vj) in delta.iter_mut().zip(v) {
        *d = beta * (vj - *d);
    }
    // SAFETY: (row, head) is this task's.
    let o = unsafe { output(out, shape, row, head) };
    o.fill(0.0);
    for (i, state_row) in s.chunks_exact_mut(vd).enumerate().take(kd) {
        for ((x, &d), oj) in state_row.iter_mut().zip(delta.iter()).zip(o.iter_mut()) {
            *x += k[i] * d;
            *oj += q[i] * *x;
        }
    }
}

/// Rows `rows` (at most [`CHUNK`]) of one head in the chunked form. With
/// `G_t` the decay summed over the chunk up to token `t` and `S₀` the state
/// before it, the corrections `δ_t` solve the unit lower-triangular system
/// `δ_t + Σ_{s<t} β_t (k_t·k_s) e^{G_t−G_s} δ_s = β_t (v_t − e^{G_t} S₀ᵀk_t)`
/// (the UT transform, by forward substitution), then
/// `o_t = e^{G_t} S₀ᵀq_t + Σ_{s≤t} (q_t·k_s) e^{G_t−G_s} δ_s` and
/// `S ← e^{G_L} S₀ + Σ_s e^{G_L−G_s} k_s δ_sᵀ`: the recurrence's result.
fn chunked(
    inputs: &RuleInputs,
    head: usize,
    rows: std::ops::Range<usize>,
    s: &mut [f32],
    out: SharedRows,
) {
    let shape = inputs.shape;
    let (kd, vd) = (shape.key_dim, shape.value_dim);
    let key_head = head / shape.group();
    let len = rows.len();
    let mut cum = [0.0f32; CHUNK];
    let mut beta = [0.0f32; CHUNK];
    let mut total = 0.0f32;
    for (t, row) in rows.clone().enumerate() {
        let (b, g) = inputs.gates(row, head);
        total += g;
        cum[t] = total;
        beta[t] = b;
    }
    // δ_t starts as S₀ᵀk_t; each output row as S₀ᵀq_t.
    let mut delta = [0.0f32; CHUNK * MAX_HEAD_DIM];
    let delta = &mut delta[..len * vd];
    let outputs: Vec<&mut [f32]> = rows
        .clone()
        // SAFETY: (row, head) is this task's for every row of its chunk.
        .map(|row| unsafe { output(out, shape, row, head) })
        .collect();
    let mut outputs = outputs;
    for o in outputs.iter_mut() {
        o.fill(0.0);
    }
    for (i, state_row) in s.chunks_exact(vd).enumerate().take(kd) {
        for (t, row) in rows.clone().enumerate() {
            let (ki, qi) = (inputs.key(row, key_head)[i], inputs.query(row, key_head)[i]);
            let d = &mut delta[t * vd..][..vd];
            for ((dj, oj), &x) in d.iter_mut().zip(outputs[t].iter_mut()).zip(state_row) {
                *dj += ki * x;
                *oj += qi * x;
            }
        }
    }
    for (t, row) in rows.clone().enumerate() {
        let decay = cum[t].exp();
        let v = inputs.value(row, head);
        for (dj, &vj) in delta[t * vd..][..vd].iter_mut().zip(v) {
            *dj = beta[t] * (vj - decay * *dj);
        }
        outputs[t].iter_mut().for_each(|o| *o *= decay);
    }
    // Forward substitution, then each output's sum over the corrections.
    let dot = |x: &[f32], y: &[f32]| x.iter().zip(y).map(|(a, b)| a * b).sum::<f32>();
    for t in 0..len {
        let (kt, qt) = (
            inputs.key(rows.start + t, key_head),
            inputs.query(rows.start + t, key_head),
        );
        let (done, rest) = delta.split_at_mut(t * vd);
        let dt = &mut rest[..vd];
        for s_ in 0..t {
            let ks = inputs.key(rows.start + s_, key_head);
            let weight = beta[t] * dot(kt, ks) * (cum[t] - cum[s_]).exp();
            for (d, &ds) in dt.iter_mut().zip(&done[s_ * vd..][..vd]) {
                *d -= weight * ds;
            }
        }
        for s_ in 0..=t {
            let ks = inputs.key(rows.start + s_, key_head);
            let weight = dot(qt, ks) * (cum[t] - cum[s_]).exp();
            let ds = if s_ == t {
                &*dt
            } else {
                &done[s_ * vd..][..vd]
            };
            for (o, &d) in outputs[t].iter_mut().zip(ds) {
                *o += weight * d;
            }
        }
    }
    let last = cum[len - 1];
    let chunk_decay = last.exp();
    for (i, state_row) in s.chunks_exact_mut(vd).enumerate().take(kd) {
        state_row.iter_mut().for_each(|x| *x *= chunk_decay);
        for t in 0..len {
            let weight = inputs.key(rows.start + t, key_head)[i] * (last - cum[t]).exp();
            for (x, &d) in state_row.iter_mut().zip(&delta[t * vd..][..vd]) {
                *x += weight * d;
            }
        }
    }
}

/// qwen3_next's fused projections to the split layout (see
/// `Backend::gdn_unfuse`).
#[allow(clippy::too_many_arguments)]
pub(crate) fn unfuse(
    qkvz: &[f32],
    ba: &[f32],
    rows: usize,
    shape: &DeltaNetShape,
    qkv: &mut [f32],
    z: &mut [f32],
    b: &mut [f32],
    a: &mut [f32],
) -> Result<(), BackendError> {
    let (kd, vd, group) = (shape.key_dim, shape.value_dim, shape.group());
    let (kw, vw, heads) = (shape.key_width(), shape.value_width(), shape.value_heads);
    let fused = shape.conv_channels() + vw;
    let channels = shape.conv_channels();
    BackendError::check_capacity("in_proj_qkvz output", rows * fused, qkvz.len())?;
    BackendError::check_capacity("in_proj_ba output", rows * 2 * heads, ba.len())?;
    BackendError::check_capacity("gdn qkv", rows * channels, qkv.len())?;
    BackendError::check_capacity("gdn z", rows * vw, z.len())?;
    BackendError::check_capacity("gdn b", rows * heads, b.len().min(a.len()))?;
    // Per key head: q (kd), k (kd), v (group × vd), z (group × vd); b
    // (group), a (group).
    let per_key = 2 * kd + 2 * group * vd;
    for r in 0..rows {
        let src = &qkvz[r * fused..][..fused];
        let dst = &mut qkv[r * channels..][..channels];
        let zr = &mut z[r * vw..][..vw];
        for (h, head) in src.chunks_exact(per_key).enumerate() {
            let (q, rest) = head.split_at(kd);
            let (k, rest) = rest.split_at(kd);
            let (v, zs) = rest.split_at(group * vd);
            dst[h * kd..][..kd].copy_from_slice(q);
            dst[kw + h * kd..][..kd].copy_from_slice(k);
            dst[2 * kw + h * group * vd..][..group * vd].copy_from_slice(v);
            zr[h * group * vd..][..group * vd].copy_from_slice(zs);
        }
        let src = &ba[r * 2 * heads..][..2 * heads];
        for (h, pair) in src.chunks_exact(2 * group).enumerate() {
            b[r * heads + h * group..][..group].copy_from_slice(&pair[..group]);
            a[r * heads + h * group..][..group].copy_from_slice(&pair[group..]);
        }
    }
    Ok(())
}
