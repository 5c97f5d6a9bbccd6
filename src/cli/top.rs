//! `sparkrt top`: the live memory monitor. The `tui/` crate draws; this
//! module feeds it host readings through the same probe and headroom
//! formula the plan uses.

use std::process::ExitCode;

use anyhow::{Context, Result};

use super::common::HostArgs;
use super::find_profile;
use crate::plan::memory::{self, HostFigures};
use crate::plan::profile::ProfileDraft;
use crate::plan::profile::{HostSection, KubeletMode};
use sparkrt_tui::{HostSnapshot, HostSource, TopOptions};

#[derive(Debug, clap::Args)]
pub struct TopArgs {
    /// Base URL of a running `sparkrt serve` (host panels only without one).
    #[arg(long, default_value = "http://127.0.0.1:8000")]
    pub url: String,
    #[command(flatten)]
    pub host: HostArgs,
    /// Time between samples, e.g. 500ms or 2s.
    #[arg(long, default_value = "500ms")]
    pub interval: String,
    /// Profile whose [host] reserves draw the usable line [default: built-in reserves].
    #[arg(long)]
    pub profile: Option<String>,
}

/// Host readings for the monitor, from `--host-root`.
struct ProbeSource {
    host: HostArgs,
    reserves: HostSection,
}

impl HostSource for ProbeSource {
    fn read(&mut self) -> Result<HostSnapshot, String> {
        let reading = self
            .host
            .read(self.reserves.kubelet)
            .map_err(|e| format!("{e:#}"))?;
        let figures: HostFigures = crate::plan::host_figures(&reading);
        let headroom = memory::headroom(
            &figures,
            self.reserves.os_reserve.0,
            self.reserves.safety_margin.0,
        );
        let mut snapshot = reading.meminfo.to_wire(
            reading.kubepods.as_ref(),
            [
                figures.system_reserved,
                figures.kube_reserved,
                figures.eviction_hard,
            ],
        );
        snapshot.usable = u64::try_from(headroom.usable).ok();
        Ok(snapshot)
    }
}

pub fn run(args: &TopArgs) -> Result<ExitCode> {
    let reserves = match &args.profile {
        // Only the reserves: a profile that leaves its geometry to the
        // checkpoint is fine here.
        Some(p) => ProfileDraft::load(&find_profile(p)?)?.host().clone(),
        None => HostSection {
            kubelet: KubeletMode::Auto,
            ..HostSection::default()
        },
    };
    let interval = sparkrt_tui::parse_interval(&args.interval)
        .with_context(|| format!("--interval {:?}", args.interval))?;
    let options = TopOptions {
        server_url: args.url.trim_end_matches('/').to_string(),
        interval,
        ..TopOptions::default()
    };
    let source = ProbeSource {
        host: args.host.clone(),
        reserves,
    };
    // Fail fast on a bad host tree rather than inside the full-screen UI.
    let mut probe = ProbeSource {
        host: source.host.clone(),
        reserves: source.reserves.clone(),
    };
    probe.read().map_err(anyhow::Error::msg)?;
    sparkrt_tui::run(options, Box::new(source))
        .map_err(|e| super::RuntimeFailure(anyhow::anyhow!("{e}")))?;
    Ok(ExitCode::SUCCESS)
}
