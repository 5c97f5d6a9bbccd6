//! `serve`'s start-up summary and `--log-format json`, on a non-terminal
//! stderr (a pipe, as under a log collector).

use serde_json::Value;

use crate::server::Server;

#[test]
fn the_summary_names_the_model_and_kv_capacity_without_ansi_codes() {
    let server = Server::start(&[]);
    let log = server.log();
    assert!(!log.contains('\x1b'), "no ANSI codes in a pipe:\n{log}");
    let model = server.get("/v1/models").json()["data"][0]["id"]
        .as_str()
        .unwrap()
        .to_string();
    let block = &log[log.find("sparkrt serve\n").expect("the summary block")..];
    let listening = block
        .find("sparkrt: listening on")
        .expect("after it, the address");
    let block = &block[..listening];
    assert!(
        block.contains(&format!("  model          {model}\n")),
        "{block}"
    );
    // profiles/qwen3-moe-tiny.toml on box24: 512 blocks of 16 tokens = 8192
    // tokens, 8 sequences of max_model_len 1024 (as /v1/memory says).
    assert!(
        block.contains("  kv cache       8192 tokens = 8 sequences of max_model_len\n"),
        "{block}"
    );
    for row in [
        "  max_model_len  1024\n",
        "  max_num_seqs   8\n",
        // The queue's default bound: a quarter of the 512 MiB margin over
        // (2 × 1024 ids × 4 B + 64 KiB) per queued sequence = 1820.
        "  queue          1820 sequences (128 MiB of the safety margin / 72.0 KiB per queued sequence)\n",
        "  api key        off\n",
        "  backend        cpu (cpu)\n",
        "  weights        mapped\n",
        // box24's 22 GiB available − 1 GiB OS reserve − 512 MiB margin,
        // in the one byte rule's three significant digits.
        "of usable 20.5 GiB (bound by host)",
        &format!("  address        http://{}\n", server.address()),
    ] {
        assert!(block.contains(row), "{row:?} in\n{block}");
    }
}

#[test]
fn log_format_json_writes_only_json_lines_with_the_summary_as_one_event() {
    let server = Server::start(&["--log-format", "json"]);
    let log = server.log();
    let events: Vec<Value> = log
        .lines()
        .map(|line| {
            serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line:?} in\n{log}"))
        })
        .collect();
    let summaries: Vec<&Value> = events
        .iter()
        .filter(|e| e["fields"]["event"] == "startup_summary")
        .collect();
    assert_eq!(summaries.len(), 1, "{log}");
    let fields = &summaries[0]["fields"];
    assert_eq!(fields["kv_tokens"], 8192);
    assert_eq!(fields["kv_full_sequences"], 8);
    assert_eq!(fields["max_model_len"], 1024);
    assert_eq!(fields["api_key"], false);
    assert_eq!(
        fields["address"].as_str(),
        Some(format!("http://{}", server.address()).as_str())
    );
    let model = server.get("/v1/models").json()["data"][0]["id"].clone();
    assert_eq!(fields["model"], model);
}
