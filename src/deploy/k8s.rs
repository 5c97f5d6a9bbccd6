//! Kubernetes manifests for a fleet of GB10 nodes (what `sparkrt k8s` prints).
//!
//! The objects are built from the typed structures of the `k8s-openapi`
//! crate, so every field name and type is the API server's own and the YAML
//! is valid by construction.
//!
//! The pod's memory request and limit are the plan's total. On a Spark, CUDA
//! allocations in the unified pool are not charged to the pod's cgroup, so the
//! request is the only way the scheduler learns the pod's real footprint; a
//! plan that does not fit produces no manifest at all (exit 3).
//!
//! What is printed, in order: a ConfigMap holding the profile (the pod plans
//! with exactly the file planned here), a Deployment or DaemonSet, a Service.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use k8s_openapi::api::apps::v1::{
    DaemonSet, DaemonSetSpec, DaemonSetUpdateStrategy, Deployment, DeploymentSpec,
    DeploymentStrategy, RollingUpdateDaemonSet, RollingUpdateDeployment,
};
use k8s_openapi::api::core::v1::{
    Capabilities, ConfigMap, ConfigMapVolumeSource, Container, ContainerPort, EmptyDirVolumeSource,
    EnvVar, HTTPGetAction, HostPathVolumeSource, Lifecycle, LifecycleHandler, PodSpec,
    PodTemplateSpec, Probe, ResourceRequirements, SeccompProfile, SecretVolumeSource,
    SecurityContext, Service, ServicePort, ServiceSpec, SleepAction, Toleration, Volume,
    VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde::Serialize;

use crate::plan::Plan;
use crate::units::format_bytes;

/// Node label set by NVIDIA GPU feature discovery (part of the GPU operator):
/// the product name with spaces replaced by dashes.
pub const GB10_NODE_LABEL: &str = "nvidia.com/gpu.product";
/// The value of [`GB10_NODE_LABEL`] on a DGX Spark.
pub const GB10_PRODUCT: &str = "NVIDIA-GB10";
/// The extended resource the NVIDIA device plugin advertises.
pub const GPU_RESOURCE: &str = "nvidia.com/gpu";
/// The image used when `--image` is not given.
pub const DEFAULT_IMAGE: &str = concat!("sparkrt:", env!("CARGO_PKG_VERSION"));

/// The port `sparkrt serve` listens on inside the pod.
const PORT: i32 = 8000;
const PORT_NAME: &str = "http";
const MODEL_MOUNT: &str = "/models";
const PROFILE_MOUNT: &str = "/etc/sparkrt/profiles";
const CACHE_MOUNT: &str = "/var/cache/sparkrt";
/// Where the API key Secret is mounted (read-only).
const API_KEY_MOUNT: &str = "/etc/sparkrt/api-key";
/// The key in the Secret when `--api-key-secret` names none.
pub const DEFAULT_API_KEY_KEY: &str = "api-key";
/// Where a model folder is looked for on the node when `--model-dir` is not given.
const DEFAULT_MODEL_ROOT: &str = "/srv/sparkrt/models";
/// A non-root user that exists in distroless-style images.
const RUN_AS: i64 = 65532;
/// Time for endpoints to drop the pod before SIGTERM starts the drain.
const PRE_STOP_SLEEP_SECONDS: i64 = 10;
/// preStop sleep plus the time `serve` gets to finish requests in flight.
const TERMINATION_GRACE_SECONDS: i64 = 90;
/// Startup may load a 60+ GiB checkpoint and compile kernels: allow 15 minutes.
const STARTUP_PERIOD_SECONDS: i32 = 10;
const STARTUP_FAILURE_THRESHOLD: i32 = 90;

#[derive(Debug, thiserror::Error)]
pub enum K8sError {
    #[error("cannot read the profile {path}: {source}")]
    ReadProfile {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "the profile file name {file:?} yields no valid Kubernetes name (use letters, digits and dashes)"
    )]
    Name { file: String },
    #[error("the model folder must be an absolute path on the node, not {0}")]
    RelativeModelDir(PathBuf),
    #[error(
        "--api-key-secret {0:?}: expected NAME[:KEY], NAME a Kubernetes object name \
         (lower-case letters, digits, '-', '.'; at most 253) and KEY letters, digits, '-', '_', '.'"
    )]
    ApiKeySecret(String),
    #[error("cannot render YAML: {0}")]
    Yaml(#[from] serde_yaml_ng::Error),
}

