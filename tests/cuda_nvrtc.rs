//! Every kernel compiles with NVRTC for the DGX Spark (sm_121) and the H200
//! (sm_90) on this machine, GPU or not; a compile error names its file and
//! line; `sparkrt kernels` lists the kernels and fails on a bad arch.
//! Skipped, with the reason printed, where libnvrtc cannot be found.

use crate::common;

use sparkrt::backend::cuda::kernels::{self, Kernel};
use sparkrt::backend::cuda::nvrtc::{self, Source};

/// NVRTC is a tool CI installs (`pip install nvidia-cuda-nvrtc`), unlike a GPU.
fn nvrtc_or_skip(test: &str) -> bool {
    common::tool_present(test, nvrtc::load().err().map(|e| e.to_string()))
}

#[test]
fn every_kernel_compiles_for_sm_121_and_sm_90() {
    if !nvrtc_or_skip("kernel compile") {
        return;
    }
    for arch in ["sm_121", "sm_90"] {
        let reports = kernels::compile_all(arch).unwrap_or_else(|e| panic!("{arch}: {e}"));
        assert_eq!(reports.len(), kernels::FILES.len());
        for kernel in Kernel::ALL {
            let found = reports
                .iter()
                .flat_map(|r| &r.kernels)
                .find(|k| k.name == kernel.name())
                .unwrap_or_else(|| panic!("{arch}: no {} in the CUBINs", kernel.name()));
            // ptxas reported it, and its code is in the CUBIN.
            assert!(
                found.registers.is_some_and(|r| r > 0),
                "{arch} {}: registers",
                found.name
            );
            assert!(
                found.code_bytes.is_some_and(|b| b > 0),
                "{arch} {}: code",
                found.name
            );
            // Register spills cost bandwidth: none in any kernel.
            assert_eq!(found.spill_stores, Some(0), "{arch} {}: spills", found.name);
        }
    }
}

#[test]
fn a_compile_error_names_the_file_and_line() {
    if !nvrtc_or_skip("compile error") {
        return;
    }
    let text = "#include \"common.cuh\"\nextern \"C\" __global__ void broken(u32* p) {\n    p[0] = undefined_name;\n}\n";
    let err = nvrtc::compile(
        &Source {
            name: "kernels/broken.cu",
            text,
            headers: &kernels::headers(),
        },
        "sm_121",
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("kernels/broken.cu(3)"), "{err}");
    assert!(err.contains("undefined_name"), "{err}");
}

#[test]
fn sparkrt_kernels_lists_every_kernel_and_rejects_a_bad_arch() {
    if !nvrtc_or_skip("sparkrt kernels") {
        return;
    }
    let out = common::sparkrt(&["kernels", "--arch", "sm_121", "--arch", "sm_90", "--json"]);
    assert!(out.status.success(), "{}", common::stderr(&out));
    let json = common::json(&out);
    let rows = json["kernels"].as_array().unwrap();
    assert_eq!(rows.len(), 2 * Kernel::ALL.len());
    for arch in ["sm_121", "sm_90"] {
        for kernel in Kernel::ALL {
            assert!(
                rows.iter()
                    .any(|r| r["arch"] == arch && r["kernel"] == kernel.name()),
                "{arch} {}",
                kernel.name()
            );
        }
    }
    assert!(
        json["files"]
            .as_array()
            .unwrap()
            .iter()
            .all(|f| f["cubin_bytes"].as_u64() > Some(0))
    );

    // An architecture NVRTC does not know: a failure, not a crash.
    let out = common::sparkrt(&["kernels", "--arch", "sm_11"]);
    assert_eq!(out.status.code(), Some(1), "{}", common::stderr(&out));
    assert!(common::stdout(&out).contains("FAILED"));
    let out = common::sparkrt(&["kernels", "--arch", "hopper"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(common::stderr(&out).contains("sm_<major><minor>"));
}
