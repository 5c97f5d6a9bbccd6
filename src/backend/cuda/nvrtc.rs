//! NVRTC, found at run time: compiles `kernels/*.cu` to CUBIN for one
//! architecture, with ptxas' register and spill report.
//!
//! cudarc opens libnvrtc by name, so the dynamic loader only looks in
//! `LD_LIBRARY_PATH` and the system paths. When it is not there, the
//! library is opened by full path from the places it is usually installed
//! (the `nvidia-cuda-nvrtc` pip package, `$CUDA_HOME/lib64`,
//! `/usr/local/cuda/lib64`); cudarc's later open by name then finds the
//! already-loaded library by its soname.

use std::ffi::{CStr, CString, c_char, c_int};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use cudarc::nvrtc::sys;

use super::error::CudaError;

/// Sonames tried in each directory, newest first.
const LIBRARY_NAMES: [&str; 2] = ["libnvrtc.so.13", "libnvrtc.so"];

/// Where NVRTC was found.
#[derive(Clone, Debug)]
pub struct Nvrtc {
    /// `None` when the dynamic loader found it by name.
    pub path: Option<PathBuf>,
    pub version: (i32, i32),
}

/// Loads NVRTC once per process.
pub fn load() -> Result<Nvrtc, CudaError> {
    static LOADED: OnceLock<Result<Nvrtc, String>> = OnceLock::new();
    LOADED
        .get_or_init(|| {
            find_and_open().and_then(|path| {
                Ok(Nvrtc {
                    version: version()?,
                    path,
                })
            })
        })
        .clone()
        .map_err(CudaError::NvrtcMissing)
}

fn present() -> bool {
    // SAFETY: only dlopens candidate names; calls nothing in the library.
    unsafe { sys::is_culib_present() }
}

fn find_and_open() -> Result<Option<PathBuf>, String> {
    if present() {
        return Ok(None);
    }
    let dirs = search_dirs();
    for dir in &dirs {
        for name in LIBRARY_NAMES {
            let path = dir.join(name);
            if path.is_file() && open_global(&path) && present() {
                return Ok(Some(path));
            }
        }
    }
    Err(format!(
        "libnvrtc not found on LD_LIBRARY_PATH nor in {} (install it with `pip install nvidia-cuda-nvrtc`)",
        dirs.iter()
            .map(|d| d.display().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    ))
}

/// dlopens `path` for the life of the process so that a later open by
/// soname finds it.
fn open_global(path: &Path) -> bool {
    let Ok(c_path) = CString::new(path.as_os_str().as_encoded_bytes()) else {
        return false;
    };
    // SAFETY: dlopen of a shared library by path; the handle is kept open
    // for the life of the process (never closed), so nothing dangles.
    let handle = unsafe { libc::dlopen(c_path.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL) };
    !handle.is_null()
}

/// Directories that may hold libnvrtc, in the order they are tried.
pub fn search_dirs() -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = Vec::new();
    if let Some(paths) = std::env::var_os("LD_LIBRARY_PATH") {
        dirs.extend(std::env::split_paths(&paths));
    }
    for site in site_packages() {
        dirs.push(site.join("nvidia/cu13/lib"));
    }
    for var in ["CUDA_HOME", "CUDA_PATH"] {
        if let Some(home) = std::env::var_os(var) {
            dirs.push(PathBuf::from(home).join("lib64"));
        }
    }
    dirs.push(PathBuf::from("/usr/local/cuda/lib64"));
    let mut seen = std::collections::HashSet::new();
    dirs.retain(|d| !d.as_os_str().is_empty() && seen.insert(d.clone()));
    dirs
}

