//! Helpers of the CUDA tests: the CPU and CUDA backends side by side (or a
//! printed reason to skip when this machine has no usable GPU), buffers
//! filled the same on both, and comparisons.
#![allow(dead_code)]

use std::sync::Arc;

use sparkrt::backend::Backend;
use sparkrt::backend::cpu::{CpuBackend, CpuBuffer};
use sparkrt::backend::cuda::{CudaBackend, CudaBuffer, CudaOptions, WeightsPolicy};
use sparkrt::plan::ledger::{Category, Ledger};
use sparkrt::plan::memory::{Buffer, MoeWorkspace, Placement};

/// Why CUDA tests cannot run here, if they cannot.
pub fn no_gpu() -> Option<String> {
    match sparkrt::host::gpu::probe() {
        sparkrt::host::gpu::GpuProbe::Present { .. } => None,
        sparkrt::host::gpu::GpuProbe::Absent { reason } => Some(reason),
    }
}

/// Set (to 1) where the CUDA tests must run (scripts/cuda-emulator-check.sh,
/// scripts/gpu-check.sh, `.ci/run`): a missing GPU then fails the test
/// instead of skipping it, so a run without libcuda is never green.
pub const REQUIRE_GPU: &str = "SPARKRT_REQUIRE_GPU";

/// Whether [`REQUIRE_GPU`] is set to 1.
pub fn gpu_required() -> bool {
    std::env::var(REQUIRE_GPU).is_ok_and(|v| v == "1")
}

/// Prints why `test` is skipped and returns true when there is no GPU;
/// under [`REQUIRE_GPU`] it fails the test with the reason instead.
pub fn skip(test: &str) -> bool {
    match no_gpu() {
        Some(reason) => {
            assert!(
                !gpu_required(),
                "{test}: no usable GPU ({reason}), and {REQUIRE_GPU}=1 requires one"
            );
            eprintln!("skipping {test}: no usable GPU ({reason})");
            true
        }
        None => false,
    }
}

/// The weights residency this run must see with [`WeightsPolicy::Auto`]
/// (`SPARKRT_EXPECT_RESIDENCY`: copy, registered or mapped, set by
/// scripts/cuda-emulator-check.sh for each emulated device kind). None when
/// unset; under [`REQUIRE_GPU`] an unset or unknown value fails the test,
/// so no run leaves the weight path unchecked.
pub fn expected_residency() -> Option<sparkrt::plan::ledger::WeightsResidency> {
    use sparkrt::plan::ledger::WeightsResidency;
    let value = std::env::var("SPARKRT_EXPECT_RESIDENCY").ok();
    let expected = match value.as_deref() {
        Some("copy") => Some(WeightsResidency::DeviceCopy),
        Some("registered") => Some(WeightsResidency::HostRegistered),
        Some("mapped") => Some(WeightsResidency::Mapped),
        Some(other) => {
            panic!("SPARKRT_EXPECT_RESIDENCY={other}: expected copy, registered or mapped")
        }
        None => None,
    };
    assert!(
        expected.is_some() || !gpu_required(),
        "{REQUIRE_GPU}=1 needs SPARKRT_EXPECT_RESIDENCY (copy, registered or mapped) \
         saying which weight path this device takes"
    );
    expected
}

/// A ledger that admits anything (the kernel tests do not test the plan).
pub fn open_ledger() -> Arc<Ledger> {
    Arc::new(Ledger::with_budgets(
        [u64::MAX / 8; sparkrt::plan::ledger::CATEGORIES],
    ))
}

pub fn cuda_options() -> CudaOptions {
    CudaOptions {
        ordinal: 0,
        cache_dir: Some(
            std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("sparkrt-cache"),
        ),
    }
}

/// The two backends, CUDA with `regions` (every weight's bytes) attached.
pub struct Both {
    pub cpu: CpuBackend,
    pub cuda: CudaBackend,
}

impl Both {
    /// None (after printing why) when there is no GPU. With a GPU, a CUDA
    /// backend that fails to start fails the test.
    pub fn new(test: &str, regions: &[&[u8]], policy: WeightsPolicy) -> Option<Both> {
        Both::try_new(test, regions, policy)
            .map(|both| both.unwrap_or_else(|e| panic!("{test}: attaching weights: {e}")))
    }