/// The pod controller to emit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Workload {
    Deployment { replicas: i32 },
    DaemonSet,
}

/// Everything the manifests are made from.
#[derive(Clone, Debug)]
pub struct ManifestInputs<'a> {
    /// The profile's file name (`qwen3-30b-a3b-nvfp4.toml`); names the objects.
    pub profile_file: String,
    /// The profile's text, shipped in the ConfigMap.
    pub profile_text: String,
    /// The model folder on the node.
    pub model_dir: PathBuf,
    pub image: String,
    pub workload: Workload,
    pub plan: &'a Plan,
    /// The Secret holding the API key; `None` serves without one
    /// (`--insecure-no-api-key`: the pod listens on 0.0.0.0).
    pub api_key: Option<ApiKeySecret>,
}

/// A key in a Kubernetes Secret: `NAME[:KEY]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApiKeySecret {
    pub name: String,
    pub key: String,
}

impl ApiKeySecret {
    /// Parses `NAME[:KEY]` (KEY defaults to [`DEFAULT_API_KEY_KEY`]).
    pub fn parse(text: &str) -> Result<ApiKeySecret, K8sError> {
        let (name, key) = text.split_once(':').unwrap_or((text, DEFAULT_API_KEY_KEY));
        let name_ok = !name.is_empty()
            && name.len() <= 253
            && name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
            && name.starts_with(|c: char| c.is_ascii_alphanumeric())
            && name.ends_with(|c: char| c.is_ascii_alphanumeric());
        let key_ok = !key.is_empty()
            && key.len() <= 253
            && key != "."
            && key != ".."
            && key
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
        if !(name_ok && key_ok) {
            return Err(K8sError::ApiKeySecret(text.to_string()));
        }
        Ok(ApiKeySecret {
            name: name.to_string(),
            key: key.to_string(),
        })
    }

    /// The key's file inside the pod.
    pub fn path_in_pod(&self) -> String {
        format!("{API_KEY_MOUNT}/{}", self.key)
    }
}

/// The workload object: a Deployment or a DaemonSet.
#[derive(Clone, Debug, PartialEq)]
pub enum WorkloadObject {
    Deployment(Box<Deployment>),
    DaemonSet(Box<DaemonSet>),
}

/// The objects `sparkrt k8s` prints, in the order they are printed.
#[derive(Clone, Debug, PartialEq)]
pub struct Manifests {
    pub config_map: ConfigMap,
    pub workload: WorkloadObject,
    pub service: Service,
}