/// Python site-packages directories: those of the active virtualenv and
/// the usual prefixes, then whatever `python3` reports.
pub(crate) fn site_packages() -> Vec<PathBuf> {
    let mut prefixes: Vec<PathBuf> = Vec::new();
    for var in ["VIRTUAL_ENV", "CONDA_PREFIX"] {
        if let Some(p) = std::env::var_os(var) {
            prefixes.push(PathBuf::from(p));
        }
    }
    if let Some(home) = std::env::var_os("HOME") {
        prefixes.push(PathBuf::from(home).join(".local"));
    }
    prefixes.push(PathBuf::from("/usr/local"));
    prefixes.push(PathBuf::from("/usr"));
    let mut sites = Vec::new();
    for prefix in prefixes {
        let Ok(entries) = std::fs::read_dir(prefix.join("lib")) else {
            continue;
        };
        for entry in entries.flatten() {
            if entry.file_name().to_string_lossy().starts_with("python3") {
                sites.push(entry.path().join("site-packages"));
                sites.push(entry.path().join("dist-packages"));
            }
        }
    }
    let query = "import site, sysconfig; print(sysconfig.get_paths()['purelib']); print(site.getusersitepackages())";
    if let Ok(out) = std::process::Command::new("python3")
        .args(["-c", query])
        .stderr(std::process::Stdio::null())
        .output()
        && out.status.success()
    {
        sites.extend(
            String::from_utf8_lossy(&out.stdout)
                .lines()
                .filter(|l| !l.trim().is_empty())
                .map(|l| PathBuf::from(l.trim())),
        );
    }
    sites
}

fn nvrtc_error(call: &'static str, code: sys::nvrtcResult) -> String {
    // SAFETY: nvrtcGetErrorString returns a static string for any code.
    let text = unsafe { CStr::from_ptr(sys::nvrtcGetErrorString(code)) };
    format!("{call}: {}", text.to_string_lossy())
}

fn version() -> Result<(i32, i32), String> {
    let (mut major, mut minor): (c_int, c_int) = (0, 0);
    // SAFETY: two out-pointers to live integers.
    let rc = unsafe { sys::nvrtcVersion(&mut major, &mut minor) };
    if rc != sys::nvrtcResult::NVRTC_SUCCESS {
        return Err(nvrtc_error("nvrtcVersion", rc));
    }
    Ok((major, minor))
}

/// A source file and the headers it includes, as NVRTC takes them.
pub struct Source<'a> {
    /// Shown in diagnostics: `kernels/attention.cu(123): error: ...`.
    pub name: &'a str,
    pub text: &'a str,
    /// (include name, text).
    pub headers: &'a [(&'a str, &'a str)],
}

/// What one compilation produced.
#[derive(Clone, Debug)]
pub struct Compiled {
    pub cubin: Vec<u8>,
    /// NVRTC's log, including ptxas' `-v` report.
    pub log: String,
}

/// The options every kernel is compiled with. `--fmad=false`: a·b + c is
/// rounded twice, as on the CPU; the kernels write `fmaf` where the CPU
/// kernels fuse.
pub fn options(arch: &str) -> Vec<String> {
    vec![
        format!("--gpu-architecture={arch}"),
        "--std=c++17".to_string(),
        "--fmad=false".to_string(),
        "--ptxas-options=-v".to_string(),
    ]
}

/// An RAII nvrtcProgram.
struct Program(sys::nvrtcProgram);

impl Drop for Program {
    fn drop(&mut self) {
        // SAFETY: created by nvrtcCreateProgram, destroyed once.
        unsafe {
            let _ = sys::nvrtcDestroyProgram(&mut self.0);
        }
    }
}

fn cstring(what: &str, s: &str) -> Result<CString, CudaError> {
    CString::new(s).map_err(|_| CudaError::Compile {
        file: what.to_string(),
        log: "contains a NUL byte".to_string(),
    })
}

/// Stack of the thread NVRTC compiles on: its front end recurses deeply
/// enough to overflow the 2 MiB of a rayon worker or a test thread.
const COMPILE_STACK_BYTES: usize = 256 << 20;

