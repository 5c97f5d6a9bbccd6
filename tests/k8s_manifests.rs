//! `sparkrt k8s` against the fake host trees: the YAML parses back into the
//! typed Kubernetes structures without losing a field, the memory request is
//! the total `sparkrt plan --json` prints for the same host, and a plan that
//! does not fit yields no manifest.

use crate::common;

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::core::v1::{ConfigMap, Container, PodSpec, PodTemplateSpec, Service};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde::Deserialize;
use serde::de::DeserializeOwned;

use common::*;

const MODEL_DIR: &str = "/srv/models/qwen3-30b-a3b-fp4";

fn host(name: &str) -> String {
    fixture(&format!("hosts/{name}")).display().to_string()
}

fn k8s(profile_name: &str, host_root: &str, extra: &[&str]) -> std::process::Output {
    let profile_path = profile(profile_name).display().to_string();
    let mut args = vec![
        "k8s",
        "--profile",
        &profile_path,
        "--host-root",
        host_root,
        "--model-dir",
        MODEL_DIR,
    ];
    args.extend_from_slice(extra);
    sparkrt(&args)
}

fn plan_total(profile_name: &str, host_root: &str) -> u64 {
    let out = sparkrt(&[
        "plan",
        "--profile",
        &profile(profile_name).display().to_string(),
        "--host-root",
        host_root,
        "--json",
    ]);
    json(&out)["total"].as_u64().unwrap()
}

/// The YAML stream's documents, as untyped values.
fn documents(text: &str) -> Vec<serde_yaml_ng::Value> {
    serde_yaml_ng::Deserializer::from_str(text)
        .map(|doc| serde_yaml_ng::Value::deserialize(doc).unwrap())
        .collect()
}

/// Parses a document into `T` and checks that `T` carries every field of it:
/// serialising the typed value again gives the same document back.
fn typed<T: DeserializeOwned + serde::Serialize>(doc: &serde_yaml_ng::Value) -> T {
    let value: T = serde_yaml_ng::from_value(doc.clone())
        .unwrap_or_else(|e| panic!("not a {}: {e}\n{doc:?}", std::any::type_name::<T>()));
    let again = serde_yaml_ng::to_value(&value).unwrap();
    assert_eq!(
        &again,
        doc,
        "a field was lost in {}",
        std::any::type_name::<T>()
    );
    value
}

struct Parsed {
    config_map: ConfigMap,
    deployment: Option<Deployment>,
    daemon_set: Option<DaemonSet>,
    service: Service,
}

fn parse(text: &str) -> Parsed {
    let docs = documents(text);
    assert_eq!(docs.len(), 3, "ConfigMap, workload, Service:\n{text}");
    let kind = |d: &serde_yaml_ng::Value| d["kind"].as_str().unwrap().to_string();
    assert_eq!(kind(&docs[0]), "ConfigMap");
    assert_eq!(kind(&docs[2]), "Service");
    let (deployment, daemon_set) = match kind(&docs[1]).as_str() {
        "Deployment" => (Some(typed(&docs[1])), None),
        "DaemonSet" => (None, Some(typed(&docs[1]))),
        other => panic!("unexpected workload {other}"),
    };
    Parsed {
        config_map: typed(&docs[0]),
        deployment,
        daemon_set,
        service: typed(&docs[2]),
    }
}

fn template(parsed: &Parsed) -> &PodTemplateSpec {
    match (&parsed.deployment, &parsed.daemon_set) {
        (Some(d), None) => &d.spec.as_ref().unwrap().template,
        (None, Some(d)) => &d.spec.as_ref().unwrap().template,
        _ => unreachable!(),
    }
}

fn pod(parsed: &Parsed) -> &PodSpec {
    template(parsed).spec.as_ref().unwrap()
}

fn container(parsed: &Parsed) -> &Container {
    let containers = &pod(parsed).containers;
    assert_eq!(containers.len(), 1);
    &containers[0]
}

/// The value following `flag` in the container's arguments.
fn arg_after<'a>(c: &'a Container, flag: &str) -> &'a str {
    let args = c.args.as_ref().unwrap();
    let at = args
        .iter()
        .position(|a| a == flag)
        .unwrap_or_else(|| panic!("no {flag}: {args:?}"));
    &args[at + 1]
}

#[test]
fn memory_request_and_limit_are_the_plan_total() {
    for (profile_name, host_name) in [
        ("qwen3-30b-a3b-nvfp4", "spark"),
        ("qwen3-moe-tiny", "box24"),
    ] {
        let out = k8s(profile_name, &host(host_name), &[]);
        assert!(out.status.success(), "{}", stderr(&out));
        let parsed = parse(&stdout(&out));
        let total = plan_total(profile_name, &host(host_name));
        let resources = container(&parsed).resources.as_ref().unwrap();
        let expected = BTreeMap::from([
            ("memory".to_string(), Quantity(total.to_string())),
            ("nvidia.com/gpu".to_string(), Quantity("1".into())),
        ]);
        assert_eq!(
            resources.requests.as_ref(),
            Some(&expected),
            "{profile_name}"
        );
        assert_eq!(resources.limits.as_ref(), Some(&expected), "{profile_name}");
    }
}

