//! The CUDA backend's allocations, each made once and charged to the
//! ledger: activation buffers (the logits in host-mapped memory, which the
//! host reads after one sync without a copy), the step metadata, the KV
//! cache (one allocation, every layer inside) and the MoE workspace.

use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use super::constants::{SEQ_FIELDS, SEQ_LEN, SEQ_PAST, SEQ_SLIDING, SEQ_START, SEQ_TABLE};
use super::driver::{Device, DeviceMemory, HostMapped};
use crate::backend::charges::charge_workspace_buffer;
use crate::backend::error::BackendError;
use crate::plan::ledger::{Category, Charge, KV_CACHE, Ledger};
use crate::plan::memory::{
    ACTIVATION_BYTES, ATTENTION_PARTIALS, KvLayout, MoeWorkspace as MoeWorkspacePlan, Placement,
    ROUTE_COUNTER, STEP_METADATA, StepMetadataPlan,
};
use crate::plan::profile::KvCacheDtype;
use crate::step::{NO_BLOCK, StepBatch};

#[derive(Debug)]
enum Memory {
    Device(DeviceMemory),
    Host(HostMapped),
}

/// An f32 buffer in device memory, or host-mapped where the plan says
/// (`Placement`).
#[derive(Debug)]
pub struct CudaBuffer {
    memory: Memory,
    elements: usize,
    _charge: Charge,
}

impl CudaBuffer {
    pub(crate) fn allocate(
        device: &Arc<Device>,
        charge: Charge,
        elements: usize,
        placement: Placement,
    ) -> Result<CudaBuffer, BackendError> {
        let bytes = elements * ACTIVATION_BYTES as usize;
        let memory = match placement {
            Placement::HostMapped => Memory::Host(HostMapped::zeroed(device, bytes)?),
            Placement::Device => Memory::Device(DeviceMemory::zeroed(device, bytes)?),
        };
        Ok(CudaBuffer {
            memory,
            elements,
            _charge: charge,
        })
    }

    pub fn len(&self) -> usize {
        self.elements
    }

    pub fn is_empty(&self) -> bool {
        self.elements == 0
    }

    pub(crate) fn ptr(&self) -> u64 {
        match &self.memory {
            Memory::Device(m) => m.ptr(),
            Memory::Host(m) => m.device_ptr(),
        }
    }

    /// Address of element `index`.
    pub(crate) fn at(&self, index: usize) -> u64 {
        self.ptr() + ACTIVATION_BYTES * index as u64
    }

    /// Copies `values` into the buffer (tests and set-up; not in a step).
    pub fn upload(&self, values: &[f32]) -> Result<(), BackendError> {
        check("upload", values.len(), self.elements)?;
        match &self.memory {
            Memory::Device(m) => Ok(m.upload(values)?),
            Memory::Host(_) => Err(BackendError::Shape(
                "host-mapped buffers are written by the device only".to_string(),
            )),
        }
    }

    /// Hands the first `n` values to `f` after the stream has finished.
    pub(crate) fn read(&self, n: usize, f: &mut dyn FnMut(&[f32])) -> Result<(), BackendError> {
        check("read", n, self.elements)?;
        match &self.memory {
            Memory::Host(m) => f(m.read_f32(n)?),
            Memory::Device(m) => {
                // Only tests read device buffers: a temporary copy.
                let mut values = vec![0f32; n];
                m.download(&mut values)?;
                f(&values);
            }
        }
        Ok(())
    }
}

pub(crate) fn check(
    what: &'static str,
    needed: usize,
    capacity: usize,
) -> Result<(), BackendError> {
    BackendError::check_capacity(what, needed, capacity)
}