/// Builds the ConfigMap, the workload and the Service.
pub fn build(inputs: &ManifestInputs) -> Result<Manifests, K8sError> {
    if !inputs.model_dir.is_absolute() {
        return Err(K8sError::RelativeModelDir(inputs.model_dir.clone()));
    }
    let name = object_name(&inputs.profile_file)?;
    let labels = labels(&name);
    let meta = ObjectMeta {
        name: Some(name.clone()),
        labels: Some(labels.clone()),
        annotations: Some(annotations(inputs)),
        ..Default::default()
    };
    let selector = LabelSelector {
        match_labels: Some(labels.clone()),
        ..Default::default()
    };
    let template = PodTemplateSpec {
        metadata: Some(ObjectMeta {
            labels: Some(labels.clone()),
            ..Default::default()
        }),
        spec: Some(pod_spec(&name, inputs)),
    };
    let workload = match inputs.workload {
        Workload::Deployment { replicas } => WorkloadObject::Deployment(Box::new(Deployment {
            metadata: meta.clone(),
            spec: Some(DeploymentSpec {
                replicas: Some(replicas),
                selector,
                template,
                // One GB10 holds one pod: replace pods one at a time in place
                // rather than surging a pod that no node has room for.
                strategy: Some(DeploymentStrategy {
                    type_: Some("RollingUpdate".into()),
                    rolling_update: Some(RollingUpdateDeployment {
                        max_surge: Some(IntOrString::Int(0)),
                        max_unavailable: Some(IntOrString::Int(1)),
                    }),
                }),
                ..Default::default()
            }),
            ..Default::default()
        })),
        Workload::DaemonSet => WorkloadObject::DaemonSet(Box::new(DaemonSet {
            metadata: meta.clone(),
            spec: Some(DaemonSetSpec {
                selector,
                template,
                update_strategy: Some(DaemonSetUpdateStrategy {
                    type_: Some("RollingUpdate".into()),
                    rolling_update: Some(RollingUpdateDaemonSet {
                        max_unavailable: Some(IntOrString::Int(1)),
                        ..Default::default()
                    }),
                }),
                ..Default::default()
            }),
            ..Default::default()
        })),
    };
    let config_map = ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            labels: Some(labels.clone()),
            ..Default::default()
        },
        data: Some(BTreeMap::from([(
            inputs.profile_file.clone(),
            inputs.profile_text.clone(),
        )])),
        ..Default::default()
    };
    let service = Service {
        metadata: ObjectMeta {
            name: Some(name),
            labels: Some(labels.clone()),
            ..Default::default()
        },
        spec: Some(ServiceSpec {
            type_: Some("ClusterIP".into()),
            selector: Some(labels),
            ports: Some(vec![ServicePort {
                name: Some(PORT_NAME.into()),
                port: PORT,
                target_port: Some(IntOrString::String(PORT_NAME.into())),
                protocol: Some("TCP".into()),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        ..Default::default()
    };
    Ok(Manifests {
        config_map,
        workload,
        service,
    })
}

/// The objects as a multi-document YAML stream, after a comment that says
/// what was planned.
pub fn to_yaml(manifests: &Manifests, plan: &Plan) -> Result<String, K8sError> {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "# sparkrt k8s: {} plans {} ({} bytes) of {} usable; memory request = limit = the plan total.",
        plan.profile,
        format_bytes(plan.total),
        plan.total,
        format_bytes(u64::try_from(plan.host.usable).unwrap_or(0)),
    );
    let _ = writeln!(
        out,
        "# Pods run only on nodes labelled {GB10_NODE_LABEL}={GB10_PRODUCT} (NVIDIA GPU feature discovery)."
    );
    if !serves_with_a_key(manifests) {
        let _ = writeln!(
            out,
            "# WARNING: no --api-key-secret: the pods serve on 0.0.0.0 with --insecure-no-api-key; \
             anyone who reaches the Service can use the model."
        );
    }
    push_document(&mut out, &manifests.config_map)?;
    match &manifests.workload {
        WorkloadObject::Deployment(d) => push_document(&mut out, d)?,
        WorkloadObject::DaemonSet(d) => push_document(&mut out, d)?,
    }
    push_document(&mut out, &manifests.service)?;
    Ok(out)
}

/// Whether the container is given an API key file.
fn serves_with_a_key(manifests: &Manifests) -> bool {
    let spec = match &manifests.workload {
        WorkloadObject::Deployment(d) => d.spec.as_ref().and_then(|s| s.template.spec.as_ref()),
        WorkloadObject::DaemonSet(d) => d.spec.as_ref().and_then(|s| s.template.spec.as_ref()),
    };
    spec.and_then(|s| s.containers.first())
        .and_then(|c| c.args.as_ref())
        .is_some_and(|args| args.iter().any(|a| a == "--api-key-file"))
}

fn push_document(out: &mut String, object: &impl Serialize) -> Result<(), K8sError> {
    out.push_str("---\n");
    out.push_str(&serde_yaml_ng::to_string(object)?);
    Ok(())
}

fn pod_spec(name: &str, inputs: &ManifestInputs) -> PodSpec {
    PodSpec {
        containers: vec![container(inputs)],
        node_selector: Some(BTreeMap::from([(
            GB10_NODE_LABEL.to_string(),
            GB10_PRODUCT.to_string(),
        )])),
        // GPU nodes are commonly tainted so that only GPU pods land there.
        tolerations: Some(vec![Toleration {
            key: Some(GPU_RESOURCE.into()),
            operator: Some("Exists".into()),
            effect: Some("NoSchedule".into()),
            ..Default::default()
        }]),
        termination_grace_period_seconds: Some(TERMINATION_GRACE_SECONDS),
        // sparkrt never talks to the API server.
        automount_service_account_token: Some(false),
        enable_service_links: Some(false),
        volumes: Some(
            vec![
                Volume {
                    name: "model".into(),
                    host_path: Some(HostPathVolumeSource {
                        path: inputs.model_dir.display().to_string(),
                        // Must already exist: a missing checkpoint is an error,
                        // not an empty folder created on the node.
                        type_: Some("Directory".into()),
                    }),
                    ..Default::default()
                },
                Volume {
                    name: "profile".into(),
                    config_map: Some(ConfigMapVolumeSource {
                        name: name.to_string(),
                        ..Default::default()
                    }),
                    ..Default::default()
                },
                Volume {
                    name: "cache".into(),
                    empty_dir: Some(EmptyDirVolumeSource {
                        size_limit: Some(Quantity("2Gi".into())),
                        ..Default::default()
                    }),
                    ..Default::default()
                },
                Volume {
                    name: "tmp".into(),
                    empty_dir: Some(EmptyDirVolumeSource::default()),
                    ..Default::default()
                },
            ]
            .into_iter()
            .chain(inputs.api_key.as_ref().map(|secret| Volume {
                name: "api-key".into(),
                secret: Some(SecretVolumeSource {
                    secret_name: Some(secret.name.clone()),
                    // A missing Secret keeps the pod from starting rather than
                    // serving without a key.
                    optional: Some(false),
                    items: Some(vec![k8s_openapi::api::core::v1::KeyToPath {
                        key: secret.key.clone(),
                        path: secret.key.clone(),
                        ..Default::default()
                    }]),
                    ..Default::default()
                }),
                ..Default::default()
            }))
            .collect(),
        ),
        ..Default::default()
    }
}

fn container(inputs: &ManifestInputs) -> Container {
    let total = Quantity(inputs.plan.total.to_string());
    let resources = BTreeMap::from([
        ("memory".to_string(), total),
        (GPU_RESOURCE.to_string(), Quantity("1".into())),
    ]);
    let profile_in_pod = format!("{PROFILE_MOUNT}/{}", inputs.profile_file);
    let http_get = |path: &str| HTTPGetAction {
        path: Some(path.into()),
        port: IntOrString::String(PORT_NAME.into()),
        ..Default::default()
    };
    let mut args: Vec<String> = [
        "serve",
        "--profile",
        &profile_in_pod,
        "--model",
        MODEL_MOUNT,
        // The Service reaches the pod on its own IP, not loopback.
        "--host",
        "0.0.0.0",
        "--port",
        &PORT.to_string(),
    ]
    .into_iter()
    .map(String::from)
    .collect();
    // Not loopback: serve refuses to start without a key unless told.
    match &inputs.api_key {
        Some(secret) => args.extend(["--api-key-file".to_string(), secret.path_in_pod()]),
        None => args.push("--insecure-no-api-key".to_string()),
    }
    let mut mounts = vec![
        mount("model", MODEL_MOUNT, true),
        mount("profile", PROFILE_MOUNT, true),
        mount("cache", CACHE_MOUNT, false),
        mount("tmp", "/tmp", false),
    ];
    if inputs.api_key.is_some() {
        mounts.push(mount("api-key", API_KEY_MOUNT, true));
    }
    Container {
        name: "sparkrt".into(),
        image: Some(inputs.image.clone()),
        command: Some(vec!["sparkrt".into()]),
        args: Some(args),
        env: Some(vec![EnvVar {
            name: "SPARKRT_CACHE_DIR".into(),
            value: Some(CACHE_MOUNT.into()),
            ..Default::default()
        }]),
        ports: Some(vec![ContainerPort {
            name: Some(PORT_NAME.into()),
            container_port: PORT,
            protocol: Some("TCP".into()),
            ..Default::default()
        }]),
        resources: Some(ResourceRequirements {
            requests: Some(resources.clone()),
            limits: Some(resources),
            ..Default::default()
        }),
        startup_probe: Some(Probe {
            http_get: Some(http_get("/health")),
            period_seconds: Some(STARTUP_PERIOD_SECONDS),
            failure_threshold: Some(STARTUP_FAILURE_THRESHOLD),
            ..Default::default()
        }),
        liveness_probe: Some(Probe {
            http_get: Some(http_get("/health")),
            period_seconds: Some(10),
            timeout_seconds: Some(5),
            failure_threshold: Some(3),
            ..Default::default()
        }),
        // /ready also fails while the memory guard is tripped, which takes the
        // pod out of the Service without restarting it. Neither probe route
        // needs the API key.
        readiness_probe: Some(Probe {
            http_get: Some(http_get("/ready")),
            period_seconds: Some(5),
            timeout_seconds: Some(5),
            failure_threshold: Some(2),
            ..Default::default()
        }),
        // Sleep (a kubelet action, no shell needed in the image) while the
        // endpoints drop the pod; SIGTERM then makes serve drain.
        lifecycle: Some(Lifecycle {
            pre_stop: Some(LifecycleHandler {
                sleep: Some(SleepAction {
                    seconds: PRE_STOP_SLEEP_SECONDS,
                }),
                ..Default::default()
            }),
            ..Default::default()
        }),
        security_context: Some(SecurityContext {
            allow_privilege_escalation: Some(false),
            read_only_root_filesystem: Some(true),
            run_as_non_root: Some(true),
            run_as_user: Some(RUN_AS),
            run_as_group: Some(RUN_AS),
            capabilities: Some(Capabilities {
                drop: Some(vec!["ALL".into()]),
                ..Default::default()
            }),
            seccomp_profile: Some(SeccompProfile {
                type_: "RuntimeDefault".into(),
                ..Default::default()
            }),
            ..Default::default()
        }),
        volume_mounts: Some(mounts),
        ..Default::default()
    }
}

fn mount(name: &str, path: &str, read_only: bool) -> VolumeMount {
    VolumeMount {
        name: name.into(),
        mount_path: path.into(),
        read_only: Some(read_only),
        ..Default::default()
    }
}

fn labels(name: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        ("app.kubernetes.io/name".to_string(), "sparkrt".to_string()),
        ("app.kubernetes.io/instance".to_string(), name.to_string()),
    ])
}

/// What was planned, readable with `kubectl describe`.
fn annotations(inputs: &ManifestInputs) -> BTreeMap<String, String> {
    let plan = inputs.plan;
    BTreeMap::from([
        ("sparkrt/profile".to_string(), inputs.profile_file.clone()),
        (
            "sparkrt/plan-total-bytes".to_string(),
            plan.total.to_string(),
        ),
        (
            "sparkrt/plan-usable-bytes".to_string(),
            plan.host.usable.to_string(),
        ),
        (
            "sparkrt/plan-estimated".to_string(),
            plan.estimated.to_string(),
        ),
    ])
}

/// `sparkrt-<profile stem>` as a DNS-1123 label: lowercase letters, digits
/// and dashes, at most 63 characters, starting and ending alphanumeric.
pub fn object_name(profile_file: &str) -> Result<String, K8sError> {
    let stem: String = profile_stem(profile_file)
        .chars()
        .map(|c| c.to_ascii_lowercase())
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    let stem = stem.trim_matches('-');
    if stem.is_empty() {
        return Err(K8sError::Name {
            file: profile_file.to_string(),
        });
    }
    let mut name = format!("sparkrt-{stem}");
    name.truncate(63);
    Ok(name.trim_end_matches('-').to_string())
}

/// Where the model folder is looked for on the node when none is given:
/// `/srv/sparkrt/models/<profile name>`.
pub fn default_model_dir(profile_file: &str) -> PathBuf {
    Path::new(DEFAULT_MODEL_ROOT).join(profile_stem(profile_file))
}

fn profile_stem(profile_file: &str) -> &str {
    profile_file.strip_suffix(".toml").unwrap_or(profile_file)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn object_names_are_dns_labels() {
        assert_eq!(
            object_name("qwen3-30b-a3b-nvfp4.toml").unwrap(),
            "sparkrt-qwen3-30b-a3b-nvfp4"
        );
        assert_eq!(
            object_name("My_Model.v2.toml").unwrap(),
            "sparkrt-my-model-v2"
        );
        assert!(matches!(object_name("__.toml"), Err(K8sError::Name { .. })));
        // 8 characters of prefix + 70 of stem, cut to 63, no trailing dash.
        let long = format!("{}-{}.toml", "a".repeat(54), "b".repeat(15));
        let name = object_name(&long).unwrap();
        assert_eq!(name.len(), 62, "{name}");
        assert!(name.ends_with('a'), "{name}");
    }
}
