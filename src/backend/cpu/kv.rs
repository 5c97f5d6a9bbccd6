//! The KV cache on the host: the plan's pool of blocks, one array per
//! `KvLayout::array_of` index, shared by a full-attention and a
//! sliding-window layer (each reads its own table of the step). Keys and
//! values are stored in the profile's KV dtype: f32, bf16, or FP8 E4M3
//! bytes of `x / scale` with the layer's K or V scale (a block belongs to
//! one layer of an array at a time, so each layer's blocks carry its own
//! scale).

use std::sync::Arc;

use crate::backend::error::BackendError;
use crate::checkpoint::kv_scales::{KvScale, KvScales};
use crate::formats::{E4M3, f32_to_e4m3};
use crate::plan::ledger::{Category, Charge, KV_CACHE, Ledger};
use crate::plan::memory::KvLayout;
use crate::plan::profile::KvCacheDtype;
use crate::step::{NO_BLOCK, StepBatch};

/// K or V storage of one layer: `[slots, kv_heads × head_dim]`.
pub(crate) enum KvData {
    F32(Vec<f32>),
    Bf16(Vec<u16>),
    /// E4M3 bytes; a value is `e4m3 × scale`.
    Fp8(Vec<u8>),
}

impl KvData {
    fn zeroed(dtype: KvCacheDtype, elements: usize) -> KvData {
        match dtype {
            KvCacheDtype::F32 => KvData::F32(vec![0.0; elements]),
            KvCacheDtype::Bf16 => KvData::Bf16(vec![0; elements]),
            KvCacheDtype::Fp8 => KvData::Fp8(vec![0; elements]),
        }
    }

    fn bytes(&self) -> u64 {
        let bytes = match self {
            KvData::F32(d) => std::mem::size_of_val(d.as_slice()),
            KvData::Bf16(d) => std::mem::size_of_val(d.as_slice()),
            KvData::Fp8(d) => std::mem::size_of_val(d.as_slice()),
        };
        bytes as u64
    }

    /// Stores `values` from element `start`; FP8 divides by `scale` first.
    fn write(&mut self, start: usize, values: &[f32], scale: f32) {
        match self {
            KvData::F32(d) => d[start..start + values.len()].copy_from_slice(values),
            KvData::Bf16(d) => {
                for (dst, &v) in d[start..start + values.len()].iter_mut().zip(values) {
                    *dst = half::bf16::from_f32(v).to_bits();
                }
            }
            KvData::Fp8(d) => {
                for (dst, &v) in d[start..start + values.len()].iter_mut().zip(values) {
                    *dst = f32_to_e4m3(v / scale);
                }
            }
        }
    }

    /// Row `at..at + dst.len()` as f32: copied, widened from bf16, or
    /// decoded from E4M3 and multiplied by `scale`.
    #[inline]
    pub(crate) fn read_row(&self, at: usize, scale: f32, dst: &mut [f32]) {
        let end = at + dst.len();
        match self {
            KvData::F32(d) => dst.copy_from_slice(&d[at..end]),
            KvData::Bf16(d) => super::kernels::ops::bf16_to_f32_row(&d[at..end], dst),
            KvData::Fp8(d) => {
                for (x, &byte) in dst.iter_mut().zip(&d[at..end]) {
                    *x = E4M3[usize::from(byte)] * scale;
                }
            }
        }
    }
}

/// The K and V of one pool array: `[blocks × block_size, width]` each.
pub(crate) struct KvArray {
    pub(crate) k: KvData,
    pub(crate) v: KvData,
}

pub struct CpuKvCache {
    pub(crate) arrays: Vec<KvArray>,
    /// Per layer: its array and whether it reads the sliding-window table.
    pub(crate) layers: Vec<(usize, bool)>,
    pub(crate) block_size: usize,
    /// Blocks of each array.
    blocks: usize,
    pub(crate) width: usize,
    pub(crate) dtype: KvCacheDtype,
    /// Per layer: the FP8 scales (1.0 and unused for other dtypes).
    scales: Vec<KvScale>,
    _charge: Charge,
}

impl CpuKvCache {
    /// Allocates the pool of `layers` layers exactly as the plan's `layout`
    /// lists it and charges what it allocates to the plan's `kv_cache`; an
    /// FP8 pool quantizes layer `l` with `scales.layers[l]`.
    pub(crate) fn allocate(
        layout: &KvLayout,
        layers: usize,
        scales: &KvScales,
        ledger: &Arc<Ledger>,
    ) -> Result<CpuKvCache, BackendError> {
        if scales.layers.len() != layers {
            return Err(BackendError::Shape(format!(
                "{} KV scales for {layers} KV layers",
                scales.layers.len()
            )));
        }
        // Charge first: nothing is allocated unless the plan has room.
        let charge = ledger.charge(Category::KvCache, layout.bytes(layers), KV_CACHE)?;
        let elements = layout.array_elements();
        let arrays = (0..layout.arrays(layers))
            .map(|_| KvArray {
                k: KvData::zeroed(layout.dtype, elements),
                v: KvData::zeroed(layout.dtype, elements),
            })
            .collect();
        Ok(CpuKvCache {
            arrays,
            layers: (0..layers)
                .map(|l| (layout.array_of(l), layout.is_sliding(l)))
                .collect(),
            block_size: layout.block_size,
            blocks: layout.blocks,
            width: layout.width(),
            dtype: layout.dtype,
            scales: scales.layers.clone(),
            _charge: charge,
        })
    }

