//! cgroup v2 memory of the kubelet's pods (`kubepods.slice` under systemd,
//! `kubepods` under cgroupfs). Reported so the plan can subtract what pods
//! already use; note that CUDA allocations are never charged here.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::{HostError, read_optional};

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CgroupMemory {
    /// The cgroup directory that was read.
    pub path: PathBuf,
    /// `memory.current`, bytes.
    pub current: u64,
    /// `memory.max`, bytes; `None` when unlimited (`max`).
    pub max: Option<u64>,
}

const KUBEPODS_DIRS: [&str; 2] = ["sys/fs/cgroup/kubepods.slice", "sys/fs/cgroup/kubepods"];

/// Reads the kubepods cgroup below `root`; `Ok(None)` when there is none.
pub fn read_kubepods(root: &Path) -> Result<Option<CgroupMemory>, HostError> {
    for dir in KUBEPODS_DIRS {
        let dir = root.join(dir);
        let current_file = dir.join("memory.current");
        let Some(current_text) = read_optional(&current_file)? else {
            continue;
        };
        let current = parse_number(&current_text, &current_file)?;
        let max_file = dir.join("memory.max");
        let max = match read_optional(&max_file)? {
            None => None,
            Some(text) if text.trim() == "max" => None,
            Some(text) => Some(parse_number(&text, &max_file)?),
        };
        return Ok(Some(CgroupMemory {
            path: dir,
            current,
            max,
        }));
    }
    Ok(None)
}

fn parse_number(text: &str, file: &Path) -> Result<u64, HostError> {
    text.trim().parse().map_err(|_| HostError::Malformed {
        file: file.display().to_string(),
        line: 1,
        why: format!("expected a byte count, found {:?}", text.trim()),
    })
}
