//! cgroup v2 memory of the kubelet's pods (`kubepods.slice` under systemd,
//! `kubepods` under cgroupfs). Reported so the plan can subtract what pods
//! already use; note that CUDA allocations are never charged here.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::error::{HostError, read_optional};

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

/// This process's own cgroup v2 memory: a container's or a unit's limit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OwnCgroup {
    pub memory: CgroupMemory,
    /// Page cache charged to it (`file` of `memory.stat`), 0 if unknown:
    /// clean file pages (the mapped weights) are reclaimed before the
    /// cgroup's OOM killer runs.
    pub file: u64,
}

impl OwnCgroup {
    /// What counts against `memory.max`: `memory.current` less page cache.
    pub fn in_use(&self) -> u64 {
        self.memory.current.saturating_sub(self.file)
    }
}

/// Reads this process's cgroup v2 (the `0::PATH` line of
/// `<root>/proc/self/cgroup`) below `<root>/sys/fs/cgroup`. `Ok(None)`
/// without cgroup v2, or where the cgroup has no memory controller files
/// (the root cgroup).
pub fn read_own(root: &Path) -> Result<Option<OwnCgroup>, HostError> {
    let self_file = root.join("proc/self/cgroup");
    let Some(text) = read_optional(&self_file)? else {
        return Ok(None);
    };
    let Some(path) = text.lines().find_map(|l| l.strip_prefix("0::")) else {
        return Ok(None);
    };
    let relative = Path::new(path.trim())
        .strip_prefix("/")
        .unwrap_or(Path::new(""));
    if relative
        .components()
        .any(|c| !matches!(c, std::path::Component::Normal(_)))
    {
        return Err(HostError::Malformed {
            file: self_file.display().to_string(),
            line: 1,
            why: format!("cgroup path {path:?} leaves the cgroup tree"),
        });
    }
    let dir = root.join("sys/fs/cgroup").join(relative);
    let current_file = dir.join("memory.current");
    let Some(current_text) = read_optional(&current_file)? else {
        return Ok(None);
    };
    let current = parse_number(&current_text, &current_file)?;
    let max_file = dir.join("memory.max");
    let max = match read_optional(&max_file)? {
        None => None,
        Some(text) if text.trim() == "max" => None,
        Some(text) => Some(parse_number(&text, &max_file)?),
    };
    let stat_file = dir.join("memory.stat");
    let file = match read_optional(&stat_file)? {
        None => 0,
        Some(text) => match text
            .lines()
            .find_map(|l| l.strip_prefix("file ").map(str::to_string))
        {
            None => 0,
            Some(value) => parse_number(&value, &stat_file)?,
        },
    };
    Ok(Some(OwnCgroup {
        memory: CgroupMemory {
            path: dir,
            current,
            max,
        },
        file,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree(self_line: &str, files: &[(&str, &str)]) -> tempfile::TempDir {
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(root.path().join("proc/self")).unwrap();
        std::fs::write(root.path().join("proc/self/cgroup"), self_line).unwrap();
        let dir = root
            .path()
            .join("sys/fs/cgroup/system.slice/sparkrt.service");
        std::fs::create_dir_all(&dir).unwrap();
        for (name, text) in files {
            std::fs::write(dir.join(name), text).unwrap();
        }
        root
    }

    #[test]
    fn own_cgroup_is_found_from_proc_self() {
        let root = tree(
            "0::/system.slice/sparkrt.service\n",
            &[
                ("memory.current", "3000\n"),
                ("memory.max", "4000\n"),
                ("memory.stat", "anon 2000\nfile 1000\n"),
            ],
        );
        let own = read_own(root.path()).unwrap().unwrap();
        assert_eq!(own.memory.current, 3000);
        assert_eq!(own.memory.max, Some(4000));
        assert_eq!(own.in_use(), 2000);
    }

    #[test]
    fn unlimited_absent_and_hostile_cgroups() {
        let root = tree(
            "0::/system.slice/sparkrt.service\n",
            &[("memory.current", "5\n"), ("memory.max", "max\n")],
        );
        assert_eq!(read_own(root.path()).unwrap().unwrap().memory.max, None);
        let root = tree("0::/\n", &[]);
        assert_eq!(read_own(root.path()).unwrap(), None);
        let root = tree("0::/../../etc\n", &[]);
        assert!(read_own(root.path()).is_err());
        let root = tree(
            "0::/system.slice/sparkrt.service\n",
            &[("memory.current", "lots\n")],
        );
        assert!(read_own(root.path()).is_err());
    }
}
