//! The kernel sources (`kernels/*.cu`, built into the binary), their entry
//! points, and loading them for the device: from the CUBIN cache when it
//! has them, else compiled by NVRTC for the device's own architecture.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock};

use cudarc::driver::result;
use cudarc::driver::sys;
use rayon::prelude::*;

use super::cache::{CubinCache, key_hash};
use super::constants;
use super::driver::{Device, Handle, driver};
use super::error::{CudaError, SYNC_ENV};
use super::nvrtc::{self, Compiled, Source};

/// The headers under `kernels/` every kernel file may include.
pub const SOURCE_HEADERS: [(&str, &str); 3] = [
    ("common.cuh", include_str!("../../../kernels/common.cuh")),
    ("linear.cuh", include_str!("../../../kernels/linear.cuh")),
    ("mma.cuh", include_str!("../../../kernels/mma.cuh")),
];

/// Every header a kernel file may include, as NVRTC takes them: the
/// [`SOURCE_HEADERS`] and `constants.cuh` (`constants::header`).
pub fn headers() -> [(&'static str, &'static str); 4] {
    static CONSTANTS: LazyLock<String> = LazyLock::new(constants::header);
    let [common, linear, mma] = SOURCE_HEADERS;
    [("constants.cuh", CONSTANTS.as_str()), common, linear, mma]
}

/// One `.cu` file: one NVRTC compilation, one module.
#[derive(Debug)]
pub struct KernelFile {
    pub name: &'static str,
    pub source: &'static str,
}

pub const FILES: [KernelFile; 5] = [
    KernelFile {
        name: "norm.cu",
        source: include_str!("../../../kernels/norm.cu"),
    },
    KernelFile {
        name: "elementwise.cu",
        source: include_str!("../../../kernels/elementwise.cu"),
    },
    KernelFile {
        name: "matmul.cu",
        source: include_str!("../../../kernels/matmul.cu"),
    },
    KernelFile {
        name: "moe.cu",
        source: include_str!("../../../kernels/moe.cu"),
    },
    KernelFile {
        name: "attention.cu",
        source: include_str!("../../../kernels/attention.cu"),
    },
];

impl KernelFile {
    /// The name diagnostics show (`kernels/moe.cu(42): error: ...`).
    pub fn path(&self) -> String {
        format!("kernels/{}", self.name)
    }

    fn stem(&self) -> &'static str {
        self.name.trim_end_matches(".cu")
    }

    /// Hash of everything that goes into the CUBIN but the NVRTC version.
    fn key(&self, arch: &str) -> u64 {
        let options = nvrtc::options(arch).join(" ");
        let mut parts: Vec<&[u8]> = vec![
            self.name.as_bytes(),
            self.source.as_bytes(),
            options.as_bytes(),
        ];
        for (name, text) in headers() {
            parts.push(name.as_bytes());
            parts.push(text.as_bytes());
        }
        key_hash(&parts)
    }

    /// Compiles this file for `arch` with NVRTC.
    pub fn compile(&self, arch: &str) -> Result<Compiled, CudaError> {
        let path = self.path();
        nvrtc::compile(
            &Source {
                name: &path,
                text: self.source,
                headers: &headers(),
            },
            arch,
        )
    }
}

/// Every entry point the backend launches. The `*Mma` kernels run on the
/// tensor cores (`mma.sync` BF16, kernels/mma.cuh); [`Kernel::uses_mma`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kernel {
    RmsNorm,
    RopeTable,
    QkNormRope,
    Embed,
    SiluMul,
    Add,
    CompactRows,
    Matmul,
    MatmulMma,
    RouteGroup,
    ExpertGateUp,
    ExpertGateUpMma,
    ExpertDown,
    ExpertDownMma,
    MoeCombine,
    Attention,
    AttentionCombine,
    KvAppend,
    KvCopyBlocks,
}

impl Kernel {
    pub const ALL: [Kernel; 19] = [
        Kernel::RmsNorm,
        Kernel::RopeTable,
        Kernel::QkNormRope,
        Kernel::Embed,
        Kernel::SiluMul,
        Kernel::Add,
        Kernel::CompactRows,
        Kernel::Matmul,
        Kernel::MatmulMma,
        Kernel::RouteGroup,
        Kernel::ExpertGateUp,
        Kernel::ExpertGateUpMma,
        Kernel::ExpertDown,
        Kernel::ExpertDownMma,
        Kernel::MoeCombine,
        Kernel::Attention,
        Kernel::AttentionCombine,
        Kernel::KvAppend,
        Kernel::KvCopyBlocks,
    ];

