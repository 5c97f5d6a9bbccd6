//! The top processes by resident memory, read from /proc through sysinfo,
//! with GPU memory attached where the host source reports it.

use sparkrt_wire::GpuProcess;
use sysinfo::{ProcessRefreshKind, ProcessesToUpdate, System};

/// One row of the process panel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessRow {
    pub pid: u32,
    pub name: String,
    pub rss: u64,
    /// GPU memory NVML attributes to it, where NVML reports per-process use.
    pub gpu_bytes: Option<u64>,
}

/// Reads the process table; keeps sysinfo's state between reads.
pub struct ProcessTable {
    system: Option<System>,
}

impl Default for ProcessTable {
    fn default() -> Self {
        ProcessTable::new()
    }
}

impl ProcessTable {
    pub fn new() -> ProcessTable {
        // Without a readable /proc the panel stays empty; the rest still works.
        ProcessTable {
            system: System::new().ok(),
        }
    }

    /// The `limit` largest processes by RSS, plus every process with GPU
    /// memory, largest RSS first.
    pub fn read(&mut self, limit: usize, gpu: &[GpuProcess]) -> Vec<ProcessRow> {
        let Some(system) = self.system.as_mut() else {
            return Vec::new();
        };
        system.refresh_processes_specifics(
            ProcessesToUpdate::All,
            true,
            // Threads share their process's memory; list processes only.
            ProcessRefreshKind::nothing().with_memory().without_tasks(),
        );
        let processes = system.processes().values();
        let all = processes
            .filter(|process| process.thread_kind().is_none())
            .map(|process| ProcessRow {
                pid: process.pid().as_u32(),
                name: process.name().to_string_lossy().into_owned(),
                rss: process.memory(),
                gpu_bytes: None,
            });
        top_by_rss(all, limit, gpu)
    }
}

/// Keeps the `limit` largest by RSS and any process holding GPU memory.
pub fn top_by_rss(
    processes: impl Iterator<Item = ProcessRow>,
    limit: usize,
    gpu: &[GpuProcess],
) -> Vec<ProcessRow> {
    let mut rows: Vec<ProcessRow> = processes
        .map(|mut row| {
            row.gpu_bytes = gpu.iter().find(|g| g.pid == row.pid).map(|g| g.bytes);
            row
        })
        .collect();
    rows.sort_by(|a, b| b.rss.cmp(&a.rss).then(a.pid.cmp(&b.pid)));
    let mut kept = 0;
    rows.retain(|row| {
        kept += 1;
        kept <= limit || row.gpu_bytes.is_some()
    });
    rows
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(pid: u32, rss: u64) -> ProcessRow {
        ProcessRow {
            pid,
            name: format!("p{pid}"),
            rss,
            gpu_bytes: None,
        }
    }

    #[test]
    fn keeps_largest_and_gpu_holders() {
        let rows = vec![row(1, 10), row(2, 30), row(3, 20), row(4, 5)];
        let gpu = [GpuProcess { pid: 4, bytes: 99 }];
        let top = top_by_rss(rows.into_iter(), 2, &gpu);
        let pids: Vec<u32> = top.iter().map(|r| r.pid).collect();
        assert_eq!(pids, vec![2, 3, 4]);
        assert_eq!(top[2].gpu_bytes, Some(99));
        assert_eq!(top[0].gpu_bytes, None);
    }

    #[test]
    fn reads_this_process_from_proc() {
        let mut table = ProcessTable::new();
        let rows = table.read(usize::MAX, &[]);
        let me = std::process::id();
        let mine = rows.iter().find(|r| r.pid == me);
        assert!(mine.is_some_and(|r| r.rss > 0), "own pid {me} missing");
    }
}
