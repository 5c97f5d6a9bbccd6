//! `sparkrt k8s`: plans the profile for the node the pods will run on (the
//! built-in GB10 node, a node's host tree or a node spec file; or this
//! machine with `--host-root`) and prints the manifests `deploy::k8s`
//! builds from the plan; a plan that does not fit produces no manifest at
//! all (exit 3).

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result};

use super::common::{HostArgs, ServingArgs, resolve_profile};
use super::plan::planning_what;
use super::{EXIT_DOES_NOT_FIT, find_profile};
use crate::deploy::k8s::{
    ApiKeySecret, DEFAULT_IMAGE, K8sError, ManifestInputs, Workload, build, default_model_dir,
    to_yaml,
};
use crate::deploy::node::NodeSpec;
use crate::plan::profile::Profile;
use crate::plan::{Plan, PlanDevice, report};
use crate::runtime::{RuntimeError, plan_profile, plan_profile_on};

#[derive(Debug, clap::Args)]
pub struct K8sArgs {
    /// Profile: a path or a name from profiles/ (e.g. qwen3-30b-a3b-nvfp4).
    #[arg(long, value_name = "PROFILE")]
    pub profile: String,
    /// Run this many pods as a Deployment.
    #[arg(long, value_name = "N", default_value_t = 1,
          value_parser = clap::value_parser!(i32).range(1..), conflicts_with = "daemonset")]
    pub replicas: i32,
    /// Run one pod on every GB10 node (a DaemonSet) instead of a Deployment.
    #[arg(long)]
    pub daemonset: bool,
    /// The model folder on each node, mounted read-only into the pod
    /// [default: /srv/sparkrt/models/<profile name>].
    #[arg(long, value_name = "PATH")]
    pub model_dir: Option<PathBuf>,
    /// Container image that has `sparkrt` on its PATH.
    #[arg(long, value_name = "IMG", default_value = DEFAULT_IMAGE)]
    pub image: String,
    /// The Kubernetes Secret (and its key, default `api-key`) holding the
    /// API key: mounted read-only and passed as `--api-key-file`. Without
    /// it the pods serve with `--insecure-no-api-key` (a warning is printed).
    #[arg(long, value_name = "NAME[:KEY]")]
    pub api_key_secret: Option<String>,
    /// Plan against this node's host tree (its /proc/meminfo, kubelet
    /// configuration and kubepods cgroup) [default: the built-in GB10 node].
    #[arg(long, value_name = "DIR", conflicts_with_all = ["node_spec", "host_root"])]
    pub node_host_root: Option<PathBuf>,
    /// Plan against a node spec file (TOML: mem_total, mem_available,
    /// system_reserved, kube_reserved, eviction_hard, kubepods_in_use).
    #[arg(long, value_name = "FILE", conflicts_with = "host_root")]
    pub node_spec: Option<PathBuf>,
    /// Plan against this machine, read below DIR (as `plan --host-root`
    /// does), e.g. when run on a node.
    #[arg(long, value_name = "DIR")]
    pub host_root: Option<PathBuf>,
    /// Kubelet configuration file for --host-root / --node-host-root
    /// [default: <root>/var/lib/kubelet/config.yaml if present].
    #[arg(long, value_name = "FILE")]
    pub kubelet_config: Option<PathBuf>,
}

/// The node the plan is for, as the flags name it.
enum Node {
    /// This machine below a root: planned for its own device, as `plan` does.
    Local(PathBuf),
    /// A node's host tree.
    Tree(PathBuf),
    /// The built-in GB10 node or a spec file.
    Spec(NodeSpec),
}

impl K8sArgs {
    fn node(&self) -> Result<Node> {
        Ok(
            match (&self.host_root, &self.node_host_root, &self.node_spec) {
                (Some(root), _, _) => Node::Local(root.clone()),
                (_, Some(root), _) => Node::Tree(root.clone()),
                (_, _, Some(file)) => Node::Spec(NodeSpec::load(file)?),
                (None, None, None) => Node::Spec(NodeSpec::gb10()),
            },
        )
    }