/// The step's metadata in device memory (`kernels/common.cuh`, StepView),
/// u32 words, `T` tokens, `S` sequences, `B` blocks per sequence at most:
/// `[tokens: T][logit rows: T][5 fields × S][full tables: S × B][sliding
/// tables: S × B]` (the plan's `2T + S(2B + 5)` words). A sequence's fields
/// are its start row, length, past, sliding-table start and full-table
/// start, both table starts counted from the first full-table word (the
/// sliding one is `S × B + SeqChunk::sliding_start`). Also what the host
/// needs to size launches and check bounds.
#[derive(Debug)]
pub struct CudaStep {
    pub(crate) memory: DeviceMemory,
    staging: Vec<u32>,
    pub(crate) max_tokens: usize,
    pub(crate) max_seqs: usize,
    max_table_entries: usize,
    pub(crate) rows: usize,
    pub(crate) num_seqs: usize,
    pub(crate) logit_rows: Vec<u32>,
    pub(crate) tokens: Vec<u32>,
    /// Query tiles of the attention kernel: Σ ⌈len / Q_TILE⌉.
    pub(crate) tiles: u32,
    /// Largest `past + len` of a sequence.
    pub(crate) max_context: usize,
    /// Every sequence has one row (a decode step).
    pub(crate) decode_only: bool,
    /// Largest block id of the full tables, and of the sliding tables
    /// (their NO_BLOCK entries aside).
    pub(crate) max_block: Option<u32>,
    pub(crate) max_sliding_block: Option<u32>,
    /// The step has sliding-window tables.
    pub(crate) sliding_tables: bool,
    /// Largest block size for which no chunk position (`past..past+len`,
    /// what the append writes) falls in a NO_BLOCK entry of its sliding
    /// table: `min ⌊past / (i + 1)⌋` over each table's last NO_BLOCK index `i`.
    pub(crate) sliding_max_block_size: usize,
    /// Smallest block size the tables are valid for: ⌈(past+len) / table_len⌉.
    pub(crate) needed_block_size: usize,
    /// Incremented by each `load_step`.
    pub(crate) serial: u64,
    _charge: Charge,
}

impl CudaStep {
    /// The plan's step metadata: its words in device memory and a host
    /// staging copy.
    pub(crate) fn allocate(
        device: &Arc<Device>,
        ledger: &Arc<Ledger>,
        plan: &StepMetadataPlan,
    ) -> Result<CudaStep, BackendError> {
        let bytes = usize::try_from(plan.bytes)
            .map_err(|_| BackendError::Shape("the step metadata is too large".to_string()))?;
        let charge = ledger.charge(Category::Activations, plan.bytes, STEP_METADATA)?;
        Ok(CudaStep {
            memory: DeviceMemory::zeroed(device, bytes)?,
            staging: vec![0; plan.words],
            max_tokens: plan.max_tokens,
            max_seqs: plan.max_seqs,
            max_table_entries: plan.max_seqs * plan.max_blocks_per_seq,
            rows: 0,
            num_seqs: 0,
            logit_rows: Vec::with_capacity(plan.max_tokens),
            tokens: Vec::with_capacity(plan.max_tokens),
            tiles: 0,
            max_context: 0,
            decode_only: true,
            max_block: None,
            max_sliding_block: None,
            sliding_tables: false,
            sliding_max_block_size: usize::MAX,
            needed_block_size: 0,
            serial: 0,
            _charge: charge,
        })
    }

    pub(crate) fn meta(&self) -> u64 {
        self.memory.ptr()
    }

