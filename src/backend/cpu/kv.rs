//! The KV cache on the host: a paged pool of blocks for full-attention
//! layers, a ring of `window` slots per running sequence for sliding-window
//! layers. Keys and values are stored in the profile's KV dtype.

use std::sync::Arc;

use super::BackendError;
use crate::backend::KvLayout;
use crate::plan::ledger::{Category, Charge, KV_CACHE, Ledger};
use crate::plan::profile::KvCacheDtype;
use crate::step::StepBatch;

/// K or V storage of one layer: `[slots, kv_heads × head_dim]`.
pub(crate) enum KvData {
    F32(Vec<f32>),
    Bf16(Vec<u16>),
}

impl KvData {
    fn zeroed(dtype: KvCacheDtype, elements: usize) -> KvData {
        match dtype {
            KvCacheDtype::F32 => KvData::F32(vec![0.0; elements]),
            KvCacheDtype::Bf16 => KvData::Bf16(vec![0; elements]),
        }
    }

    fn bytes(&self) -> u64 {
        let bytes = match self {
            KvData::F32(d) => std::mem::size_of_val(d.as_slice()),
            KvData::Bf16(d) => std::mem::size_of_val(d.as_slice()),
        };
        bytes as u64
    }

    fn write(&mut self, start: usize, values: &[f32]) {
        match self {
            KvData::F32(d) => d[start..start + values.len()].copy_from_slice(values),
            KvData::Bf16(d) => {
                for (dst, &v) in d[start..start + values.len()].iter_mut().zip(values) {
                    *dst = half::bf16::from_f32(v).to_bits();
                }
            }
        }
    }
}

/// Where a layer keeps its past.
pub(crate) enum LayerStore {
    /// Slot of position `p` = `table[p / block] × block + p % block`.
    Paged { k: KvData, v: KvData },
    /// Slot of position `p` = `ring_slot × window + p % window`.
    Ring { k: KvData, v: KvData, window: usize },
}

pub struct CpuKvCache {
    pub(crate) layers: Vec<LayerStore>,
    pub(crate) block_size: usize,
    pub(crate) width: usize,
    pub(crate) dtype: KvCacheDtype,
    _charge: Charge,
}

impl CpuKvCache {
    /// Allocates `layers` layers exactly as the plan's `layout` lists them
    /// and charges what it allocates to the plan's `kv_cache`.
    pub(crate) fn allocate(
        layout: &KvLayout,
        layers: usize,
        ledger: &Arc<Ledger>,
    ) -> Result<CpuKvCache, BackendError> {
        // Charge first: nothing is allocated unless the plan has room.
        let charge = ledger.charge(Category::KvCache, layout.bytes(layers), KV_CACHE)?;
        let layers = (0..layers)
            .map(|layer| {
                let elements = layout.layer_elements(layer);
                let (k, v) = (
                    KvData::zeroed(layout.dtype, elements),
                    KvData::zeroed(layout.dtype, elements),
                );
                if layout.is_sliding(layer) {
                    LayerStore::Ring {
                        k,
                        v,
                        window: layout.window,
                    }
                } else {
                    LayerStore::Paged { k, v }
                }
            })
            .collect();
        Ok(CpuKvCache {
            layers,
            block_size: layout.block_size,
            width: layout.width(),
            dtype: layout.dtype,
            _charge: charge,
        })
    }

    /// Bytes the cache's K and V stores hold (tests compare it with the plan).
    pub fn allocated_bytes(&self) -> u64 {
        self.layers
            .iter()
            .map(|layer| match layer {
                LayerStore::Paged { k, v } | LayerStore::Ring { k, v, .. } => k.bytes() + v.bytes(),
            })
            .sum()
    }

    /// Cache slot of `position` of sequence `seq` of `batch` in layer `layer`.
    pub(crate) fn slot(
        &self,
        layer: usize,
        batch: &StepBatch,
        seq: usize,
        position: usize,
    ) -> usize {
        match &self.layers[layer] {
            LayerStore::Paged { .. } => {
                let table = batch.table(seq);
                table[position / self.block_size] as usize * self.block_size
                    + position % self.block_size
            }
            LayerStore::Ring { window, .. } => {
                batch.seqs[seq].ring_slot as usize * window + position % window
            }
        }
    }

    /// Writes the step's keys and values (rows of `width`) into the cache.
    pub(crate) fn append(
        &mut self,
        layer: usize,
        k: &[f32],
        v: &[f32],
        batch: &StepBatch,
    ) -> Result<(), BackendError> {
        let width = self.width;
        if layer >= self.layers.len() {
            return Err(BackendError::Shape(format!("no KV layer {layer}")));
        }
        for (s, chunk) in batch.seqs.iter().enumerate() {
            let blocks = batch.table(s).len();
            for (i, row) in chunk.rows().enumerate() {
                let position = chunk.past as usize + i;
                if matches!(self.layers[layer], LayerStore::Paged { .. })
                    && position / self.block_size >= blocks
                {
                    return Err(BackendError::Shape(format!(
                        "position {position} is beyond the sequence's {blocks} KV blocks"
                    )));
                }
                let slot = self.slot(layer, batch, s, position);
                let (kd, vd) = match &mut self.layers[layer] {
                    LayerStore::Paged { k, v } | LayerStore::Ring { k, v, .. } => (k, v),
                };
                kd.write(slot * width, &k[row * width..(row + 1) * width]);
                vd.write(slot * width, &v[row * width..(row + 1) * width]);
            }
        }
        Ok(())
    }

    /// Rounds values, in place, to what the cache would store.
    pub(crate) fn round_in_place(&self, values: &mut [f32]) {
        if self.dtype == KvCacheDtype::Bf16 {
            for x in values {
                *x = half::bf16::from_f32(*x).to_f32();
            }
        }
    }
}