    /// The `extern "C"` name in its source.
    pub fn name(self) -> &'static str {
        match self {
            Kernel::RmsNorm => "rmsnorm",
            Kernel::RopeTable => "rope_table",
            Kernel::QkNormRope => "qk_norm_rope",
            Kernel::Embed => "embed",
            Kernel::SiluMul => "silu_mul",
            Kernel::Add => "add",
            Kernel::CompactRows => "compact_rows",
            Kernel::Matmul => "matmul",
            Kernel::MatmulMma => "matmul_mma",
            Kernel::RouteGroup => "route_group",
            Kernel::ExpertGateUp => "expert_gate_up",
            Kernel::ExpertGateUpMma => "expert_gate_up_mma",
            Kernel::ExpertDown => "expert_down",
            Kernel::ExpertDownMma => "expert_down_mma",
            Kernel::MoeCombine => "moe_combine",
            Kernel::Attention => "attention",
            Kernel::AttentionCombine => "attention_combine",
            Kernel::KvAppend => "kv_append",
            Kernel::KvCopyBlocks => "kv_copy_blocks",
        }
    }

    /// Whether the kernel's inner loop is `mma.sync` (its SASS holds HMMA).
    pub fn uses_mma(self) -> bool {
        matches!(
            self,
            Kernel::MatmulMma | Kernel::ExpertGateUpMma | Kernel::ExpertDownMma
        )
    }

    /// Index of its file in [`FILES`].
    fn file(self) -> usize {
        match self {
            Kernel::RmsNorm | Kernel::RopeTable | Kernel::QkNormRope => 0,
            Kernel::Embed | Kernel::SiluMul | Kernel::Add | Kernel::CompactRows => 1,
            Kernel::Matmul | Kernel::MatmulMma => 2,
            Kernel::RouteGroup
            | Kernel::ExpertGateUp
            | Kernel::ExpertGateUpMma
            | Kernel::ExpertDown
            | Kernel::ExpertDownMma
            | Kernel::MoeCombine => 3,
            Kernel::Attention
            | Kernel::AttentionCombine
            | Kernel::KvAppend
            | Kernel::KvCopyBlocks => 4,
        }
    }
}

/// The loaded modules, their functions, and a launch counter per function.
#[derive(Debug)]
pub struct Kernels {
    device: Arc<Device>,
    modules: Vec<Handle<sys::CUmodule>>,
    functions: Vec<Handle<sys::CUfunction>>,
    launches: Vec<AtomicU64>,
    /// [`SYNC_ENV`] is 1: wait for every launch, so a fault names its kernel.
    sync_each_launch: bool,
    /// How each file was obtained: "cache" or "nvrtc".
    pub origins: Vec<(&'static str, &'static str)>,
}