    /// Copies `batch` to the device (five small asynchronous copies).
    pub(crate) fn load(&mut self, batch: &StepBatch, q_tile: usize) -> Result<(), BackendError> {
        let (t, s) = (self.max_tokens, self.max_seqs);
        check("step tokens", batch.tokens.len(), t)?;
        check("step sequences", batch.seqs.len(), s)?;
        check("logit rows", batch.logit_rows.len(), t)?;
        check(
            "block tables",
            batch.block_tables.len(),
            self.max_table_entries,
        )?;
        check(
            "sliding-window tables",
            batch.sliding_block_tables.len(),
            self.max_table_entries,
        )?;
        if batch.positions.len() != batch.tokens.len() {
            return Err(BackendError::Shape("a position per token".to_string()));
        }
        let rows = batch.tokens.len();
        let mut expected_start = 0u32;
        self.tiles = 0;
        self.max_context = 0;
        self.decode_only = true;
        self.max_block = batch.block_tables.iter().copied().max();
        self.max_sliding_block = batch
            .sliding_block_tables
            .iter()
            .copied()
            .filter(|&b| b != NO_BLOCK)
            .max();
        self.sliding_tables = !batch.sliding_block_tables.is_empty();
        self.sliding_max_block_size = usize::MAX;
        self.needed_block_size = 0;
        let seq_base = 2 * t;
        // Both table starts count from the first full-table word.
        let sliding_base = u32::try_from(self.max_table_entries)
            .map_err(|_| BackendError::Shape("the block tables are too large".to_string()))?;
        for (i, c) in batch.seqs.iter().enumerate() {
            // The kernels find a row's sequence by its start: packed in order.
            if c.start != expected_start || c.len == 0 {
                return Err(BackendError::Shape(
                    "sequences must be packed in row order, none empty".to_string(),
                ));
            }
            expected_start += c.len;
            let positions = batch
                .positions
                .get(c.start as usize..expected_start as usize)
                .ok_or_else(|| BackendError::Shape("sequences past the step's rows".to_string()))?;
            if positions
                .iter()
                .zip(c.past..)
                .any(|(&p, expected)| p != expected)
            {
                return Err(BackendError::Shape(
                    "a sequence's positions must follow its cached tokens".to_string(),
                ));
            }
            let end = c.table_start as usize + c.table_len as usize;
            check("block table", end, batch.block_tables.len())?;
            if self.sliding_tables {
                let start = c.sliding_start as usize;
                let end = start + c.table_len as usize;
                check(
                    "sliding-window table",
                    end,
                    batch.sliding_block_tables.len(),
                )?;
                if let Some(i) = batch.sliding_block_tables[start..end]
                    .iter()
                    .rposition(|&b| b == NO_BLOCK)
                {
                    self.sliding_max_block_size =
                        self.sliding_max_block_size.min(c.past as usize / (i + 1));
                }
            }
            let context = c.past as usize + c.len as usize;
            if c.table_len > 0 {
                self.needed_block_size = self
                    .needed_block_size
                    .max(context.div_ceil(c.table_len as usize));
            } else {
                self.needed_block_size = usize::MAX;
            }
            self.tiles += c.len.div_ceil(q_tile as u32);
            self.max_context = self.max_context.max(context);
            self.decode_only &= c.len == 1;
            let at = seq_base + SEQ_FIELDS * i;
            let fields = &mut self.staging[at..at + SEQ_FIELDS];
            fields[SEQ_START] = c.start;
            fields[SEQ_LEN] = c.len;
            fields[SEQ_PAST] = c.past;
            fields[SEQ_SLIDING] = sliding_base.checked_add(c.sliding_start).ok_or_else(|| {
                BackendError::Shape("a sliding-window table start overflows".to_string())
            })?;
            fields[SEQ_TABLE] = c.table_start;
        }
        if expected_start as usize != rows {
            return Err(BackendError::Shape(format!(
                "the sequences cover {expected_start} rows of {rows}"
            )));
        }
        if batch.logit_rows.windows(2).any(|w| w[0] >= w[1])
            || batch.logit_rows.last().is_some_and(|&r| r as usize >= rows)
        {
            return Err(BackendError::Shape(
                "logit rows must ascend and lie in the step".to_string(),
            ));
        }
        self.staging[..rows].copy_from_slice(&batch.tokens);
        self.staging[t..t + batch.logit_rows.len()].copy_from_slice(&batch.logit_rows);
        let tables = seq_base + SEQ_FIELDS * s;
        self.staging[tables..tables + batch.block_tables.len()]
            .copy_from_slice(&batch.block_tables);
        let sliding = tables + self.max_table_entries;
        let n_sliding = batch.sliding_block_tables.len();
        self.staging[sliding..sliding + n_sliding].copy_from_slice(&batch.sliding_block_tables);

        let n_seq = SEQ_FIELDS * batch.seqs.len();
        self.memory.upload_at(0, &self.staging[..rows])?;
        self.memory
            .upload_at(4 * t, &self.staging[t..t + batch.logit_rows.len()])?;
        self.memory
            .upload_at(4 * seq_base, &self.staging[seq_base..seq_base + n_seq])?;
        self.memory.upload_at(
            4 * tables,
            &self.staging[tables..tables + batch.block_tables.len()],
        )?;
        self.memory
            .upload_at(4 * sliding, &self.staging[sliding..sliding + n_sliding])?;
        self.rows = rows;
        self.num_seqs = batch.seqs.len();
        self.logit_rows.clear();
        self.logit_rows.extend_from_slice(&batch.logit_rows);
        self.tokens.clear();
        self.tokens.extend_from_slice(&batch.tokens);
        self.serial += 1;
        Ok(())
    }
}

