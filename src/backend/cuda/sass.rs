//! What the GPU will really run: `cuobjdump -sass` of a CUBIN, reduced to
//! the counts that prove a kernel is what it claims — tensor-core (HMMA)
//! instructions, and local-memory loads and stores (LDL/STL: spills or
//! stack arrays, each one a trip to DRAM-backed memory).
//!
//! `cuobjdump` (pip `nvidia-cuda-cuobjdump`) disassembles by running
//! `nvdisasm` (pip `nvidia-cuda-nvdisasm`), which pip puts in the same
//! `nvidia/cu13/bin` directory; both are found here, no CUDA toolkit needed.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};

/// Why a CUBIN could not be disassembled.
#[derive(Debug, thiserror::Error)]
pub enum SassError {
    #[error(
        "cuobjdump not found on PATH nor in {searched} (install it with `pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm`)"
    )]
    NotFound { searched: String },
    #[error(
        "nvdisasm, which cuobjdump runs, is not next to {cuobjdump} nor on PATH (install it with `pip install nvidia-cuda-nvdisasm`)"
    )]
    NoNvdisasm { cuobjdump: PathBuf },
    #[error("{path}: {error}")]
    Io {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("cuobjdump -sass failed ({status}): {stderr}")]
    Failed { status: String, stderr: String },
}

/// The tools found: `cuobjdump` and the directory holding the `nvdisasm`
/// it runs (put first on its PATH).
#[derive(Clone, Debug)]
pub struct Cuobjdump {
    pub path: PathBuf,
    nvdisasm_dir: PathBuf,
}

/// Instruction counts of one function's SASS.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct SassCounts {
    /// Every instruction (the end-of-code padding NOPs included).
    pub instructions: u64,
    /// Tensor-core matrix multiply-accumulates (`HMMA.16816.F32.BF16` is
    /// one `mma.sync.m16n8k16` BF16 on sm_80, sm_90 and sm_120/121 alike).
    pub hmma: u64,
    /// Local-memory loads (`LDL`, `LDL.LU`, ...).
    pub local_loads: u64,
    /// Local-memory stores (`STL`, ...).
    pub local_stores: u64,
}

impl Cuobjdump {
    /// `explicit` (a `--cuobjdump` flag) when given, else the first
    /// `cuobjdump` on PATH, in pip's `nvidia/cu13/bin`, or in the CUDA
    /// toolkit; with the `nvdisasm` next to it or on PATH.
    pub fn find(explicit: Option<&Path>) -> Result<Cuobjdump, SassError> {
        let path = match explicit {
            Some(path) if path.is_file() => path.to_path_buf(),
            Some(path) => {
                return Err(SassError::NotFound {
                    searched: path.display().to_string(),
                });
            }
            None => {
                let dirs = search_dirs();
                dirs.iter()
                    .map(|d| d.join("cuobjdump"))
                    .find(|p| p.is_file())
                    .ok_or_else(|| SassError::NotFound {
                        searched: dirs
                            .iter()
                            .map(|d| d.display().to_string())
                            .collect::<Vec<_>>()
                            .join(", "),
                    })?
            }
        };
        let beside = path.parent().map(Path::to_path_buf).unwrap_or_default();
        let nvdisasm_dir = std::iter::once(beside)
            .chain(path_dirs())
            .find(|d| d.join("nvdisasm").is_file())
            .ok_or_else(|| SassError::NoNvdisasm {
                cuobjdump: path.clone(),
            })?;
        Ok(Cuobjdump { path, nvdisasm_dir })
    }

    /// `cuobjdump -sass` of `cubin` (through a temporary file: cuobjdump
    /// reads files only).
    pub fn disassemble(&self, cubin: &[u8]) -> Result<String, SassError> {
        let file = TempCubin::write(cubin)?;
        let mut path_var = vec![self.nvdisasm_dir.clone()];
        path_var.extend(path_dirs());
        let joined = std::env::join_paths(path_var).map_err(|e| SassError::Failed {
            status: "not run".to_string(),
            stderr: e.to_string(),
        })?;
        let out = Command::new(&self.path)
            .arg("-sass")
            .arg(&file.0)
            .env("PATH", joined)
            .output()
            .map_err(|error| SassError::Io {
                path: self.path.clone(),
                error,
            })?;
        if !out.status.success() {
            return Err(SassError::Failed {
                status: out.status.to_string(),
                stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
            });
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Counts per function of `cubin`, by function name.
    pub fn counts(&self, cubin: &[u8]) -> Result<BTreeMap<String, SassCounts>, SassError> {
        Ok(parse(&self.disassemble(cubin)?))
    }
}

/// Counts per function of `cuobjdump -sass` output. A function starts at
/// its `Function : name` line; an instruction line reads
/// `/*0110*/  @!P0 HMMA.16816.F32.BF16 R12, R12, R10, RZ ;  /* 0x... */`:
/// the opcode is the word after the address and the optional predicate,
/// and its base (before the first `.`) is what is counted, so that
/// `HFMA2.MMA` (a CUDA-core FMA) is not an HMMA and `LDL.LU` is an LDL.
pub fn parse(sass: &str) -> BTreeMap<String, SassCounts> {
    let mut functions: BTreeMap<String, SassCounts> = BTreeMap::new();
    let mut current: Option<String> = None;
    for line in sass.lines() {
        if let Some(name) = line.split("Function : ").nth(1) {
            let name = name.trim().to_string();
            functions.entry(name.clone()).or_default();
            current = Some(name);
            continue;
        }
        let (Some(name), Some(base)) = (&current, opcode_base(line)) else {
            continue;
        };
        let Some(counts) = functions.get_mut(name) else {
            continue;
        };
        counts.instructions += 1;
        match base {
            "HMMA" => counts.hmma += 1,
            "LDL" => counts.local_loads += 1,
            "STL" => counts.local_stores += 1,
            _ => {}
        }
    }
    functions
}

/// The opcode's base of one instruction line, `None` for any other line.
fn opcode_base(line: &str) -> Option<&str> {
    let rest = line.trim_start().strip_prefix("/*")?;
    let (address, rest) = rest.split_once("*/")?;
    if address.is_empty() || !address.chars().all(|c| c.is_ascii_hexdigit()) {
        return None;
    }
    let mut words = rest.split_whitespace();
    let mut opcode = words.next()?;
    if opcode.starts_with('@') {
        opcode = words.next()?;
    }
    let base = opcode.split('.').next()?;
    (!base.is_empty()
        && base
            .chars()
            .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit()))
    .then_some(base)
}

/// Directories on PATH.
fn path_dirs() -> Vec<PathBuf> {
    std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect())
        .unwrap_or_default()
}

