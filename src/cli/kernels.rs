//! `sparkrt kernels`: compiles every CUDA kernel with the NVRTC found on
//! this machine (no GPU needed) and lists each with its CUBIN size,
//! registers and spills, and — from `cuobjdump -sass` of that CUBIN — its
//! tensor-core (HMMA) instructions and local-memory loads/stores (LDL/STL);
//! exits 1 if any file fails to compile. Without cuobjdump the SASS columns
//! say so; that is not a failure. `--constants` prints the `constants.cuh`
//! the kernels compile with instead.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Result, bail};
use rayon::prelude::*;
use serde::Serialize;

use super::RuntimeFailure;
use crate::backend::cuda::sass::{Cuobjdump, SassCounts};
use crate::backend::cuda::{self, kernels, nvrtc};

#[derive(Debug, clap::Args)]
pub struct KernelsArgs {
    /// Target architecture, e.g. sm_121 (DGX Spark) or sm_90 (H200);
    /// repeatable [default: the GPU's own].
    #[arg(long = "arch", value_name = "SM")]
    pub archs: Vec<String>,
    /// The `cuobjdump` that disassembles the CUBINs [default: PATH, then
    /// pip's nvidia/cu13/bin, then the CUDA toolkit].
    #[arg(long, value_name = "PATH")]
    pub cuobjdump: Option<PathBuf>,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
    /// Print `constants.cuh`, the numbers the kernels share with the host,
    /// and exit (the CPU emulator's build, kernels/emu/build.sh, takes it
    /// from here).
    #[arg(long, conflicts_with_all = ["archs", "cuobjdump", "json"])]
    pub constants: bool,
}

#[derive(Serialize)]
struct KernelRow {
    arch: String,
    file: &'static str,
    kernel: String,
    code_bytes: Option<u64>,
    registers: Option<u32>,
    spill_stores: Option<u64>,
    spill_loads: Option<u64>,
    /// From `cuobjdump -sass`; `None` without cuobjdump (see `Report::sass`).
    sass: Option<SassCounts>,
}

#[derive(Serialize)]
struct FileRow {
    arch: String,
    file: &'static str,
    cubin_bytes: Option<usize>,
    error: Option<String>,
}

#[derive(Serialize)]
#[serde(rename_all = "snake_case")]
enum SassSource {
    Cuobjdump(String),
    /// Why cuobjdump (or the nvdisasm it runs) was not found.
    NotFound(String),
    /// A disassembly that failed.
    Failed(String),
}

#[derive(Serialize)]
struct Report {
    nvrtc: String,
    nvrtc_version: String,
    /// The cuobjdump used, or why there is no SASS.
    sass: SassSource,
    files: Vec<FileRow>,
    kernels: Vec<KernelRow>,
}

