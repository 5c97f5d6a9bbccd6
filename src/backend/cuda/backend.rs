//! The CUDA backend's state: the device, its kernels, the attached
//! weights, and the helpers every op launches through.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use super::constants::{
    BLOCK_THREADS, FMT_BF16, FMT_F32, FMT_MXFP4, FMT_NVFP4, KEY_TILE, MAX_HEAD_DIM, MXFP4_GROUP,
    NVFP4_GROUP, WARP,
};
use super::driver::{self, Device, DeviceMemory, guarded};
use super::error::CudaError;
use super::kernels::{Kernel, Kernels};
use super::memory::{CudaBuffer, check};
use super::options::{CudaOptions, MatmulPath, TENSOR_CORE_MIN_ROWS};
use super::weights::{self, WeightsPolicy};
use super::{cache, params as p};
use crate::backend::error::BackendError;
use crate::checkpoint::linear::{LinearWeight, WeightData};
use crate::host::gpu::GpuInfo;
use crate::plan::ledger::{Ledger, WeightsResidency};

pub struct CudaBackend {
    pub(super) device: Arc<Device>,
    pub(super) kernels: Kernels,
    pub(super) ledger: Arc<Ledger>,
    pub(super) weights: weights::WeightStore,
    /// Keys per attention split, 0 = chosen per step (tests force splits).
    pub(super) split_len: AtomicU32,
    /// Dynamic shared memory the attention kernel may use.
    pub(super) attention_shared: u32,
    /// `mma.sync` BF16 exists (sm_80 and newer).
    pub(super) tensor_cores: bool,
    /// A [`MatmulPath`] forced by tests (0 = auto, 1 = GEMV, 2 = tensor cores).
    pub(super) matmul_path: AtomicU32,
}

impl std::fmt::Debug for CudaBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaBackend")
            .field("device", &self.device.info)
            .finish_non_exhaustive()
    }
}

impl CudaBackend {
    /// `a[i] = f(a[i], b[i])` for the first `n` elements (an elementwise
    /// kernel over a pair of buffers).
    pub(super) fn pair_op(
        &self,
        kernel: Kernel,
        what: &'static str,
        a: &mut CudaBuffer,
        b: &CudaBuffer,
        n: usize,
    ) -> Result<(), BackendError> {
        self.device.bind()?;
        check(what, n, a.len().min(b.len()))?;
        let params = p::PairParams {
            a: a.ptr(),
            b: b.ptr(),
            n: n as u64,
        };
        self.launch(kernel, (stride_blocks(n), 1, 1), BLOCK_THREADS, 0, &params)
    }

    /// Opens the device, loads (or compiles) every kernel and checks that
    /// the driver functions the backend uses are all there.
    pub fn new(ledger: Arc<Ledger>, options: &CudaOptions) -> Result<CudaBackend, CudaError> {
        let device = Device::open(options.ordinal)?;
        guarded("starting the CUDA backend", || {
            let cache = cache::CubinCache::new(cache::cache_dir(options.cache_dir.as_deref()));
            let kernels = Kernels::load(&device, &cache)?;
            for (file, origin) in &kernels.origins {
                tracing::debug!("kernels/{file}: {origin}");
            }
            let wanted = p::attention_shared_bytes(MAX_HEAD_DIM as u32);
            let attention_shared = wanted.min(device.shared_optin_bytes.max(48 << 10));
            kernels.allow_shared(Kernel::Attention, attention_shared)?;
            let backend = CudaBackend {
                device: Arc::clone(&device),
                kernels,
                ledger,
                weights: weights::WeightStore::default(),
                split_len: AtomicU32::new(0),
                attention_shared,
                tensor_cores: device.info.compute_capability.0 >= 8,
                matmul_path: AtomicU32::new(0),
            };
            backend.smoke_test()?;
            Ok(backend)
        })
    }

    /// One launch, copy and host-mapped allocation: every driver entry the
    /// backend uses is resolved here, where a missing one is caught.
    fn smoke_test(&self) -> Result<(), CudaError> {
        let mapped = driver::HostMapped::zeroed(&self.device, 16)?;
        // 4 bytes for the test's life only: not a plan buffer.
        let probe = DeviceMemory::zeroed(&self.device, 4)?;
        probe.upload(&[0u32])?;
        let params = p::PairParams {
            a: mapped.device_ptr(),
            b: probe.ptr(),
            n: 1,
        };
        self.kernels
            .launch(Kernel::Add, (1, 1, 1), WARP, 0, &params)?;
        let mut back = [0u32; 1];
        probe.download(&mut back)?;
        let sum = mapped.read_f32(1)?;
        if sum[0] != 0.0 {
            return Err(CudaError::Unavailable(format!(
                "the device computed 0 + 0 = {}",
                sum[0]
            )));
        }
        Ok(())
    }

    pub fn info(&self) -> &GpuInfo {
        &self.device.info
    }

    pub fn ledger(&self) -> &Arc<Ledger> {
        &self.ledger
    }

    /// The device's theoretical memory bandwidth, bytes/s, when known.
    pub fn peak_bandwidth(&self) -> Option<f64> {
        self.device.peak_bandwidth
    }

