//! Gated DeltaNet on the host: the causal convolution, the gated delta rule
//! (in its recurrent form, token by token) and the pool of recurrent states
//! they read and write.
//!
//! The pool holds, per Gated DeltaNet layer and slot, the last `kernel − 1`
//! inputs of each convolution channel and one `key_dim × value_dim` state
//! per value head, in the plan's `state_dtype`: f32, or bf16 (the
//! recurrence computes in f32 either way: a step loads the slots it
//! touches to f32 and stores them back rounded). A step's sequence names its slot
//! (`SeqChunk::state_slot`); a chunk starting at position 0 starts from
//! zeros, so a slot needs no clearing when a sequence ends. The other slots
//! hold the prefix cache's snapshots: a step's `state_saves` copy a
//! sequence's state after one of its rows into one of them.
//!
//! The delta rule runs one task per (sequence, value head): the task owns
//! that head's state (and its snapshots) and writes that head's output rows,
//! nothing else. The recurrent form is used for every row, prefill
//! included: on the CPU it beats the chunked form (UT transform, chunks of
//! 64) by 1.9× at Qwen3.6's head shape (measured, see ARCHITECTURE.md), and
//! it has the state after every row at hand for a snapshot.

use std::sync::Arc;

use rayon::prelude::*;

use crate::backend::error::BackendError;
use crate::backend::shapes::DeltaNetShape;
use crate::checkpoint::linear::VectorWeight;
use crate::plan::ledger::{Category, Charge, Ledger};
use crate::plan::memory::RecurrentStatePlan;
use crate::plan::memory::{
    RECURRENT_STATE_LIVE, RECURRENT_STATE_SNAPSHOTS, RECURRENT_STATE_VERIFY,
};
use crate::plan::profile::StateDtype;
use crate::step::{StateSave, StepBatch};

/// Widest key or value head the stack scratch of a task holds.
pub const MAX_HEAD_DIM: usize = 256;
/// Channels of one convolution task.
const CHANNEL_BLOCK: usize = 64;
/// Longest convolution kernel the per-channel scratch holds.
const MAX_KERNEL: usize = crate::limits::MAX_CONV_KERNEL;

/// The recurrent states of every Gated DeltaNet layer and sequence slot.
pub struct CpuRecurrentState {
    /// `[layer][slot][channel][kernel − 1]`.
    conv: StateValues,
    /// `[layer][slot][value_head][key_dim][value_dim]`.
    ssm: StateValues,
    layers: usize,
    slots: usize,
    conv_elements: usize,
    ssm_elements: usize,
    /// The live slots' and the snapshots' charges (the latter only when
    /// there are snapshots).
    _charges: Vec<Charge>,
}

impl CpuRecurrentState {
    /// Charges the plan's pool, then allocates it zeroed.
    pub(crate) fn allocate(
        plan: &RecurrentStatePlan,
        ledger: &Arc<Ledger>,
    ) -> Result<CpuRecurrentState, BackendError> {
        let mut charges = vec![ledger.charge(
            Category::RecurrentState,
            plan.live_slots as u64 * plan.bytes_per_seq,
            RECURRENT_STATE_LIVE,
        )?];
        if plan.snapshot_slots > 0 {
            charges.push(ledger.charge(
                Category::RecurrentState,
                plan.snapshot_slots as u64 * plan.bytes_per_seq,
                RECURRENT_STATE_SNAPSHOTS,
            )?);
        }
        if plan.verify_slots > 0 {
            charges.push(ledger.charge(
                Category::RecurrentState,
                plan.verify_slots as u64 * plan.bytes_per_seq,
                RECURRENT_STATE_VERIFY,
            )?);
        }
        let per_slot = plan.conv_elements + plan.ssm_elements;
        let elements = plan.layers * plan.slots * per_slot;
        if elements as u64 * plan.dtype.bytes() != plan.bytes {
            return Err(BackendError::Shape(format!(
                "the recurrent-state plan lists {} bytes for {elements} {} values",
                plan.bytes,
                plan.dtype.name()
            )));
        }
        let n = plan.layers * plan.slots;
        Ok(CpuRecurrentState {
            conv: StateValues::zeroed(plan.dtype, n * plan.conv_elements),
            ssm: StateValues::zeroed(plan.dtype, n * plan.ssm_elements),
            layers: plan.layers,
            slots: plan.slots,
            conv_elements: plan.conv_elements,
            ssm_elements: plan.ssm_elements,
            _charges: charges,
        })
    }