pub fn run(args: &KernelsArgs) -> Result<ExitCode> {
    if args.constants {
        print!("{}", cuda::constants::header());
        return Ok(ExitCode::SUCCESS);
    }
    let archs = if args.archs.is_empty() {
        match crate::host::gpu::probe().first() {
            Some(gpu) => vec![gpu.arch()],
            None => bail!("no GPU to take the architecture from: pass --arch (e.g. --arch sm_121)"),
        }
    } else {
        args.archs.clone()
    };
    if let Some(bad) = archs.iter().find(|a| !valid_arch(a)) {
        bail!("--arch {bad}: expected sm_<major><minor>, e.g. sm_121 or sm_90");
    }
    let found = nvrtc::load().map_err(|e| RuntimeFailure(e.into()))?;
    let (cuobjdump, sass) = match Cuobjdump::find(args.cuobjdump.as_deref()) {
        Ok(tool) => {
            let path = tool.path.display().to_string();
            (Some(tool), SassSource::Cuobjdump(path))
        }
        Err(e) if args.cuobjdump.is_some() => bail!("--cuobjdump: {e}"),
        Err(e) => (None, SassSource::NotFound(e.to_string())),
    };
    let mut report = Report {
        nvrtc: found
            .path
            .as_ref()
            .map_or("found by the dynamic loader".to_string(), |p| {
                p.display().to_string()
            }),
        nvrtc_version: format!("{}.{}", found.version.0, found.version.1),
        sass,
        files: Vec::new(),
        kernels: Vec::new(),
    };
    let mut failed = false;
    for arch in &archs {
        // The files compile (and disassemble) in parallel; rows keep their order.
        let built: Vec<_> = kernels::FILES
            .par_iter()
            .map(|file| {
                let compiled = file.compile(arch);
                let sass = match (&cuobjdump, &compiled) {
                    (Some(tool), Ok(compiled)) => Some(tool.counts(&compiled.cubin)),
                    _ => None,
                };
                (file, compiled, sass)
            })
            .collect();
        for (file, compiled, sass) in built {
            match compiled {
                Ok(compiled) => {
                    report.files.push(FileRow {
                        arch: arch.clone(),
                        file: file.name,
                        cubin_bytes: Some(compiled.cubin.len()),
                        error: None,
                    });
                    let sass = match sass {
                        Some(Ok(counts)) => counts,
                        Some(Err(e)) => {
                            report.sass = SassSource::Failed(e.to_string());
                            Default::default()
                        }
                        None => Default::default(),
                    };
                    for k in nvrtc::report(&compiled) {
                        report.kernels.push(KernelRow {
                            arch: arch.clone(),
                            file: file.name,
                            code_bytes: k.code_bytes,
                            registers: k.registers,
                            spill_stores: k.spill_stores,
                            spill_loads: k.spill_loads,
                            sass: sass.get(&k.name).copied(),
                            kernel: k.name,
                        });
                    }
                }
                Err(e) => {
                    failed = true;
                    let message = match e {
                        cuda::CudaError::Compile { log, .. } => log,
                        other => other.to_string(),
                    };
                    report.files.push(FileRow {
                        arch: arch.clone(),
                        file: file.name,
                        cubin_bytes: None,
                        error: Some(message),
                    });
                }
            }
        }
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print_table(&report);
    }
    Ok(if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

fn valid_arch(arch: &str) -> bool {
    arch.strip_prefix("sm_")
        .is_some_and(|n| n.len() >= 2 && n.chars().all(|c| c.is_ascii_digit()))
}

fn print_table(report: &Report) {
    println!("NVRTC {} ({})", report.nvrtc_version, report.nvrtc);
    let sass_missing = match &report.sass {
        SassSource::Cuobjdump(path) => {
            println!("SASS by {path}");
            None
        }
        SassSource::NotFound(why) => {
            println!("SASS: {why}");
            Some("cuobjdump not found")
        }
        SassSource::Failed(why) => {
            println!("SASS: {why}");
            Some("cuobjdump failed")
        }
    };
    let opt = |v: Option<u64>| v.map_or("-".to_string(), |v| v.to_string());
    for file in &report.files {
        match (&file.cubin_bytes, &file.error) {
            (Some(bytes), _) => {
                println!("{} kernels/{}: CUBIN {bytes} bytes", file.arch, file.file);
                println!(
                    "  {:<20} {:>10} {:>10} {:>14} {:>6} {:>9}",
                    "kernel", "code B", "registers", "spills st/ld", "HMMA", "LDL/STL"
                );
                for k in report
                    .kernels
                    .iter()
                    .filter(|k| k.arch == file.arch && k.file == file.file)
                {
                    let sass = match (k.sass, sass_missing) {
                        (Some(s), _) => format!(
                            "{:>6} {:>9}",
                            s.hmma,
                            format!("{}/{}", s.local_loads, s.local_stores)
                        ),
                        (None, Some(why)) => format!(" {why}"),
                        (None, None) => format!("{:>6} {:>9}", "-", "-"),
                    };
                    println!(
                        "  {:<20} {:>10} {:>10} {:>14} {sass}",
                        k.kernel,
                        opt(k.code_bytes),
                        opt(k.registers.map(u64::from)),
                        format!("{}/{}", opt(k.spill_stores), opt(k.spill_loads))
                    );
                }
            }
            (None, error) => {
                println!("{} kernels/{}: FAILED", file.arch, file.file);
                if let Some(error) = error {
                    for line in error.lines() {
                        println!("  {line}");
                    }
                }
            }
        }
    }
}
