//! An engine that cannot work any more (issue 34): a model whose logits are
//! NaN fails every step, and after three in a row `/ready` answers 503 with
//! the reason and the process exits 1 after its grace period; the same when
//! the engine thread dies (a panic, injected with a hidden test flag).

use std::time::{Duration, Instant};

use safetensors::tensor::TensorView;
use serde_json::json;

use crate::server::{Server, repo};

/// A copy of the tiny fixture whose final norm is NaN (bf16 0x7FC0), so
/// every logit is NaN; the other files are linked.
fn nan_checkpoint() -> tempfile::TempDir {
    let fixture = repo().join("tests/fixtures/qwen3-moe-tiny");
    let dir = tempfile::tempdir().unwrap();
    for name in [
        "config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "generation_config.json",
    ] {
        std::os::unix::fs::symlink(fixture.join(name), dir.path().join(name)).unwrap();
    }
    let bytes = std::fs::read(fixture.join("model.safetensors")).unwrap();
    let tensors = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let norm = tensors.tensor("model.norm.weight").unwrap();
    assert_eq!(norm.dtype(), safetensors::Dtype::BF16);
    let nan: Vec<u8> = std::iter::repeat_n(0x7FC0u16.to_le_bytes(), norm.data().len() / 2)
        .flatten()
        .collect();
    let mut views = Vec::new();
    for (name, view) in tensors.tensors() {
        let data = if name == "model.norm.weight" {
            &nan[..]
        } else {
            view.data()
        };
        views.push((
            name,
            TensorView::new(view.dtype(), view.shape().to_vec(), data).unwrap(),
        ));
    }
    safetensors::serialize_to_file(views, None, &dir.path().join("model.safetensors")).unwrap();
    dir
}

/// Waits for `/ready` to be 503 with a reason containing `why`; its reason.
pub(crate) fn wait_not_ready(server: &Server, why: &str) -> String {
    let mut reason = String::new();
    server.wait_until("/ready turns 503", || {
        let reply = server.get("/ready");
        reason = reply.json()["reason"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        reply.status == 503 && reason.contains(why)
    });
    reason
}

/// The server exits with status 1 within `limit`, not before `at_least`
/// from `since`.
pub(crate) fn exits_with_failure(
    server: &mut Server,
    since: Instant,
    at_least: Duration,
    limit: Duration,
) {
    let status = server
        .wait_exit(limit)
        .unwrap_or_else(|| panic!("still running after {limit:?}: {}", server.log()));
    assert_eq!(status.code(), Some(1), "{status:?}: {}", server.log());
    assert!(
        since.elapsed() >= at_least,
        "exited after {:?}",
        since.elapsed()
    );
    assert!(
        server.log().contains("the engine failed"),
        "{}",
        server.log()
    );
}

#[test]
fn nan_logits_in_consecutive_steps_turn_ready_503_and_exit_1() {
    let model = nan_checkpoint();
    let mut server = Server::start(&[
        "--model",
        model.path().to_str().unwrap(),
        "--engine-failure-grace-ms",
        "2000",
    ]);
    // Each request fails its step; the third in a row breaks the engine.
    for i in 0..3 {
        let reply = server.post(
            "/v1/completions",
            &json!({"prompt": "Hello", "max_tokens": 2}),
        );
        assert_ne!(reply.status, 200, "request {i}: {}", reply.body);
        if i < 2 {
            assert_eq!(
                server.get("/ready").status,
                200,
                "still ready after {}",
                i + 1
            );
        }
    }
    let broken = Instant::now();
    let reason = wait_not_ready(&server, "engine failed 3 consecutive steps");
    assert!(reason.contains("NaN"), "{reason}");
    // During the grace the server answers, with the reason.
    assert_eq!(server.get("/health").status, 503);
    let reply = server.post(
        "/v1/completions",
        &json!({"prompt": "Hello", "max_tokens": 2}),
    );
    assert_eq!(reply.status, 503, "{}", reply.body);
    exits_with_failure(
        &mut server,
        broken,
        Duration::from_millis(1500),
        Duration::from_secs(20),
    );
}

#[test]
fn an_engine_thread_that_dies_turns_ready_503_and_exits_1() {
    let mut server = Server::start(&[
        "--fault-engine-panic-after-steps",
        "1",
        "--engine-failure-grace-ms",
        "1500",
    ]);
    let reply = server.post(
        "/v1/completions",
        &json!({"prompt": "Hello", "max_tokens": 4}),
    );
    assert_ne!(reply.status, 200, "{}", reply.body);
    let died = Instant::now();
    let reason = wait_not_ready(&server, "engine thread panicked");
    assert!(reason.contains("injected fault"), "{reason}");
    exits_with_failure(
        &mut server,
        died,
        Duration::from_millis(1000),
        Duration::from_secs(20),
    );
}

#[test]
fn a_lost_device_turns_ready_503_at_once_and_exits_1() {
    // A sticky CUDA error (injected: the step fails as one does) ends the
    // engine on the first failed step, not after three: every later step
    // would fail the same way.
    let mut server = Server::start(&[
        "--fault-device-lost-after-steps",
        "1",
        "--engine-failure-grace-ms",
        "1500",
    ]);
    let reply = server.post(
        "/v1/completions",
        &json!({"prompt": "Hello", "max_tokens": 4}),
    );
    assert_ne!(reply.status, 200, "{}", reply.body);
    let lost = Instant::now();
    let reason = wait_not_ready(&server, "the device is lost");
    assert!(reason.contains("failed fatally"), "{reason}");
    assert!(reason.contains("CUDA_ERROR_ILLEGAL_ADDRESS"), "{reason}");
    assert!(!reason.contains("consecutive"), "{reason}");
    exits_with_failure(
        &mut server,
        lost,
        Duration::from_millis(1000),
        Duration::from_secs(20),
    );
}