    /// Plans `profile` for the node; says on stderr which node it is.
    fn plan_for_node(&self, profile: &Profile, checkpoint: Option<&Path>) -> Result<Plan> {
        let host_args = |root: &Path| HostArgs {
            host_root: root.to_path_buf(),
            kubelet_config: self.kubelet_config.clone(),
        };
        // A GB10 node has its GPU: `device = "auto"` plans for CUDA there.
        let node_device = PlanDevice::resolve(profile.backend.device, true);
        let plan = match self.node()? {
            Node::Local(root) => {
                eprintln!(
                    "sparkrt: planning for this machine below {}",
                    root.display()
                );
                let host = host_args(&root);
                plan_profile(profile, checkpoint, &host.source())
                    .with_context(|| planning_what(checkpoint, &host))?
            }
            Node::Tree(root) => {
                eprintln!("sparkrt: planning for the node below {}", root.display());
                let host = host_args(&root);
                let reading = host.read(profile.host.kubelet)?;
                plan_profile_on(
                    profile,
                    checkpoint,
                    &crate::plan::host_figures(&reading),
                    node_device,
                )
                .with_context(|| planning_what(checkpoint, &host))?
            }
            Node::Spec(spec) => {
                eprintln!("sparkrt: planning for {}", spec.describe());
                plan_profile_on(profile, checkpoint, &spec.figures(), node_device).map_err(
                    |e: RuntimeError| anyhow::Error::from(e).context("planning for the node"),
                )?
            }
        };
        Ok(plan)
    }
}

pub fn run(args: &K8sArgs) -> Result<ExitCode> {
    let api_key = args
        .api_key_secret
        .as_deref()
        .map(ApiKeySecret::parse)
        .transpose()?;
    // Resolve the profile once, so the plan and the ConfigMap use one file.
    let profile_path = find_profile(&args.profile)?;
    let profile_text = crate::util::files::read_regular_to_string(
        &profile_path,
        crate::limits::MAX_SMALL_FILE_BYTES,
    )
    .map_err(|source| K8sError::ReadProfile {
        path: profile_path.clone(),
        source,
    })?;
    let profile_file = file_name(&profile_path);
    let model_dir = match &args.model_dir {
        Some(dir) => dir.clone(),
        None => default_model_dir(&profile_file),
    };
    // The folder is a node path; the profile is laid over its config.json
    // and its headers read only where it also exists here (e.g. on a node).
    let resolved = resolve_profile(
        Some(&profile_path.display().to_string()),
        model_dir.is_dir().then_some(model_dir.as_path()),
        &ServingArgs::default(),
        false,
    )?;
    let plan = args.plan_for_node(&resolved.profile, resolved.checkpoint.as_deref())?;
    if !plan.fits {
        eprint!("{}", report::render(&plan));
        eprintln!("refusing to write manifests: the plan does not fit the node");
        return Ok(ExitCode::from(EXIT_DOES_NOT_FIT));
    }
    let workload = if args.daemonset {
        Workload::DaemonSet
    } else {
        Workload::Deployment {
            replicas: args.replicas,
        }
    };
    let manifests = build(&ManifestInputs {
        profile_file,
        profile_text,
        model_dir,
        image: args.image.clone(),
        workload,
        plan: &plan,
        api_key,
    })?;
    if args.api_key_secret.is_none() {
        eprintln!(
            "warning: no --api-key-secret: the pods listen on 0.0.0.0 with --insecure-no-api-key, \
             so anyone who reaches the Service can use the model"
        );
    }
    print!("{}", to_yaml(&manifests, &plan)?);
    Ok(ExitCode::SUCCESS)
}

fn file_name(path: &Path) -> String {
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| path.display().to_string())
}
