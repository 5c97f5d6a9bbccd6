//! The node a manifest is planned for, when it is not the machine
//! `sparkrt k8s` runs on: the built-in GB10 node or a node spec file. (A
//! node's host tree, `--node-host-root`, is read like any host.)

use std::path::Path;

use serde::Deserialize;
use thiserror::Error;

use crate::plan::memory::HostFigures;
use crate::plan::profile::ByteSize;
use crate::units::{KIB, MIB};

#[derive(Debug, Error)]
pub enum NodeError {
    #[error("cannot read the node spec {file}: {source}")]
    Read {
        file: String,
        source: std::io::Error,
    },
    #[error("the node spec {file}: {message}")]
    Invalid { file: String, message: String },
}

/// A Kubernetes node's memory as the plan sees it. Sizes as in a profile
/// (`"121GiB"`, `"512Mi"` or bytes).
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeSpec {
    /// What the node is, in words (printed).
    #[serde(default = "unnamed")]
    pub name: String,
    /// /proc/meminfo MemTotal.
    pub mem_total: ByteSize,
    /// /proc/meminfo MemAvailable on the idle node [default: MemTotal].
    #[serde(default)]
    pub mem_available: Option<ByteSize>,
    /// The kubelet's `systemReserved` memory.
    #[serde(default)]
    pub system_reserved: ByteSize,
    /// The kubelet's `kubeReserved` memory.
    #[serde(default)]
    pub kube_reserved: ByteSize,
    /// The kubelet's `evictionHard` `memory.available` [default: the
    /// kubelet's own default, 100Mi].
    #[serde(default = "kubelet_default_eviction")]
    pub eviction_hard: ByteSize,
    /// Memory other pods already use on the node [default: none].
    #[serde(default)]
    pub kubepods_in_use: ByteSize,
}

fn unnamed() -> String {
    "node spec".to_string()
}

/// The kubelet's default hard eviction threshold, `memory.available<100Mi`
/// (Kubernetes "Node-pressure Eviction"); it reserves no memory for the
/// system or itself unless configured.
const KUBELET_DEFAULT_EVICTION: u64 = 100 * MIB;

fn kubelet_default_eviction() -> ByteSize {
    ByteSize(KUBELET_DEFAULT_EVICTION)
}

/// MemTotal of a DGX Spark (GB10, 128 GB LPDDR5x): what the kernel reports
/// after the firmware's and the GPU driver's carve-outs, 127605452 kB
/// (121.7 GiB), as in the repository's `tests/fixtures/hosts/spark` tree.
pub const GB10_MEM_TOTAL: u64 = 127_605_452 * KIB;
/// MemAvailable of an idle GB10 node, from the same tree (112.5 GiB).
pub const GB10_MEM_AVAILABLE: u64 = 118_000_000 * KIB;

impl NodeSpec {
    /// The built-in GB10 node: a DGX Spark's MemTotal and idle MemAvailable,
    /// and the kubelet's defaults (no reservations, eviction at 100Mi), no
    /// other pods.
    pub fn gb10() -> NodeSpec {
        NodeSpec {
            name: "the built-in GB10 node (DGX Spark)".to_string(),
            mem_total: ByteSize(GB10_MEM_TOTAL),
            mem_available: Some(ByteSize(GB10_MEM_AVAILABLE)),
            system_reserved: ByteSize(0),
            kube_reserved: ByteSize(0),
            eviction_hard: kubelet_default_eviction(),
            kubepods_in_use: ByteSize(0),
        }
    }

    /// Reads a node spec file (TOML, the keys of [`NodeSpec`]).
    pub fn load(path: &Path) -> Result<NodeSpec, NodeError> {
        let file = path.display().to_string();
        let text =
            crate::util::files::read_regular_to_string(path, crate::limits::MAX_SMALL_FILE_BYTES)
                .map_err(|source| NodeError::Read {
                file: file.clone(),
                source,
            })?;
        let spec: NodeSpec = toml::from_str(&text).map_err(|e| NodeError::Invalid {
            file: file.clone(),
            message: e.message().to_string(),
        })?;
        if spec.mem_available().0 > spec.mem_total.0 {
            return Err(NodeError::Invalid {
                file,
                message: "mem_available is above mem_total".to_string(),
            });
        }
        Ok(spec)
    }

    fn mem_available(&self) -> ByteSize {
        self.mem_available.unwrap_or(self.mem_total)
    }

    /// The figures the plan's headroom rule takes (the node has a kubelet).
    pub fn figures(&self) -> HostFigures {
        HostFigures {
            mem_total: self.mem_total.0,
            mem_available: self.mem_available().0,
            eviction_hard: self.eviction_hard.0,
            system_reserved: self.system_reserved.0,
            kube_reserved: self.kube_reserved.0,
            kubepods_in_use: self.kubepods_in_use.0,
            kubelet: true,
        }
    }

    /// One line for the operator: which node and its figures.
    pub fn describe(&self) -> String {
        format!(
            "{}: MemTotal {}, MemAvailable {}, kubelet systemReserved {}, kubeReserved {}, \
             evictionHard {}",
            self.name,
            crate::units::format_bytes(self.mem_total.0),
            crate::units::format_bytes(self.mem_available().0),
            crate::units::format_bytes(self.system_reserved.0),
            crate::units::format_bytes(self.kube_reserved.0),
            crate::units::format_bytes(self.eviction_hard.0),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::units::GIB;

    #[test]
    fn a_spec_file_takes_sizes_and_defaults_the_rest() {
        let dir = std::env::temp_dir().join(format!("sparkrt-node-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("node.toml");
        std::fs::write(&path, "mem_total = \"64GiB\"\nkube_reserved = \"1Gi\"\n").unwrap();
        let spec = NodeSpec::load(&path).unwrap();
        let f = spec.figures();
        assert_eq!(f.mem_total, 64 * GIB);
        assert_eq!(f.mem_available, 64 * GIB);
        assert_eq!(f.kube_reserved, GIB);
        assert_eq!(f.eviction_hard, 100 * MIB);
        std::fs::write(&path, "mem_totl = 1\n").unwrap();
        let err = NodeSpec::load(&path).unwrap_err().to_string();
        assert!(err.contains("mem_totl"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