/// One layer's K and V storage inside the cache allocation.
#[derive(Clone, Copy, Debug)]
pub(crate) struct KvLayer {
    pub k: u64,
    pub v: u64,
    /// Reads the sliding-window tables.
    pub sliding: bool,
}

/// The plan's KV pool in one device allocation, in the profile's KV dtype
/// (`KvLayout`): `arrays` arrays of `blocks × block_size` slots, each its K
/// then its V; layer `l` uses array `layout.array_of(l)` through its
/// sequences' full or sliding-window tables (as the CPU's).
#[derive(Debug)]
pub struct CudaKvCache {
    memory: DeviceMemory,
    pub(crate) layers: Vec<KvLayer>,
    pub(crate) arrays: usize,
    /// Bytes of one array's K and V together.
    pub(crate) array_bytes: u64,
    pub(crate) block_size: usize,
    pub(crate) blocks: usize,
    pub(crate) width: usize,
    pub(crate) bf16: bool,
    /// `serial · 2^16 + layer + 1` of the last layer whose new keys the
    /// attention kernel already wrote (so kv_append skips it).
    pub(crate) appended: AtomicU64,
    _charge: Charge,
}

impl CudaKvCache {
    /// Allocates the pool of `layers` layers exactly as the plan's `layout`
    /// lists it, one allocation.
    pub(crate) fn allocate(
        device: &Arc<Device>,
        ledger: &Arc<Ledger>,
        layout: &KvLayout,
        layers: usize,
    ) -> Result<CudaKvCache, BackendError> {
        let total = layout.bytes(layers);
        let bytes = usize::try_from(total)
            .map_err(|_| BackendError::Shape("the KV cache is too large".to_string()))?;
        // Charge first: nothing is allocated unless the plan has room.
        let charge = ledger.charge(Category::KvCache, total, KV_CACHE)?;
        let memory = DeviceMemory::zeroed(device, bytes)?;
        let base = memory.ptr();
        let layers = (0..layers)
            .map(|layer| {
                let k = base + layout.array_of(layer) as u64 * layout.array_bytes();
                KvLayer {
                    k,
                    v: k + layout.array_bytes() / 2,
                    sliding: layout.is_sliding(layer),
                }
            })
            .collect::<Vec<_>>();
        Ok(CudaKvCache {
            memory,
            arrays: layout.arrays(layers.len()),
            array_bytes: layout.array_bytes(),
            layers,
            block_size: layout.block_size,
            blocks: layout.blocks,
            width: layout.width(),
            bf16: layout.dtype == KvCacheDtype::Bf16,
            appended: AtomicU64::new(0),
            _charge: charge,
        })
    }

    /// Start of the pool (array 0's K).
    pub(crate) fn base(&self) -> u64 {
        self.memory.ptr()
    }

    pub(crate) fn marker(layer: usize, serial: u64) -> u64 {
        (serial << 16) + layer as u64 + 1
    }