/// Compiles `source` for `arch` (e.g. `sm_121`) to CUBIN. NVRTC must be
/// loaded ([`load`]). Runs on its own thread with a large stack.
pub fn compile(source: &Source<'_>, arch: &str) -> Result<Compiled, CudaError> {
    std::thread::scope(|scope| {
        std::thread::Builder::new()
            .name("nvrtc".to_string())
            .stack_size(COMPILE_STACK_BYTES)
            .spawn_scoped(scope, || compile_here(source, arch))
            .map_err(|e| CudaError::Compile {
                file: source.name.to_string(),
                log: format!("cannot start the compiler thread: {e}"),
            })?
            .join()
            .unwrap_or_else(|_| {
                Err(CudaError::Compile {
                    file: source.name.to_string(),
                    log: "the compiler thread panicked".to_string(),
                })
            })
    })
}

fn compile_here(source: &Source<'_>, arch: &str) -> Result<Compiled, CudaError> {
    let name = cstring(source.name, source.name)?;
    let text = cstring(source.name, source.text)?;
    let header_texts = source
        .headers
        .iter()
        .map(|(n, t)| cstring(n, t))
        .collect::<Result<Vec<_>, _>>()?;
    let header_names = source
        .headers
        .iter()
        .map(|(n, _)| cstring(n, n))
        .collect::<Result<Vec<_>, _>>()?;
    let text_ptrs: Vec<*const c_char> = header_texts.iter().map(|c| c.as_ptr()).collect();
    let name_ptrs: Vec<*const c_char> = header_names.iter().map(|c| c.as_ptr()).collect();
    let failed = |call, rc| CudaError::Compile {
        file: source.name.to_string(),
        log: nvrtc_error(call, rc),
    };

    let mut raw: sys::nvrtcProgram = std::ptr::null_mut();
    // SAFETY: every pointer is to a NUL-terminated string kept alive by the
    // CStrings above until after nvrtcDestroyProgram (Program's drop).
    let rc = unsafe {
        sys::nvrtcCreateProgram(
            &mut raw,
            text.as_ptr(),
            name.as_ptr(),
            text_ptrs.len() as c_int,
            text_ptrs.as_ptr(),
            name_ptrs.as_ptr(),
        )
    };
    if rc != sys::nvrtcResult::NVRTC_SUCCESS {
        return Err(failed("nvrtcCreateProgram", rc));
    }
    let program = Program(raw);

    let options = options(arch)
        .into_iter()
        .map(|o| cstring("options", &o))
        .collect::<Result<Vec<_>, _>>()?;
    let option_ptrs: Vec<*const c_char> = options.iter().map(|c| c.as_ptr()).collect();
    // SAFETY: a live program and live option strings.
    let compiled = unsafe {
        sys::nvrtcCompileProgram(program.0, option_ptrs.len() as c_int, option_ptrs.as_ptr())
    };
    let log = program_log(&program).unwrap_or_default();
    if compiled != sys::nvrtcResult::NVRTC_SUCCESS {
        return Err(CudaError::Compile {
            file: source.name.to_string(),
            log: if log.trim().is_empty() {
                nvrtc_error("nvrtcCompileProgram", compiled)
            } else {
                log
            },
        });
    }
    let mut size = 0usize;
    // SAFETY: a compiled program and a live out-pointer.
    let rc = unsafe { sys::nvrtcGetCUBINSize(program.0, &mut size) };
    if rc != sys::nvrtcResult::NVRTC_SUCCESS {
        return Err(failed("nvrtcGetCUBINSize", rc));
    }
    let mut cubin = vec![0u8; size];
    // SAFETY: `cubin` holds the `size` bytes NVRTC reported.
    let rc = unsafe { sys::nvrtcGetCUBIN(program.0, cubin.as_mut_ptr() as *mut c_char) };
    if rc != sys::nvrtcResult::NVRTC_SUCCESS {
        return Err(failed("nvrtcGetCUBIN", rc));
    }
    Ok(Compiled { cubin, log })
}