impl Kernels {
    /// Loads every kernel for `device`, compiling what the cache lacks.
    pub fn load(device: &Arc<Device>, cache: &CubinCache) -> Result<Kernels, CudaError> {
        let arch = device.info.arch();
        let nvrtc = nvrtc::load();
        let version = nvrtc.as_ref().ok().map(|n| n.version);
        // Cached CUBINs first; compile the rest in parallel.
        let cached: Vec<Option<Vec<u8>>> = FILES
            .iter()
            .map(|f| cache.load(f.stem(), &arch, f.key(&arch), version))
            .collect();
        let compiled: Vec<Result<(Vec<u8>, &'static str), CudaError>> = FILES
            .par_iter()
            .zip(cached.into_par_iter())
            .map(|(file, cached)| match cached {
                Some(cubin) => Ok((cubin, "cache")),
                None => {
                    let nvrtc = nvrtc.clone()?;
                    let compiled = file.compile(&arch)?;
                    if let Err(e) = cache.store(
                        file.stem(),
                        &arch,
                        file.key(&arch),
                        nvrtc.version,
                        &compiled.cubin,
                    ) {
                        tracing::debug!("could not cache {}: {e}", file.name);
                    }
                    Ok((compiled.cubin, "nvrtc"))
                }
            })
            .collect();

        let mut kernels = Kernels {
            device: Arc::clone(device),
            modules: Vec::new(),
            functions: Vec::new(),
            launches: Kernel::ALL.iter().map(|_| AtomicU64::new(0)).collect(),
            sync_each_launch: std::env::var(SYNC_ENV).is_ok_and(|v| v == "1"),
            origins: Vec::new(),
        };
        for (file, result) in FILES.iter().zip(compiled) {
            let (cubin, origin) = result?;
            // SAFETY: `cubin` is a whole CUBIN image (ELF checked by the
            // cache, or straight from NVRTC); the driver copies it.
            let module = unsafe { result::module::load_data(cubin.as_ptr() as *const _) }
                .map_err(driver("cuModuleLoadData"))?;
            kernels.modules.push(Handle(module));
            kernels.origins.push((file.name, origin));
        }
        for kernel in Kernel::ALL {
            let name = std::ffi::CString::new(kernel.name())
                .map_err(|_| CudaError::Bounds(kernel.name().to_string()))?;
            // SAFETY: the module was loaded above and lives as long as `kernels`.
            let function =
                unsafe { result::module::get_function(kernels.modules[kernel.file()].0, name) }
                    .map_err(driver("cuModuleGetFunction"))?;
            kernels.functions.push(Handle(function));
        }
        Ok(kernels)
    }

    pub fn function(&self, kernel: Kernel) -> sys::CUfunction {
        self.functions[kernel as usize].0
    }

    /// Allows `kernel` up to `bytes` of dynamic shared memory.
    pub fn allow_shared(&self, kernel: Kernel, bytes: u32) -> Result<(), CudaError> {
        // SAFETY: a function of a loaded module.
        unsafe {
            result::function::set_function_attribute(
                self.function(kernel),
                sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                bytes as i32,
            )
        }
        .map_err(driver("cuFuncSetAttribute"))
    }

    /// Launches `kernel` and counts it. Empty grids launch nothing. With
    /// [`SYNC_ENV`] set the launch is waited for, so a fault while it runs
    /// names `kernel`; else it surfaces, unnamed, at a later call.
    pub fn launch<P>(
        &self,
        kernel: Kernel,
        grid: (u32, u32, u32),
        block: u32,
        shared: u32,
        params: &P,
    ) -> Result<(), CudaError> {
        if grid.0 == 0 || grid.1 == 0 || grid.2 == 0 {
            return Ok(());
        }
        // A sticky error from the launch call is an earlier launch's fault,
        // surfacing here: it is not this kernel's to name.
        self.device
            .launch(self.function(kernel), grid, block, shared, params)?;
        self.launches[kernel as usize].fetch_add(1, Ordering::Relaxed);
        if self.sync_each_launch {
            self.device
                .synchronize()
                .map_err(|e| e.in_kernel(kernel.name()))?;
        }
        Ok(())
    }

    /// Launches so far, by kernel.
    pub fn launch_counts(&self) -> Vec<(&'static str, u64)> {
        Kernel::ALL
            .iter()
            .map(|k| (k.name(), self.launches[*k as usize].load(Ordering::Relaxed)))
            .collect()
    }

    pub fn total_launches(&self) -> u64 {
        self.launches
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .sum()
    }
}

impl Drop for Kernels {
    fn drop(&mut self) {
        let _ = self.device.bind();
        for module in &self.modules {
            // SAFETY: loaded in `load`, unloaded once; no launch is pending
            // once the stream is idle.
            unsafe {
                let _ = result::stream::synchronize(self.device.stream());
                let _ = result::module::unload(module.0);
            }
        }
    }
}

/// One kernel file compiled for one architecture, for `sparkrt kernels`.
#[derive(Debug)]
pub struct FileReport {
    pub file: &'static str,
    pub arch: String,
    pub cubin_bytes: usize,
    pub kernels: Vec<nvrtc::KernelReport>,
}

/// Compiles every kernel file for `arch` (NVRTC must be loadable).
pub fn compile_all(arch: &str) -> Result<Vec<FileReport>, CudaError> {
    nvrtc::load()?;
    FILES
        .par_iter()
        .map(|file| {
            let compiled = file.compile(arch)?;
            Ok(FileReport {
                file: file.name,
                arch: arch.to_string(),
                cubin_bytes: compiled.cubin.len(),
                kernels: nvrtc::report(&compiled),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kernel_is_in_its_file() {
        for kernel in Kernel::ALL {
            let source = FILES[kernel.file()].source;
            assert!(
                source.contains(&format!(" {}(", kernel.name())),
                "{} not in {}",
                kernel.name(),
                FILES[kernel.file()].name
            );
        }
    }
}