    /// Checks that `step`'s tables and positions fit this cache: every
    /// position within its table, every block id of both tables in the pool
    /// (NO_BLOCK only in sliding tables), and for a sliding layer a sliding
    /// table with a block for each position the step appends.
    pub(crate) fn check_step(&self, layer: &KvLayer, step: &CudaStep) -> Result<(), BackendError> {
        if step.needed_block_size > self.block_size {
            return Err(BackendError::Shape(
                "a position is beyond its sequence's KV blocks".to_string(),
            ));
        }
        for (what, max) in [
            ("KV block", step.max_block),
            ("sliding-window KV block", step.max_sliding_block),
        ] {
            if let Some(b) = max.filter(|&b| b as usize >= self.blocks) {
                return Err(BackendError::Shape(format!(
                    "{what} {b} of {}",
                    self.blocks
                )));
            }
        }
        if layer.sliding && step.num_seqs > 0 {
            if !step.sliding_tables {
                return Err(BackendError::Shape(
                    "a sliding-window layer in a step without sliding-window tables".to_string(),
                ));
            }
            if self.block_size > step.sliding_max_block_size {
                return Err(BackendError::Shape(
                    "a position of the step has no block in its sliding-window table".to_string(),
                ));
            }
        }
        Ok(())
    }
}

/// One planned workspace buffer.
#[derive(Debug)]
pub(crate) struct WorkspaceBuffer {
    pub memory: DeviceMemory,
    /// 4-byte elements.
    pub elements: usize,
}

impl WorkspaceBuffer {
    pub fn ptr(&self) -> u64 {
        self.memory.ptr()
    }
}

/// The MoE workspace: exactly the plan's CUDA buffers (`plan::memory::
/// moe_workspace`), with the attention's split partials (attention and the
/// experts never run at the same time) and the route kernel's completion
/// counter.
#[derive(Debug)]
pub struct CudaWorkspace {
    pub(crate) topk_ids: WorkspaceBuffer,
    pub(crate) topk_weights: WorkspaceBuffer,
    pub(crate) expert_offsets: WorkspaceBuffer,
    pub(crate) sorted_rows: WorkspaceBuffer,
    pub(crate) attention_partials: WorkspaceBuffer,
    pub(crate) route_counter: WorkspaceBuffer,
    pub(crate) activation: WorkspaceBuffer,
    pub(crate) down_output: WorkspaceBuffer,
    /// Rows routed by the last `route`, its k and its number of experts.
    pub(crate) routed: usize,
    pub(crate) top_k: usize,
    pub(crate) experts: usize,
    _charges: Vec<Charge>,
}

impl CudaWorkspace {
    pub(crate) fn allocate(
        device: &Arc<Device>,
        ledger: &Arc<Ledger>,
        plan: &MoeWorkspacePlan,
    ) -> Result<CudaWorkspace, BackendError> {
        let mut charges = Vec::new();
        let mut buffer = |name: &str| -> Result<WorkspaceBuffer, BackendError> {
            let (bytes, charge) = charge_workspace_buffer(plan, ledger, name)?;
            charges.push(charge);
            Ok(WorkspaceBuffer {
                memory: DeviceMemory::zeroed(device, bytes)?,
                elements: bytes / 4,
            })
        };
        let ws = CudaWorkspace {
            topk_ids: buffer("topk_ids")?,
            topk_weights: buffer("topk_weights")?,
            expert_offsets: buffer("expert_offsets")?,
            sorted_rows: buffer("sorted_rows")?,
            attention_partials: buffer(ATTENTION_PARTIALS)?,
            route_counter: buffer(ROUTE_COUNTER)?,
            activation: buffer("activation")?,
            down_output: buffer("down_output")?,
            routed: 0,
            top_k: 0,
            experts: 0,
            _charges: Vec::new(),
        };
        if ws.route_counter.elements == 0 {
            return Err(BackendError::Shape(
                "the MoE workspace has no room for the route counter".to_string(),
            ));
        }
        Ok(CudaWorkspace {
            _charges: charges,
            ..ws
        })
    }

    /// The route kernel's completion counter (zero between launches).
    pub(crate) fn counter(&self) -> u64 {
        self.route_counter.ptr()
    }
}
