//! Reads the host below a root directory (`/` in production, a fake tree in
//! tests): memory, the kubelet's reservations, the kubepods cgroup, the GPU.

pub mod cgroup;
mod error;
pub mod gpu;
pub mod kubelet;
pub mod meminfo;
pub mod process;

use std::path::{Path, PathBuf};

use serde::Serialize;

pub use cgroup::CgroupMemory;
pub use error::HostError;
pub use gpu::{GpuInfo, GpuProbe};
pub use kubelet::{EvictionThreshold, KubeletReservations};
pub use meminfo::MemInfo;

/// Where the kubelet's configuration is looked for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KubeletSource {
    /// `<root>/var/lib/kubelet/config.yaml` if it exists.
    Auto,
    /// This file, which must exist.
    File(PathBuf),
    /// Ignore any kubelet.
    None,
}

/// One reading of the host.
#[derive(Clone, Debug, Serialize)]
pub struct HostReading {
    pub root: PathBuf,
    pub meminfo: MemInfo,
    pub kubepods: Option<CgroupMemory>,
    pub kubelet: Option<KubeletReservations>,
}

impl HostReading {
    /// `evictionHard["memory.available"]` in bytes; 0 without a kubelet.
    pub fn eviction_hard(&self) -> u64 {
        self.kubelet
            .as_ref()
            .map_or(0, |k| k.eviction_hard.bytes(self.meminfo.mem_total))
    }

    pub fn system_reserved(&self) -> u64 {
        self.kubelet.as_ref().map_or(0, |k| k.system_reserved)
    }

    pub fn kube_reserved(&self) -> u64 {
        self.kubelet.as_ref().map_or(0, |k| k.kube_reserved)
    }

    /// Memory the kubelet's pods use now (kubepods `memory.current`), 0 if unknown.
    pub fn kubepods_in_use(&self) -> u64 {
        self.kubepods.as_ref().map_or(0, |c| c.current)
    }
}

pub const DEFAULT_KUBELET_CONFIG: &str = "var/lib/kubelet/config.yaml";

/// Reads meminfo, the kubepods cgroup and the kubelet config below `root`.
pub fn read_host(root: &Path, kubelet: &KubeletSource) -> Result<HostReading, HostError> {
    let meminfo = read_meminfo(root)?;
    let kubepods = cgroup::read_kubepods(root)?;
    let kubelet = match kubelet {
        KubeletSource::None => None,
        KubeletSource::File(path) => Some(kubelet::read(path)?),
        KubeletSource::Auto => {
            let path = root.join(DEFAULT_KUBELET_CONFIG);
            if path.exists() {
                Some(kubelet::read(&path)?)
            } else {
                None
            }
        }
    };
    Ok(HostReading {
        root: root.to_path_buf(),
        meminfo,
        kubepods,
        kubelet,
    })
}

/// Reads `<root>/proc/meminfo` alone (the memory guard's fast path).
pub fn read_meminfo(root: &Path) -> Result<MemInfo, HostError> {
    let path = root.join("proc/meminfo");
    let text = error::read_host_file(&path)?;
    MemInfo::parse(&text, &path.display().to_string())
}