fn program_log(program: &Program) -> Option<String> {
    let mut size = 0usize;
    // SAFETY: a live program and out-pointer.
    if unsafe { sys::nvrtcGetProgramLogSize(program.0, &mut size) }
        != sys::nvrtcResult::NVRTC_SUCCESS
    {
        return None;
    }
    let mut log = vec![0u8; size.max(1)];
    // SAFETY: `log` holds the `size` bytes NVRTC reported.
    if unsafe { sys::nvrtcGetProgramLog(program.0, log.as_mut_ptr() as *mut c_char) }
        != sys::nvrtcResult::NVRTC_SUCCESS
    {
        return None;
    }
    let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
    Some(String::from_utf8_lossy(&log[..end]).into_owned())
}

/// What ptxas reported for one entry function.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KernelReport {
    pub name: String,
    pub registers: Option<u32>,
    pub spill_stores: Option<u64>,
    pub spill_loads: Option<u64>,
    /// Bytes of its `.text.<name>` section in the CUBIN.
    pub code_bytes: Option<u64>,
}

/// Entry functions of a compilation, from ptxas' `-v` log and the CUBIN.
pub fn report(compiled: &Compiled) -> Vec<KernelReport> {
    let mut kernels: Vec<KernelReport> = Vec::new();
    let mut entry: Option<usize> = None;
    let mut properties_of: Option<String> = None;
    for line in compiled.log.lines() {
        if let Some(name) = quoted_after(line, "Compiling entry function '") {
            kernels.push(KernelReport {
                name: name.to_string(),
                ..KernelReport::default()
            });
            entry = Some(kernels.len() - 1);
        } else if let Some(rest) = line.split("Function properties for ").nth(1) {
            properties_of = Some(rest.trim().to_string());
        } else if line.contains("bytes spill stores") {
            let target = properties_of.as_deref();
            if let Some(k) = kernels.iter_mut().find(|k| Some(k.name.as_str()) == target) {
                k.spill_stores = number_before(line, " bytes spill stores");
                k.spill_loads = number_before(line, " bytes spill loads");
            }
        } else if let Some(i) = entry
            && line.contains("Used ")
            && line.contains(" registers")
        {
            kernels[i].registers =
                number_before(line, " registers").and_then(|n| u32::try_from(n).ok());
        }
    }
    let sizes = elf_text_sizes(&compiled.cubin);
    for k in &mut kernels {
        k.code_bytes = sizes
            .iter()
            .find(|(name, _)| name.strip_prefix(".text.") == Some(k.name.as_str()))
            .map(|(_, size)| *size);
    }
    kernels
}

fn quoted_after<'a>(line: &'a str, prefix: &str) -> Option<&'a str> {
    let rest = line.split(prefix).nth(1)?;
    rest.split('\'').next()
}

/// The integer just before `suffix` in `line` ("..., 40 bytes spill stores").
fn number_before(line: &str, suffix: &str) -> Option<u64> {
    let head = &line[..line.find(suffix)?];
    let digits: String = head
        .chars()
        .rev()
        .take_while(|c| c.is_ascii_digit())
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect();
    digits.parse().ok()
}