#[test]
fn deployment_for_gb10_nodes_parses_back_into_typed_structures() {
    let out = k8s(
        "qwen3-30b-a3b-nvfp4",
        &host("spark"),
        &["--replicas", "3", "--image", "registry.local/sparkrt:1"],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let parsed = parse(&stdout(&out));
    let deployment = parsed.deployment.as_ref().unwrap();
    let spec = deployment.spec.as_ref().unwrap();
    assert_eq!(spec.replicas, Some(3));
    let name = deployment.metadata.name.as_deref().unwrap();
    assert_eq!(name, "sparkrt-qwen3-30b-a3b-nvfp4");

    // Scheduled on GB10 nodes only, with the GPU.
    let pod = pod(&parsed);
    assert_eq!(
        pod.node_selector
            .as_ref()
            .unwrap()
            .get("nvidia.com/gpu.product")
            .map(String::as_str),
        Some("NVIDIA-GB10")
    );
    let c = container(&parsed);
    assert_eq!(c.image.as_deref(), Some("registry.local/sparkrt:1"));

    // The model folder: a hostPath that must exist, mounted read-only where serve reads it.
    let volumes = pod.volumes.as_ref().unwrap();
    let model = volumes.iter().find(|v| v.name == "model").unwrap();
    let host_path = model.host_path.as_ref().unwrap();
    assert_eq!(host_path.path, MODEL_DIR);
    assert_eq!(host_path.type_.as_deref(), Some("Directory"));
    let mounts = c.volume_mounts.as_ref().unwrap();
    let model_mount = mounts.iter().find(|m| m.name == "model").unwrap();
    assert_eq!(model_mount.read_only, Some(true));
    assert_eq!(arg_after(c, "--model"), model_mount.mount_path);

    // The profile travels in the ConfigMap, byte for byte, and serve reads it there.
    let profile_text = std::fs::read_to_string(profile("qwen3-30b-a3b-nvfp4")).unwrap();
    let data = parsed.config_map.data.as_ref().unwrap();
    assert_eq!(data.get("qwen3-30b-a3b-nvfp4.toml"), Some(&profile_text));
    let profile_volume = volumes.iter().find(|v| v.name == "profile").unwrap();
    assert_eq!(
        profile_volume.config_map.as_ref().unwrap().name,
        parsed.config_map.metadata.name.clone().unwrap()
    );
    let profile_mount = mounts.iter().find(|m| m.name == "profile").unwrap();
    assert_eq!(
        arg_after(c, "--profile"),
        format!("{}/qwen3-30b-a3b-nvfp4.toml", profile_mount.mount_path)
    );

    // The cache is writable and named to serve.
    let cache_mount = mounts.iter().find(|m| m.name == "cache").unwrap();
    assert_eq!(cache_mount.read_only, Some(false));
    let env = c.env.as_ref().unwrap();
    let cache_env = env.iter().find(|e| e.name == "SPARKRT_CACHE_DIR").unwrap();
    assert_eq!(
        cache_env.value.as_deref(),
        Some(cache_mount.mount_path.as_str())
    );

    // Probes on the serve routes, through the named port serve listens on.
    let port = &c.ports.as_ref().unwrap()[0];
    assert_eq!(arg_after(c, "--port"), port.container_port.to_string());
    let port_name = IntOrString::String(port.name.clone().unwrap());
    let probe_path = |p: &Option<k8s_openapi::api::core::v1::Probe>| {
        let get = p.as_ref().unwrap().http_get.as_ref().unwrap();
        assert_eq!(get.port, port_name);
        get.path.clone().unwrap()
    };
    assert_eq!(probe_path(&c.readiness_probe), "/ready");
    assert_eq!(probe_path(&c.liveness_probe), "/health");

    // Graceful stop: the preStop sleep fits inside the grace period.
    let sleep = c
        .lifecycle
        .as_ref()
        .unwrap()
        .pre_stop
        .as_ref()
        .unwrap()
        .sleep
        .as_ref()
        .unwrap();
    assert!(sleep.seconds > 0);
    assert!(pod.termination_grace_period_seconds.unwrap() > sleep.seconds);

    // The Service selects exactly the pods, on the same named port.
    let service_spec = parsed.service.spec.as_ref().unwrap();
    assert_eq!(
        service_spec.selector.as_ref(),
        template(&parsed).metadata.as_ref().unwrap().labels.as_ref()
    );
    assert_eq!(
        spec.selector.match_labels.as_ref(),
        service_spec.selector.as_ref()
    );
    let service_port = &service_spec.ports.as_ref().unwrap()[0];
    assert_eq!(service_port.target_port.as_ref(), Some(&port_name));
}

#[test]
fn daemonset_instead_of_a_deployment() {
    let out = k8s("qwen3-30b-a3b-nvfp4", &host("spark"), &["--daemonset"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let parsed = parse(&stdout(&out));
    assert!(parsed.deployment.is_none());
    let ds = parsed.daemon_set.as_ref().unwrap();
    assert_eq!(
        ds.metadata.name.as_deref(),
        Some("sparkrt-qwen3-30b-a3b-nvfp4")
    );
    let total = plan_total("qwen3-30b-a3b-nvfp4", &host("spark"));
    let requests = container(&parsed)
        .resources
        .as_ref()
        .unwrap()
        .requests
        .clone()
        .unwrap();
    assert_eq!(requests["memory"], Quantity(total.to_string()));

    let both = k8s(
        "qwen3-30b-a3b-nvfp4",
        &host("spark"),
        &["--daemonset", "--replicas", "2"],
    );
    assert_eq!(both.status.code(), Some(2), "{}", stderr(&both));
}

#[test]
fn qwen3_235b_nvfp4_is_refused() {
    let out = k8s("qwen3-235b-a22b-nvfp4", &host("spark"), &[]);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    assert_eq!(stdout(&out), "", "no manifest for a plan that does not fit");
    let err = stderr(&out);
    assert!(
        err.contains("DOES NOT FIT"),
        "the plan summary is on stderr: {err}"
    );
    assert!(err.contains("weights alone"), "{err}");
}

#[test]
fn a_relative_model_dir_is_bad_input() {
    let profile_path = profile("qwen3-moe-tiny").display().to_string();
    let out = sparkrt(&[
        "k8s",
        "--profile",
        &profile_path,
        "--host-root",
        &host("box24"),
        "--model-dir",
        "models/tiny",
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("absolute"), "{}", stderr(&out));
}

#[test]
fn an_api_key_secret_is_mounted_and_passed_to_serve() {
    let out = k8s(
        "qwen3-30b-a3b-nvfp4",
        &host("spark"),
        &["--api-key-secret", "sparkrt-key:token"],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(!stderr(&out).contains("warning"), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(!text.contains("WARNING"), "{text}");
    let parsed = parse(&text);
    let c = container(&parsed);
    let args = c.args.as_ref().unwrap();
    assert!(
        !args.iter().any(|a| a == "--insecure-no-api-key"),
        "{args:?}"
    );
    let key_file = arg_after(c, "--api-key-file");
    let mounts = c.volume_mounts.as_ref().unwrap();
    let key_mount = mounts.iter().find(|m| m.name == "api-key").unwrap();
    assert_eq!(key_mount.read_only, Some(true));
    assert_eq!(key_file, format!("{}/token", key_mount.mount_path));
    let volumes = pod(&parsed).volumes.as_ref().unwrap();
    let secret = volumes
        .iter()
        .find(|v| v.name == "api-key")
        .unwrap()
        .secret
        .as_ref()
        .unwrap();
    assert_eq!(secret.secret_name.as_deref(), Some("sparkrt-key"));
    assert_eq!(secret.optional, Some(false));
    let items = secret.items.as_ref().unwrap();
    assert_eq!(
        (items[0].key.as_str(), items[0].path.as_str()),
        ("token", "token")
    );
    // The readiness probe stays on /ready, which serve answers without a key.
    let ready = c
        .readiness_probe
        .as_ref()
        .unwrap()
        .http_get
        .as_ref()
        .unwrap();
    assert_eq!(ready.path.as_deref(), Some("/ready"));
    assert!(ready.http_headers.is_none());

    // NAME alone takes the key `api-key`.
    let out = k8s(
        "qwen3-30b-a3b-nvfp4",
        &host("spark"),
        &["--api-key-secret", "sparkrt-key"],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let parsed = parse(&stdout(&out));
    assert!(arg_after(container(&parsed), "--api-key-file").ends_with("/api-key"));

    for bad in ["", "Upper", "name:", "name:a/b", "name:..", "-name"] {
        let flag = format!("--api-key-secret={bad}");
        let out = k8s("qwen3-30b-a3b-nvfp4", &host("spark"), &[&flag]);
        assert_eq!(out.status.code(), Some(2), "{bad:?}: {}", stderr(&out));
        assert!(
            stderr(&out).contains("--api-key-secret"),
            "{}",
            stderr(&out)
        );
        assert_eq!(stdout(&out), "", "{bad:?}");
    }
}

#[test]
fn without_a_key_the_pods_serve_insecurely_and_say_so() {
    let out = k8s("qwen3-30b-a3b-nvfp4", &host("spark"), &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("warning: no --api-key-secret"),
        "{}",
        stderr(&out)
    );
    let text = stdout(&out);
    assert!(text.contains("# WARNING: no --api-key-secret"), "{text}");
    let parsed = parse(&text);
    let c = container(&parsed);
    // serve would refuse 0.0.0.0 without a key; the flag is explicit.
    assert_eq!(arg_after(c, "--host"), "0.0.0.0");
    let args = c.args.as_ref().unwrap();
    assert!(
        args.iter().any(|a| a == "--insecure-no-api-key"),
        "{args:?}"
    );
    assert!(!args.iter().any(|a| a == "--api-key-file"), "{args:?}");
    assert!(
        !pod(&parsed)
            .volumes
            .as_ref()
            .unwrap()
            .iter()
            .any(|v| v.name == "api-key")
    );
}
