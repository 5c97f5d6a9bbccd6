//! `sparkrt plan`: every byte budgeted before anything is allocated.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result, bail};

use super::EXIT_DOES_NOT_FIT;
use super::common::{HostArgs, Resolved, ServingArgs, resolve_profile};
use crate::plan::parallel::{NodeHost, ParallelError, check_world, plan_ranks};
use crate::plan::{Plan, host_figures, report};
use crate::runtime::{plan_device, plan_profile};

#[derive(Debug, clap::Args)]
pub struct PlanArgs {
    /// Profile: a path or a name from profiles/ (e.g. qwen3-30b-a3b-nvfp4)
    /// [default with --model: the built-in defaults over the checkpoint].
    #[arg(long, value_name = "PROFILE", required_unless_present = "model")]
    pub profile: Option<String>,
    /// Checkpoint folder: the geometry from its config.json and exact weight
    /// bytes from its safetensors headers [default: the profile's
    /// model.path, once downloaded].
    #[arg(long, value_name = "DIR")]
    pub model: Option<PathBuf>,
    #[command(flatten)]
    pub host: HostArgs,
    #[command(flatten)]
    pub serving: ServingArgs,
    /// Plan the model split over N nodes (vLLM's tensor-parallel layout
    /// with the experts sharded by id, as its --enable-expert-parallel
    /// does): each rank's share against its node's headroom; it fits only
    /// if every rank fits. Weights are estimated from the geometry.
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub tensor_parallel_size: usize,
    /// The host root of one node (repeat once per rank, in rank order; its
    /// kubelet config is read from <DIR>/var/lib/kubelet/config.yaml) [default:
    /// every rank on the host --host-root reads].
    #[arg(long, value_name = "DIR")]
    pub node_host_root: Vec<PathBuf>,
    /// Print one JSON object (all sizes in bytes) instead of the table.
    #[arg(long)]
    pub json: bool,
}

/// The profile `args` name, laid over the checkpoint's config and under the
/// serving flags.
fn resolve(args: &PlanArgs) -> Result<Resolved> {
    if args.profile.is_none() && args.model.is_none() {
        bail!("give --profile NAME, --model DIR, or both");
    }
    resolve_profile(
        args.profile.as_deref(),
        args.model.as_deref(),
        &args.serving,
        false,
    )
}

/// Plans as `args` ask: profile, flags, host, and the checkpoint if any.
fn make_plan(args: &PlanArgs) -> Result<Plan> {
    let resolved = resolve(args)?;
    let checkpoint = resolved.checkpoint.as_deref();
    plan_profile(&resolved.profile, checkpoint, &args.host.source())
        .with_context(|| planning_what(checkpoint, &args.host))
}

/// What a failed plan was reading: the checkpoint's headers, else the host.
pub fn planning_what(checkpoint: Option<&Path>, host: &HostArgs) -> String {
    match checkpoint {
        Some(dir) => format!("planning with the checkpoint in {}", dir.display()),
        None => format!("reading the host below {}", host.host_root.display()),
    }
}

pub fn run(args: &PlanArgs) -> Result<ExitCode> {
    if args.tensor_parallel_size != 1 || !args.node_host_root.is_empty() {
        return run_parallel(args);
    }
    let plan = make_plan(args)?;
    let text = (!args.json).then(|| report::render(&plan));
    print_plan(&plan, text, plan.fits)
}

/// Prints `plan` as JSON, or `text`; the exit code says whether it fits.
fn print_plan(plan: &impl serde::Serialize, text: Option<String>, fits: bool) -> Result<ExitCode> {
    match text {
        Some(text) => print!("{text}"),
        None => println!("{}", serde_json::to_string_pretty(plan)?),
    }
    Ok(if fits {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(EXIT_DOES_NOT_FIT)
    })
}

/// `plan --tensor-parallel-size N`: every rank against its node.
fn run_parallel(args: &PlanArgs) -> Result<ExitCode> {
    let world = args.tensor_parallel_size;
    check_world(world)?;
    if !args.node_host_root.is_empty() {
        // Each node is read from its own root: a flag naming this host's
        // files would not apply to it.
        if args.host.host_root != Path::new("/") || args.host.kubelet_config.is_some() {
            bail!(
                "--node-host-root reads each node's kubelet config below its own root: leave out --host-root and --kubelet-config"
            );
        }
        if args.node_host_root.len() != world {
            return Err(ParallelError::NodeCount {
                given: args.node_host_root.len(),
                world,
            }
            .into());
        }
    }
    let resolved = resolve(args)?;
    let profile = &resolved.profile;
    let kubelet = profile.host.kubelet;
    let nodes = if args.node_host_root.is_empty() {
        let figures = host_figures(&args.host.read(kubelet)?);
        let name = format!(
            "{} (every rank assumed alike)",
            args.host.host_root.display()
        );
        vec![NodeHost { name, figures }; world]
    } else {
        args.node_host_root
            .iter()
            .map(|root| {
                let node = HostArgs {
                    host_root: root.clone(),
                    kubelet_config: None,
                };
                Ok(NodeHost {
                    name: root.display().to_string(),
                    figures: host_figures(&node.read(kubelet)?),
                })
            })
            .collect::<Result<Vec<_>>>()?
    };
    let plan = plan_ranks(profile, &nodes, plan_device(profile))?;
    let text = (!args.json).then(|| report::render_parallel(&plan));
    print_plan(&plan, text, plan.fits)
}