/// (section name, size) of every section of a little-endian ELF64 file;
/// empty when the bytes are not one.
pub fn elf_text_sizes(elf: &[u8]) -> Vec<(String, u64)> {
    let u16_at = |at: usize| {
        elf.get(at..at + 2)
            .map(|b| u16::from_le_bytes([b[0], b[1]]))
    };
    let u32_at = |at: usize| {
        elf.get(at..at + 4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    };
    let u64_at = |at: usize| {
        elf.get(at..at + 8).map(|b| {
            let mut a = [0u8; 8];
            a.copy_from_slice(b);
            u64::from_le_bytes(a)
        })
    };
    // \x7fELF, 64-bit, little-endian.
    if elf.get(..6) != Some(&[0x7f, b'E', b'L', b'F', 2, 1][..]) {
        return Vec::new();
    }
    let (Some(shoff), Some(shentsize), Some(shnum), Some(shstrndx)) =
        (u64_at(0x28), u16_at(0x3a), u16_at(0x3c), u16_at(0x3e))
    else {
        return Vec::new();
    };
    let header = |i: usize| {
        usize::try_from(shoff)
            .ok()?
            .checked_add(i.checked_mul(usize::from(shentsize))?)
    };
    let Some(strtab_offset) = header(usize::from(shstrndx))
        .and_then(|h| u64_at(h + 0x18))
        .and_then(|o| usize::try_from(o).ok())
    else {
        return Vec::new();
    };
    let mut sections = Vec::new();
    for i in 0..usize::from(shnum) {
        let Some(h) = header(i) else { break };
        let (Some(name_at), Some(size)) = (u32_at(h), u64_at(h + 0x20)) else {
            break;
        };
        let start = strtab_offset.saturating_add(name_at as usize);
        let Some(rest) = elf.get(start..) else {
            continue;
        };
        let end = rest.iter().position(|&b| b == 0).unwrap_or(rest.len());
        sections.push((String::from_utf8_lossy(&rest[..end]).into_owned(), size));
    }
    sections
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ptxas_report_is_read_per_entry_function() {
        let log = "ptxas info    : 272 bytes gmem\n\
ptxas info    : Compiling entry function 'k' for 'sm_121'\n\
ptxas info    : Function properties for k\n\
ptxas         .     40 bytes stack frame, 12 bytes spill stores, 8 bytes spill loads\n\
ptxas info    : Used 34 registers, used 0 barriers, 40 bytes cumulative stack size\n\
ptxas info    : Function properties for __internal_trig_reduction_slowpathd\n\
ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n\
ptxas info    : Compiling entry function 'j' for 'sm_121'\n\
ptxas info    : Function properties for j\n\
ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n\
ptxas info    : Used 7 registers, used 1 barriers\n";
        let r = report(&Compiled {
            cubin: Vec::new(),
            log: log.to_string(),
        });
        assert_eq!(r.len(), 2);
        assert_eq!(
            (
                r[0].name.as_str(),
                r[0].registers,
                r[0].spill_stores,
                r[0].spill_loads
            ),
            ("k", Some(34), Some(12), Some(8))
        );
        assert_eq!(
            (r[1].name.as_str(), r[1].registers, r[1].spill_stores),
            ("j", Some(7), Some(0))
        );
    }

    #[test]
    fn elf_sections_of_a_crafted_file() {
        // ELF64 LE with 3 sections: null, .shstrtab, .text.k (size 96).
        let strtab = b"\0.shstrtab\0.text.k\0";
        let shoff = 64 + strtab.len();
        let mut elf = vec![0u8; shoff + 3 * 64];
        elf[..6].copy_from_slice(&[0x7f, b'E', b'L', b'F', 2, 1]);
        elf[0x28..0x30].copy_from_slice(&(shoff as u64).to_le_bytes());
        elf[0x3a..0x3c].copy_from_slice(&64u16.to_le_bytes());
        elf[0x3c..0x3e].copy_from_slice(&3u16.to_le_bytes());
        elf[0x3e..0x40].copy_from_slice(&1u16.to_le_bytes());
        elf[64..64 + strtab.len()].copy_from_slice(strtab);
        let sh = |i: usize| shoff + 64 * i;
        elf[sh(1)..sh(1) + 4].copy_from_slice(&1u32.to_le_bytes());
        elf[sh(1) + 0x18..sh(1) + 0x20].copy_from_slice(&64u64.to_le_bytes());
        elf[sh(1) + 0x20..sh(1) + 0x28].copy_from_slice(&(strtab.len() as u64).to_le_bytes());
        elf[sh(2)..sh(2) + 4].copy_from_slice(&11u32.to_le_bytes());
        elf[sh(2) + 0x20..sh(2) + 0x28].copy_from_slice(&96u64.to_le_bytes());
        let sections = elf_text_sizes(&elf);
        assert_eq!(
            sections,
            vec![
                (String::new(), 0),
                (".shstrtab".to_string(), strtab.len() as u64),
                (".text.k".to_string(), 96)
            ]
        );
        assert!(elf_text_sizes(b"not an elf").is_empty());
        // Truncated section table: no panic, no sections past the end.
        assert!(elf_text_sizes(&elf[..shoff + 10]).len() < 3);
    }
}