/// Where `cuobjdump` is looked for, in order: PATH, pip's
/// `site-packages/nvidia/cu13/bin`, the CUDA toolkit.
fn search_dirs() -> Vec<PathBuf> {
    let mut dirs = path_dirs();
    for site in super::nvrtc::site_packages() {
        dirs.push(site.join("nvidia/cu13/bin"));
    }
    for var in ["CUDA_HOME", "CUDA_PATH"] {
        if let Some(home) = std::env::var_os(var) {
            dirs.push(PathBuf::from(home).join("bin"));
        }
    }
    dirs.push(PathBuf::from("/usr/local/cuda/bin"));
    let mut seen = std::collections::HashSet::new();
    dirs.retain(|d| !d.as_os_str().is_empty() && seen.insert(d.clone()));
    dirs
}

/// A CUBIN written to a file of its own, removed when dropped.
struct TempCubin(PathBuf);

impl TempCubin {
    fn write(cubin: &[u8]) -> Result<TempCubin, SassError> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let path = std::env::temp_dir().join(format!(
            "sparkrt-sass-{}-{}.cubin",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::write(&path, cubin).map_err(|error| SassError::Io {
            path: path.clone(),
            error,
        })?;
        Ok(TempCubin(path))
    }
}

impl Drop for TempCubin {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Lines as cuobjdump 13.x prints them for sm_90 (the addresses and
    /// encodings of a real `mma.sync` probe and a stack-array kernel).
    const SAMPLE: &str = "\n\tcode for sm_90\n\t\tFunction : spill_probe\n\t.headerflags\t@\"EF_CUDA_SM90 EF_CUDA_VIRTUAL_SM(EF_CUDA_SM90)\"\n        /*0000*/                   LDC R1, c[0x0][0x28] ;                   /* 0x00000a00ff017b82 */\n        /*0010*/                   HFMA2.MMA R3, -RZ, RZ, 0, 2.384185791015625e-07 ;      /* 0x00000004ff037435 */\n        /*0300*/                   STL.128 [R1+0x10], R8 ;                  /* 0x0000100801007387 */\n        /*0310*/              @!P0 LDL.LU R0, [R1+0x4] ;                    /* 0x0000040001008983 */\n        /*2490*/                   LDL R0, [R0] ;                           /* 0x0000000000007983 */\n        /*24a0*/                   EXIT ;                                   /* 0x000000000000794d */\n\t\t..........\n\n\n\t\tFunction : mma_probe\n        /*0110*/                   HMMA.16816.F32.BF16 R12, R12, R10, RZ ;  /* 0x0000000a0c0c723c */\n        /*0120*/                   BRA 0x120;                               /* 0xfffffffc00fc7947 */\n";

    #[test]
    fn counts_hmma_and_local_memory_per_function() {
        let counts = parse(SAMPLE);
        assert_eq!(counts.len(), 2);
        assert_eq!(
            counts["spill_probe"],
            SassCounts {
                instructions: 6,
                hmma: 0, // HFMA2.MMA is a CUDA-core instruction
                local_loads: 2,
                local_stores: 1,
            }
        );
        assert_eq!(
            counts["mma_probe"],
            SassCounts {
                instructions: 2,
                hmma: 1,
                local_loads: 0,
                local_stores: 0,
            }
        );
    }

    #[test]
    fn headers_and_separators_are_not_instructions() {
        for line in [
            "\tcode for sm_121",
            "\t.headerflags\t@\"EF_CUDA_SM121\"",
            "\t\t..........",
            "/* comment */",
            "",
        ] {
            assert_eq!(opcode_base(line), None, "{line:?}");
        }
        assert_eq!(
            parse("        /*0000*/ HMMA.16816.F32.BF16 R1 ;"),
            BTreeMap::new()
        );
    }

    #[test]
    fn an_explicit_path_that_is_not_a_file_is_not_found() {
        let err = Cuobjdump::find(Some(Path::new("/nonexistent/cuobjdump"))).unwrap_err();
        assert!(matches!(err, SassError::NotFound { .. }), "{err}");
        assert!(err.to_string().contains("/nonexistent/cuobjdump"));
    }
}