    /// Makes the host byte ranges every weight lies in readable by the
    /// device (see [`WeightsPolicy`]), charging them to the ledger's
    /// weights, and records where they live. Called once, before any
    /// [`Backend::linear`](crate::backend::Backend::linear). The ranges must outlive the backend.
    pub fn attach_weights(
        &mut self,
        regions: &[&[u8]],
        policy: WeightsPolicy,
        progress: &mut dyn FnMut(u64, u64),
        release: &mut dyn FnMut(&[u8]),
    ) -> Result<WeightsResidency, BackendError> {
        if self.weights.residency().is_some() {
            return Err(BackendError::Shape("weights are attached once".to_string()));
        }
        self.device.bind()?;
        self.weights = guarded("attaching the weights", || {
            weights::WeightStore::attach(
                &self.device,
                &self.ledger,
                regions,
                policy,
                progress,
                release,
            )
            .map_err(|e| CudaError::Bounds(e.to_string()))
        })?;
        let residency = self
            .weights
            .residency()
            .ok_or_else(|| BackendError::Shape("no weights attached".to_string()))?;
        self.ledger.set_weights_residency(residency);
        Ok(residency)
    }

    /// Forces `len` keys per attention split (rounded up to the key tile),
    /// or lets each step choose (`None`). For tests of the split path.
    pub fn set_attention_split(&self, len: Option<usize>) {
        let len = len.map_or(0, |l| (l as u32).max(1).div_ceil(KEY_TILE) * KEY_TILE);
        self.split_len.store(len, Ordering::Relaxed);
    }

    /// Forces the matmul and expert kernels (tests of both paths), or
    /// restores the crossover ([`MatmulPath::Auto`]).
    pub fn set_matmul_path(&self, path: MatmulPath) {
        let code = match path {
            MatmulPath::Auto => 0,
            MatmulPath::WarpPerRow => 1,
            MatmulPath::TensorCores => 2,
        };
        self.matmul_path.store(code, Ordering::Relaxed);
    }

    /// Whether `rows` rows over weights that all allow it (`mma_formats`:
    /// none is F32) run on the tensor cores.
    pub(super) fn tensor_cores_for(&self, rows: usize, mma_formats: bool) -> bool {
        if !self.tensor_cores || !mma_formats {
            return false;
        }
        match self.matmul_path.load(Ordering::Relaxed) {
            1 => false,
            2 => true,
            _ => rows >= TENSOR_CORE_MIN_ROWS,
        }
    }

    /// Kernel launches so far, by kernel name.
    pub fn launch_counts(&self) -> Vec<(&'static str, u64)> {
        self.kernels.launch_counts()
    }

    pub(super) fn launch<P>(
        &self,
        kernel: Kernel,
        grid: (u32, u32, u32),
        block: u32,
        shared: u32,
        params: &P,
    ) -> Result<(), BackendError> {
        Ok(self.kernels.launch(kernel, grid, block, shared, params)?)
    }

    pub(super) fn weight(&self, w: &LinearWeight<'_>) -> Result<p::Weight, BackendError> {
        let rows =
            u32::try_from(w.rows).map_err(|_| BackendError::Shape("weight too tall".into()))?;
        let cols =
            u32::try_from(w.cols).map_err(|_| BackendError::Shape("weight too wide".into()))?;
        let group = |g: usize| {
            if w.cols.is_multiple_of(g) {
                Ok(())
            } else {
                Err(BackendError::Shape(format!(
                    "{} columns are not groups of {g}",
                    w.cols
                )))
            }
        };
        let (format, data, scales, global) = match w.data {
            WeightData::F32(b) => {
                check("F32 weight", w.rows * w.cols * 4, b.len())?;
                (FMT_F32, b, &[][..], 1.0)
            }
            WeightData::Bf16(b) => {
                check("BF16 weight", w.rows * w.cols * 2, b.len())?;
                (FMT_BF16, b, &[][..], 1.0)
            }
            WeightData::Nvfp4 {
                packed,
                scales,
                global,
            } => {
                group(NVFP4_GROUP)?;
                check("NVFP4 codes", w.rows * w.cols / 2, packed.len())?;
                check("NVFP4 scales", w.rows * w.cols / NVFP4_GROUP, scales.len())?;
                (FMT_NVFP4, packed, scales, global)
            }
            WeightData::Mxfp4 { blocks, scales } => {
                group(MXFP4_GROUP)?;
                check("MXFP4 blocks", w.rows * w.cols / 2, blocks.len())?;
                check("MXFP4 scales", w.rows * w.cols / MXFP4_GROUP, scales.len())?;
                (FMT_MXFP4, blocks, scales, 1.0)
            }
            // No FP8 or INT4 weight kernel on CUDA yet: refused by name,
            // never dequantized behind the caller's back.
            WeightData::Fp8 { .. } | WeightData::Int4 { .. } => {
                return Err(BackendError::NotSupported {
                    backend: "cuda",
                    what: crate::backend::cpu::kernels::weights::format_name(&w.data),
                });
            }
        };
        Ok(p::Weight {
            data: self.weights.translate(data)?,
            scales: self.weights.translate(scales)?,
            format,
            global,
            rows,
            cols,
        })
    }
}

pub(super) fn u32_of(what: &'static str, n: usize) -> Result<u32, BackendError> {
    u32::try_from(n).map_err(|_| BackendError::Shape(format!("{what} {n} exceeds 32 bits")))
}

/// Blocks for a grid-stride loop over `n` elements, `BLOCK_THREADS` each.
fn stride_blocks(n: usize) -> u32 {
    n.div_ceil(BLOCK_THREADS as usize).clamp(1, 4096) as u32
}
