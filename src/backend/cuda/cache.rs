//! The on-disk CUBIN cache: compiling every kernel takes seconds, loading a
//! cached CUBIN milliseconds. A file is keyed by the kernel file's name,
//! the architecture, a hash of everything compiled (source, headers,
//! options) and the NVRTC version, so an edit or an upgrade misses.
//!
//! Location: `--cache-dir`, else `$SPARKRT_CACHE_DIR`, else
//! `$XDG_CACHE_HOME/sparkrt`, else `~/.cache/sparkrt`.

use std::path::{Path, PathBuf};

/// The cache directory, if one can be named.
pub fn cache_dir(explicit: Option<&Path>) -> Option<PathBuf> {
    if let Some(dir) = explicit {
        return Some(dir.to_path_buf());
    }
    let var = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty());
    if let Some(dir) = var("SPARKRT_CACHE_DIR") {
        return Some(PathBuf::from(dir));
    }
    if let Some(dir) = var("XDG_CACHE_HOME") {
        return Some(PathBuf::from(dir).join("sparkrt"));
    }
    var("HOME").map(|home| PathBuf::from(home).join(".cache/sparkrt"))
}

/// FNV-1a, 64 bit, continuing from `hash`: stable across builds and
/// platforms (std's hasher is not).
fn fnv1a64(mut hash: u64, bytes: &[u8]) -> u64 {
    for &byte in bytes {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    hash
}

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;

/// The cache key of `parts`: FNV-1a over each part's length, then its bytes
/// (so ("ab", "c") and ("a", "bc") differ).
pub fn key_hash(parts: &[&[u8]]) -> u64 {
    parts.iter().fold(FNV_OFFSET, |hash, part| {
        fnv1a64(fnv1a64(hash, &(part.len() as u64).to_le_bytes()), part)
    })
}

/// CUBINs under `<dir>/kernels/`.
#[derive(Clone, Debug)]
pub struct CubinCache {
    dir: Option<PathBuf>,
}

impl CubinCache {
    pub fn new(dir: Option<PathBuf>) -> CubinCache {
        CubinCache {
            dir: dir.map(|d| d.join("kernels")),
        }
    }

    pub fn dir(&self) -> Option<&Path> {
        self.dir.as_deref()
    }

    fn prefix(stem: &str, arch: &str, hash: u64) -> String {
        format!("{stem}-{arch}-{hash:016x}-nvrtc")
    }

    fn file_name(stem: &str, arch: &str, hash: u64, nvrtc: (i32, i32)) -> String {
        format!(
            "{}{}.{}.cubin",
            Self::prefix(stem, arch, hash),
            nvrtc.0,
            nvrtc.1
        )
    }

    /// The cached CUBIN for this key. Without a known NVRTC version (NVRTC
    /// not installed), any version's CUBIN of the same source will do: a
    /// CUBIN does not depend on NVRTC being present to load.
    pub fn load(
        &self,
        stem: &str,
        arch: &str,
        hash: u64,
        nvrtc: Option<(i32, i32)>,
    ) -> Option<Vec<u8>> {
        let dir = self.dir.as_ref()?;
        let path = match nvrtc {
            Some(version) => dir.join(Self::file_name(stem, arch, hash, version)),
            None => {
                let prefix = Self::prefix(stem, arch, hash);
                let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
                    .ok()?
                    .flatten()
                    .map(|e| e.path())
                    .filter(|p| {
                        p.file_name()
                            .and_then(|n| n.to_str())
                            .is_some_and(|n| n.starts_with(&prefix) && n.ends_with(".cubin"))
                    })
                    .collect();
                found.sort();
                found.pop()?
            }
        };
        let bytes = std::fs::read(path).ok()?;
        bytes.starts_with(b"\x7fELF").then_some(bytes)
    }

    /// Stores a CUBIN (write to a temporary file, then rename: a reader
    /// never sees half a file). Failing to write only costs a recompile.
    pub fn store(
        &self,
        stem: &str,
        arch: &str,
        hash: u64,
        nvrtc: (i32, i32),
        cubin: &[u8],
    ) -> std::io::Result<()> {
        let Some(dir) = &self.dir else {
            return Ok(());
        };
        std::fs::create_dir_all(dir)?;
        let name = Self::file_name(stem, arch, hash, nvrtc);
        let temp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
        std::fs::write(&temp, cubin)?;
        std::fs::rename(&temp, dir.join(name))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv_matches_the_published_test_vectors() {
        assert_eq!(fnv1a64(FNV_OFFSET, b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a64(FNV_OFFSET, b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a64(FNV_OFFSET, b"foobar"), 0x8594_4171_f739_67e8);
        assert_eq!(
            key_hash(&[b"a"]),
            fnv1a64(FNV_OFFSET, &[1, 0, 0, 0, 0, 0, 0, 0, b'a'])
        );
        assert_ne!(key_hash(&[b"ab", b"c"]), key_hash(&[b"a", b"bc"]));
    }

    #[test]
    fn stores_and_finds_by_key_and_version() {
        let dir = std::env::temp_dir().join(format!("sparkrt-cache-test-{}", std::process::id()));
        let cache = CubinCache::new(Some(dir.clone()));
        let elf = b"\x7fELF-fake-cubin".to_vec();
        cache.store("norm", "sm_121", 42, (13, 0), &elf).unwrap();
        assert_eq!(
            cache.load("norm", "sm_121", 42, Some((13, 0))),
            Some(elf.clone())
        );
        assert_eq!(cache.load("norm", "sm_121", 42, Some((13, 1))), None);
        assert_eq!(cache.load("norm", "sm_90", 42, None), None);
        assert_eq!(cache.load("norm", "sm_121", 43, None), None);
        // Without NVRTC, any version of the same key.
        assert_eq!(cache.load("norm", "sm_121", 42, None), Some(elf));
        // Not an ELF file: ignored.
        cache.store("bad", "sm_121", 1, (13, 0), b"junk").unwrap();
        assert_eq!(cache.load("bad", "sm_121", 1, Some((13, 0))), None);
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn explicit_dir_wins() {
        assert_eq!(
            cache_dir(Some(Path::new("/tmp/x"))),
            Some(PathBuf::from("/tmp/x"))
        );
    }
}