    /// Bytes the cache's K and V stores hold (tests compare it with the plan).
    pub fn allocated_bytes(&self) -> u64 {
        self.arrays.iter().map(|a| a.k.bytes() + a.v.bytes()).sum()
    }

    /// The K and V scales of `layer` (1.0 when it has none).
    pub(crate) fn scale(&self, layer: usize) -> KvScale {
        self.scales.get(layer).copied().unwrap_or(KvScale::UNIT)
    }

    /// The array of `layer` and whether it is a sliding-window layer.
    pub(crate) fn layer(&self, layer: usize) -> Result<(&KvArray, bool), BackendError> {
        let &(array, sliding) = self
            .layers
            .get(layer)
            .ok_or_else(|| BackendError::Shape(format!("no KV layer {layer}")))?;
        let array = self
            .arrays
            .get(array)
            .ok_or_else(|| BackendError::Shape(format!("no KV array for layer {layer}")))?;
        Ok((array, sliding))
    }

    /// Cache slot of `position` of sequence `seq` of `batch` in the table
    /// `sliding` picks; `None` where the table holds no block for it.
    pub(crate) fn slot(
        &self,
        batch: &StepBatch,
        seq: usize,
        sliding: bool,
        position: usize,
    ) -> Option<usize> {
        slot_of(
            batch.table_for(seq, sliding),
            position,
            self.block_size,
            self.blocks,
        )
    }

    /// Writes the step's keys and values (rows of `width`) into the cache.
    pub(crate) fn append(
        &mut self,
        layer: usize,
        k: &[f32],
        v: &[f32],
        batch: &StepBatch,
    ) -> Result<(), BackendError> {
        let (width, block_size, blocks) = (self.width, self.block_size, self.blocks);
        let (_, sliding) = self.layer(layer)?;
        let scale = self.scale(layer);
        let store = &mut self.arrays[self.layers[layer].0];
        for (s, chunk) in batch.seqs.iter().enumerate() {
            let table = batch.table_for(s, sliding);
            for (i, row) in chunk.rows().enumerate() {
                let position = chunk.past as usize + i;
                let slot = slot_of(table, position, block_size, blocks).ok_or_else(|| {
                    BackendError::Shape(format!(
                        "position {position} has no KV block in the sequence's {} table",
                        if sliding { "sliding-window" } else { "block" }
                    ))
                })?;
                store
                    .k
                    .write(slot * width, &k[row * width..(row + 1) * width], scale.k);
                store
                    .v
                    .write(slot * width, &v[row * width..(row + 1) * width], scale.v);
            }
        }
        Ok(())
    }

    /// Copies block `from` onto block `to` in every array, for each pair.
    pub(crate) fn copy_blocks(&mut self, pairs: &[(u32, u32)]) -> Result<(), BackendError> {
        let blocks = self.blocks;
        let span = self.block_size * self.width;
        for &(from, to) in pairs {
            if from as usize >= blocks || to as usize >= blocks || from == to {
                return Err(BackendError::Shape(format!(
                    "cannot copy KV block {from} onto block {to} of {blocks}"
                )));
            }
            let (src, dst) = (from as usize * span, to as usize * span);
            for array in &mut self.arrays {
                for data in [&mut array.k, &mut array.v] {
                    match data {
                        KvData::F32(d) => d.copy_within(src..src + span, dst),
                        KvData::Bf16(d) => d.copy_within(src..src + span, dst),
                        KvData::Fp8(d) => d.copy_within(src..src + span, dst),
                    }
                }
            }
        }
        Ok(())
    }

    /// Rounds values, in place, to what the cache would store and give
    /// back for them with `scale` (FP8): the same operations as
    /// [`KvData::write`] then [`KvData::read_row`], so a key read from the
    /// step and later from the cache has the same bits.
    pub(crate) fn round_in_place(&self, values: &mut [f32], scale: f32) {
        match self.dtype {
            KvCacheDtype::F32 => {}
            KvCacheDtype::Bf16 => {
                for x in values {
                    *x = half::bf16::from_f32(*x).to_f32();
                }
            }
            KvCacheDtype::Fp8 => {
                for x in values {
                    *x = E4M3[usize::from(f32_to_e4m3(*x / scale))] * scale;
                }
            }
        }
    }
}

/// The slot of `position` through `table` in arrays of `blocks` blocks of
/// `block_size`; `None` where the table holds no block for it.
fn slot_of(table: &[u32], position: usize, block_size: usize, blocks: usize) -> Option<usize> {
    let block = *table.get(position / block_size)?;
    (block != NO_BLOCK && (block as usize) < blocks)
        .then(|| block as usize * block_size + position % block_size)
}
