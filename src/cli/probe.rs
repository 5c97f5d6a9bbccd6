//! `sparkrt probe`: what the host looks like to sparkrt; with `--snapshot`,
//! the reading the monitor (`sparkrt-top`) draws, which it runs this for.

use std::process::ExitCode;

use anyhow::Result;
use serde::Serialize;
use sparkrt_wire::HostSnapshot;

use super::common::HostArgs;
use super::find_profile;
use crate::host::{GpuProbe, HostReading, gpu};
use crate::plan::memory;
use crate::plan::profile::{HostSection, KubeletMode, ProfileDraft};
use crate::units::format_bytes;

#[derive(Debug, clap::Args)]
pub struct ProbeArgs {
    #[command(flatten)]
    pub host: HostArgs,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
    /// With --json: print the reading `sparkrt top` draws instead (memory,
    /// kubepods and kubelet figures, and `usable`, the plan's headroom on
    /// this reading); no GPU probe.
    #[arg(long, requires = "json")]
    pub snapshot: bool,
    /// With --snapshot: the profile whose [host] reserves give `usable`
    /// [default: built-in reserves].
    #[arg(long, requires = "snapshot")]
    pub profile: Option<String>,
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
    if args.snapshot {
        let reserves = snapshot_reserves(args.profile.as_deref())?;
        let snapshot = snapshot(&args.host, &reserves)?;
        println!("{}", serde_json::to_string(&snapshot)?);
        return Ok(ExitCode::SUCCESS);
    }
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

/// The reserves a snapshot's `usable` is computed with: `profile`'s `[host]`
/// section, else the built-in reserves with the kubelet found if present.
fn snapshot_reserves(profile: Option<&str>) -> Result<HostSection> {
    Ok(match profile {
        // Only the reserves: a profile that leaves its geometry to the
        // checkpoint is fine here.
        Some(p) => ProfileDraft::load(&find_profile(p)?)?.host().clone(),
        None => HostSection {
            kubelet: KubeletMode::Auto,
            ..HostSection::default()
        },
    })
}

/// One reading of the host as the monitor draws it, with the plan's
/// headroom (`plan::memory::headroom`, the plan's own formula) for it.
fn snapshot(host: &HostArgs, reserves: &HostSection) -> Result<HostSnapshot> {
    let reading = host.read(reserves.kubelet)?;
    let figures = crate::plan::host_figures(&reading);
    let headroom = memory::headroom(&figures, reserves.os_reserve.0, reserves.safety_margin.0);
    let mut snapshot = reading.meminfo.to_wire(
        reading.kubepods.as_ref(),
        [
            figures.system_reserved,
            figures.kube_reserved,
            figures.eviction_hard,
        ],
    );
    // Negative headroom: nothing is usable, and no line is drawn.
    snapshot.usable = u64::try_from(headroom.usable).ok();
    Ok(snapshot)
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
        out += &format!("  {label:<34}{:>14}\n", format_bytes(bytes));
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
                format_bytes(k.system_reserved)
            );
            out += &format!(
                "  kubeReserved.memory               {:>14}\n",
                format_bytes(k.kube_reserved)
            );
            out += &format!(
                "  evictionHard memory.available     {:>14}  ({})\n",
                format_bytes(r.eviction_hard()),
                k.eviction_hard
            );
        }
    }
    match &r.kubepods {
        None => out += "  kubepods cgroup: none\n",
        Some(c) => {
            out += &format!(
                "  kubepods memory.current           {:>14}\n",
                format_bytes(c.current)
            );
            out += &format!(
                "  kubepods memory.max               {:>14}\n",
                c.max.map_or("max".to_string(), format_bytes)
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
                    format_bytes(d.total_memory)
                );
            }
        }
    }
    out
}
