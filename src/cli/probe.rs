//! `sparkrt probe`: what the host looks like to sparkrt.

use std::process::ExitCode;

use anyhow::Result;
use serde::Serialize;

use super::common::HostArgs;
use crate::host::{GpuProbe, HostReading, gpu};
use crate::plan::profile::KubeletMode;
use crate::units::format_gib;

#[derive(Debug, clap::Args)]
pub struct ProbeArgs {
    #[command(flatten)]
    pub host: HostArgs,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

#[derive(Serialize)]
struct ProbeReport<'a> {
    #[serde(flatten)]
    reading: &'a HostReading,
    /// `evictionHard["memory.available"]` resolved to bytes (0 without a kubelet).
    eviction_hard_bytes: u64,
    gpu: &'a GpuProbe,
}

pub fn run(args: &ProbeArgs) -> Result<ExitCode> {
    let reading = args.host.read(KubeletMode::Auto)?;
    let gpu = gpu::probe();
    if args.json {
        let report = ProbeReport {
            reading: &reading,
            eviction_hard_bytes: reading.eviction_hard(),
            gpu: &gpu,
        };
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", render(&reading, &gpu));
    }
    Ok(ExitCode::SUCCESS)
}

fn render(r: &HostReading, gpu: &GpuProbe) -> String {
    let m = &r.meminfo;
    let mut out = format!(
        "host root: {}\n\nmemory (/proc/meminfo)\n",
        r.root.display()
    );
    for (label, bytes) in [
        ("MemTotal", m.mem_total),
        ("MemAvailable", m.mem_available),
        ("MemFree", m.mem_free),
        ("Cached", m.cached),
        ("Buffers", m.buffers),
        ("Shmem", m.shmem),
        ("SwapTotal", m.swap_total),
        ("SwapFree", m.swap_free),
        ("in use (MemTotal - MemAvailable)", m.in_use()),
    ] {
        out += &format!("  {label:<34}{:>14}\n", format_gib(bytes));
    }
    out += "\nkubelet\n";
    match &r.kubelet {
        None => out += "  none (no kubelet configuration found)\n",
        Some(k) => {
            out += &format!(
                "  config                            {}\n",
                k.config_path.display()
            );
            out += &format!(
                "  systemReserved.memory             {:>14}\n",
                format_gib(k.system_reserved)
            );
            out += &format!(
                "  kubeReserved.memory               {:>14}\n",
                format_gib(k.kube_reserved)
            );
            out += &format!(
                "  evictionHard memory.available     {:>14}  ({})\n",
                format_gib(r.eviction_hard()),
                k.eviction_hard
            );
        }
    }
    match &r.kubepods {
        None => out += "  kubepods cgroup: none\n",
        Some(c) => {
            out += &format!(
                "  kubepods memory.current           {:>14}\n",
                format_gib(c.current)
            );
            out += &format!(
                "  kubepods memory.max               {:>14}\n",
                c.max.map_or("max".to_string(), format_gib)
            );
        }
    }
    out += "\ngpu\n";
    match gpu {
        GpuProbe::Absent { reason } => out += &format!("  none: {reason}\n"),
        GpuProbe::Present { devices } => {
            for d in devices {
                out += &format!(
                    "  [{}] {} ({}, compute {}.{}), {}, {}\n",
                    d.ordinal,
                    d.name,
                    d.arch(),
                    d.compute_capability.0,
                    d.compute_capability.1,
                    if d.integrated {
                        "integrated: unified memory with the host"
                    } else {
                        "discrete"
                    },
                    format_gib(d.total_memory)
                );
            }
        }
    }
    out
}