    /// Bytes the pool holds (tests compare it with the plan).
    pub fn allocated_bytes(&self) -> u64 {
        self.conv.bytes() + self.ssm.bytes()
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
                    values.copy_within(at(from), n, at(to));
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

    /// Checks the batch's state saves against its live slots: each inside
    /// the pool, on a row of its sequence, into a slot no sequence of the
    /// step holds and no other save writes.
    fn check_saves(&self, batch: &StepBatch, live: &[usize]) -> Result<(), BackendError> {
        let mut taken = vec![false; self.slots];
        for &slot in live {
            taken[slot] = true;
        }
        for save in &batch.state_saves {
            let slot = save.slot as usize;
            let on_its_rows = batch
                .seqs
                .get(save.seq as usize)
                .is_some_and(|chunk| chunk.rows().contains(&(save.row as usize)));
            if !on_its_rows {
                return Err(BackendError::Shape(format!(
                    "state save at row {} is not a row of sequence {}",
                    save.row, save.seq
                )));
            }
            match taken.get_mut(slot) {
                None => {
                    return Err(BackendError::Shape(format!(
                        "state save into slot {slot}, outside the pool of {} slots",
                        self.slots
                    )));
                }
                Some(true) => {
                    return Err(BackendError::Shape(format!(
                        "state save into slot {slot}, which a sequence of the step holds or another save writes"
                    )));
                }
                Some(seen) => *seen = true,
            }
        }
        Ok(())
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
    if weight.len != channels * kernel {
        return Err(BackendError::Shape(format!(
            "a convolution weight of {} values for {channels} channels × {kernel}",
            weight.len
        )));
    }
    BackendError::check_capacity("gdn qkv", batch.rows() * channels, qkv.len())?;
    let slots = state.slots_of(batch)?;
    state.check_saves(batch, &slots)?;
    let n = state.conv_elements;
    let pool_slots = state.slots;
    let touched = touched_slots(&slots, batch);
    state
        .conv
        .with_layer(layer, pool_slots, n, &touched, |layer_state| {
            conv_layer(qkv, weight, layer_state, n, &slots, batch, channels, kernel)
        });
    Ok(())
}

/// The convolution over one layer's f32 states (`n` values a slot).
#[allow(clippy::too_many_arguments)]
fn conv_layer(
    qkv: &mut [f32],
    weight: &VectorWeight<'_>,
    layer_state: &mut [f32],
    n: usize,
    slots: &[usize],
    batch: &StepBatch,
    channels: usize,
    kernel: usize,
) {
    let kept = kernel - 1;
    for (seq, (chunk, &slot)) in batch.seqs.iter().zip(slots).enumerate() {
        if chunk.past == 0 {
            layer_state[slot * n..][..n].fill(0.0);
        }
        // Snapshots first, while every row still holds its raw input.
        for save in batch.state_saves.iter().filter(|s| s.seq as usize == seq) {
            let (kept, snapshot) = two_slots_mut(layer_state, n, slot, save.slot as usize);
            save_conv_window(qkv, channels, kept, snapshot, chunk.start as usize, save);
        }
    }
    let qkv = SharedRows(qkv.as_mut_ptr());
    for (chunk, &slot) in batch.seqs.iter().zip(slots) {
        let slot_state = &mut layer_state[slot * n..][..n];
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
}

/// The live slots of a step and the slots its saves write: the ones a step
/// loads and stores.
fn touched_slots(live: &[usize], batch: &StepBatch) -> Vec<usize> {
    let saves = batch.state_saves.iter().map(|s| s.slot as usize);
    live.iter().copied().chain(saves).collect()
}

/// One kind of state (convolution or delta rule) of every layer and slot,
/// in the pool's element type.
enum StateValues {
    F32(Vec<f32>),
    /// bf16 bits.
    Bf16(Vec<u16>),
}

impl StateValues {
    fn zeroed(dtype: StateDtype, elements: usize) -> StateValues {
        match dtype {
            StateDtype::F32 => StateValues::F32(vec![0.0; elements]),
            StateDtype::Bf16 => StateValues::Bf16(vec![0; elements]),
        }
    }

    fn bytes(&self) -> u64 {
        match self {
            StateValues::F32(v) => v.len() as u64 * 4,
            StateValues::Bf16(v) => v.len() as u64 * 2,
        }
    }

    /// Copies `n` values at `from` to `to` (snapshots copy the stored bits).
    fn copy_within(&mut self, from: usize, n: usize, to: usize) {
        match self {
            StateValues::F32(v) => v.copy_within(from..from + n, to),
            StateValues::Bf16(v) => v.copy_within(from..from + n, to),
        }
    }

    /// Runs `f` on layer `layer`'s states (`slots` of `n` values) as f32:
    /// in place for f32; for bf16 the `touched` slots are loaded into an f32
    /// copy and stored back rounded to nearest even (the others are zeros
    /// there and not stored).
    fn with_layer<R>(
        &mut self,
        layer: usize,
        slots: usize,
        n: usize,
        touched: &[usize],
        f: impl FnOnce(&mut [f32]) -> R,
    ) -> R {
        let per_layer = slots * n;
        match self {
            StateValues::F32(v) => f(&mut v[layer * per_layer..][..per_layer]),
            StateValues::Bf16(v) => {
                let stored = &mut v[layer * per_layer..][..per_layer];
                let mut values = vec![0.0f32; per_layer];
                for &slot in touched {
                    let at = slot * n;
                    super::kernels::ops::bf16_to_f32_row(
                        &stored[at..at + n],
                        &mut values[at..at + n],
                    );
                }
                let result = f(&mut values);
                for &slot in touched {
                    let at = slot * n;
                    super::kernels::ops::f32_to_bf16_row(
                        &values[at..at + n],
                        &mut stored[at..at + n],
                    );
                }
                result
            }
        }
    }
}

/// Slots `a` and `b` (different) of a layer's states of `n` values each.
fn two_slots_mut(states: &mut [f32], n: usize, a: usize, b: usize) -> (&mut [f32], &mut [f32]) {
    debug_assert_ne!(a, b);
    if a < b {
        let (low, high) = states.split_at_mut(b * n);
        (&mut low[a * n..][..n], &mut high[..n])
    } else {
        let (low, high) = states.split_at_mut(a * n);
        (&mut high[..n], &mut low[b * n..][..n])
    }
}

/// The convolution state after row `save.row`: per channel, the last
/// `kernel − 1` raw inputs up to that row, oldest first, taken from the
/// step's rows (from `first_row` on) or, before them, from the sequence's
/// kept inputs `kept`.
fn save_conv_window(
    qkv: &[f32],
    channels: usize,
    kept: &[f32],
    snapshot: &mut [f32],
    first_row: usize,
    save: &StateSave,
) {
    let old = kept.len() / channels;
    // The row's place in [kept inputs | step rows]; the window ends there.
    let end = old + save.row as usize - first_row + 1;
    for (channel, window) in snapshot.chunks_exact_mut(old).enumerate() {
        for (j, value) in window.iter_mut().enumerate() {
            let at = end - old + j;
            *value = if at < old {
                kept[channel * old + at]
            } else {
                qkv[(first_row + at - old) * channels + channel]
            };
        }
    }
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
    state.check_saves(batch, &slots)?;

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
    let n = state.ssm_elements;
    let pool_slots = state.slots;
    let touched = touched_slots(&slots, batch);
    state
        .ssm
        .with_layer(layer, pool_slots, n, &touched, |layer_state| {
            rule_layer(&inputs, layer_state, n, &slots, batch, out)
        });
    Ok(())
}

/// The delta rule over one layer's f32 states (`n` values a slot).
fn rule_layer(
    inputs: &RuleInputs,
    layer_state: &mut [f32],
    n: usize,
    slots: &[usize],
    batch: &StepBatch,
    out: &mut [f32],
) {
    let shape = inputs.shape;
    let heads = shape.value_heads;
    let per_head = shape.key_dim * shape.value_dim;
    let mut by_slot: Vec<Option<&mut [f32]>> = layer_state.chunks_mut(n).map(Some).collect();
    // One task per (sequence, value head), each with its head's state and
    // the same head of the sequence's snapshots (slots checked distinct).
    let mut tasks: Vec<HeadTask> = Vec::with_capacity(batch.seqs.len() * heads);
    for (seq, &slot) in slots.iter().enumerate() {
        if let Some(slot_state) = by_slot.get_mut(slot).and_then(Option::take) {
            for (head, state) in slot_state.chunks_mut(per_head).enumerate() {
                tasks.push(HeadTask {
                    seq,
                    head,
                    state,
                    saves: Vec::new(),
                });
            }
        }
    }
    for save in &batch.state_saves {
        if let Some(snapshot) = by_slot.get_mut(save.slot as usize).and_then(Option::take) {
            let first = save.seq as usize * heads;
            for (task, head_state) in tasks[first..first + heads]
                .iter_mut()
                .zip(snapshot.chunks_mut(per_head))
            {
                task.saves.push((save.row as usize, head_state));
            }
        }
    }
    let out = SharedRows(out.as_mut_ptr());
    tasks.par_iter_mut().for_each(|task| {
        let chunk = &batch.seqs[task.seq];
        if chunk.past == 0 {
            task.state.fill(0.0);
        }
        for row in chunk.rows() {
            recurrent_token(inputs, task.head, row, task.state, out);
            for (_, snapshot) in task.saves.iter_mut().filter(|(at, _)| *at == row) {
                snapshot.copy_from_slice(task.state);
            }
        }
    });
}

/// One value head of one sequence: its state, and the snapshots to fill
/// after given rows.
struct HeadTask<'s> {
    seq: usize,
    head: usize,
    state: &'s mut [f32],
    saves: Vec<(usize, &'s mut [f32])>,
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