    /// [`Both::new`], with the error of attaching the weights returned.
    pub fn try_new(
        test: &str,
        regions: &[&[u8]],
        policy: WeightsPolicy,
    ) -> Option<Result<Both, String>> {
        if skip(test) {
            return None;
        }
        let mut cuda = CudaBackend::new(open_ledger(), &cuda_options())
            .unwrap_or_else(|e| panic!("{test}: the CUDA backend did not start: {e}"));
        Some(
            cuda.attach_weights(regions, policy, &mut |_, _| {}, &mut |_| {})
                .map(|_| Both {
                    cpu: CpuBackend::new(open_ledger()),
                    cuda,
                })
                .map_err(|e| e.to_string()),
        )
    }

    /// The same values in a buffer of each backend (`capacity` ≥ len).
    pub fn buffers(&self, values: &[f32], capacity: usize) -> (CpuBuffer, CudaBuffer) {
        let mut cpu = self
            .cpu
            .alloc(Category::Activations, "test", capacity, Placement::Device)
            .unwrap();
        cpu.as_mut_slice()[..values.len()].copy_from_slice(values);
        let cuda = self
            .cuda
            .alloc(Category::Activations, "test", capacity, Placement::Device)
            .unwrap();
        cuda.upload(values).unwrap();
        (cpu, cuda)
    }

    /// Zeroed buffers of `n` on each side.
    pub fn zeros(&self, n: usize) -> (CpuBuffer, CudaBuffer) {
        self.buffers(&[], n)
    }

    pub fn read_cpu(&self, buf: &CpuBuffer, n: usize) -> Vec<f32> {
        buf.as_slice()[..n].to_vec()
    }

    pub fn read_cuda(&self, buf: &CudaBuffer, n: usize) -> Vec<f32> {
        let mut out = Vec::new();
        self.cuda.read(buf, n, &mut |v| out = v.to_vec()).unwrap();
        out
    }
}

/// Asserts |a − b| ≤ atol + rtol·|a| elementwise, naming the worst element.
pub fn assert_close(what: &str, cpu: &[f32], cuda: &[f32], atol: f32, rtol: f32) {
    assert_eq!(cpu.len(), cuda.len(), "{what}: lengths");
    let mut worst = (0usize, 0f32);
    for (i, (&a, &b)) in cpu.iter().zip(cuda).enumerate() {
        assert!(
            a.is_finite() == b.is_finite(),
            "{what}[{i}]: cpu {a}, cuda {b}"
        );
        let excess = (a - b).abs() - (atol + rtol * a.abs());
        if excess > worst.1 {
            worst = (i, excess);
        }
    }
    let i = worst.0;
    assert!(
        worst.1 <= 0.0,
        "{what}[{i}]: cpu {} vs cuda {} (|diff| {} over atol {atol} + rtol {rtol})",
        cpu[i],
        cuda[i],
        (cpu[i] - cuda[i]).abs()
    );
}

/// A plan-shaped MoE workspace for `tokens` tokens routed to `top_k` of
/// `experts` experts of hidden size `h` and intermediate size `i`.
pub fn workspace_plan(
    tokens: usize,
    top_k: usize,
    experts: usize,
    h: usize,
    i: usize,
) -> MoeWorkspace {
    let rows = (tokens * top_k) as u64;
    let (h, i) = (h as u64, i as u64);
    let buffers = vec![
        ("topk_ids", rows * 4),
        ("topk_weights", rows * 4),
        ("expert_offsets", (experts as u64 + 1) * 4),
        ("sorted_rows", rows * 4),
        ("gathered_input", rows * h * 4),
        ("gate_up_output", rows * 2 * i * 4),
        // CUDA's: the attention's split partials (room for 1,024
        // (row, head, split) partials of head_dim 256 + 2) and the route
        // kernel's counter; the CPU backend leaves them unused.
        ("attention_partials", 1024 * 258 * 4),
        ("route_counter", 4),
        ("activation", rows * i * 4),
        ("down_output", rows * h * 4),
        // The CPU backend's MXFP4 experts quantize their inputs here (an
        // int16 per value, an f32 per 32); CUDA leaves them unused.
        ("quantized_input", rows * h.max(i) * 2),
        ("quantized_scales", rows * h.max(i) / 32 * 4),
    ]
    .into_iter()
    .map(|(name, bytes)| Buffer {
        name: name.to_string(),
        bytes,
        placement: Placement::Device,
    })
    .collect::<Vec<_>>();
    let bytes = buffers.iter().map(|b| b.bytes).sum();
    MoeWorkspace {
        instances: 1,
        capacity_tokens: tokens as u64,
        routed_rows: rows,
        bytes,
        per_layer_total_bytes: bytes,
        buffers,
    }
}
