//! Every integration test in one binary: on a 2-core CI machine linking
//! one test executable instead of one per file saves most of the link time.
//! Each file below is one topic; the helper modules are shared by them.

// A test that unwraps fails with the reason; that is what a test should do.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
mod cuda_common;
mod fixture_runs;
mod format_cases;
mod kernels_common;
mod kernels_int4;
#[path = "common/server.rs"]
mod server;

mod bench_perf_model;
mod bench_sampling;
mod chat_parsers;
mod chat_prefix_reuse;
mod checkpoint_compressed_tensors;
mod checkpoint_config;
mod checkpoint_fixtures;
mod checkpoint_fuzz_corpus;
mod checkpoint_hostile;
mod checkpoint_inspect;
mod checkpoint_quant;
mod cold_start;
mod cuda_fallback;
mod cuda_faults;
mod cuda_fixtures;
mod cuda_kernels;
mod cuda_nvrtc;
mod cuda_sass;
mod engine_fixtures;
mod engine_fp8;
mod engine_hybrid_cache;
mod engine_int4;
mod engine_logprobs;
mod engine_output;
mod engine_plans;
mod engine_prefix_cache;
mod engine_scheduler;
mod engine_speculative;
mod formats;
mod generate_cli;
mod grammar_mask_cost;
mod hostile_inputs;
mod install_script;
mod k8s_manifests;
mod kernels_batch_invariance;
mod kernels_matmul;
mod kernels_ops;
mod kernels_quantize;
mod kv_fp8;
mod model_qwen35;
mod plan_cli;
mod plan_layers;
mod plan_parallel;
mod plan_qwen35;
mod sampling_processors;
mod serve_summary;
mod serve_vllm_flags;
mod server_api;
mod server_batching;
mod server_chat_template;
mod server_choices;
mod server_connections;
mod server_cors;
mod server_engine_failure;
mod server_guard;
mod server_limits;
mod server_logprobs;
mod server_metrics;
mod server_nested_fields;
mod server_openai_client;
mod server_prefix_cache;
mod server_responses;
mod server_sampling;
mod server_tool_choice;
mod server_vllm_metrics;
mod text_chat;
mod text_chat_reference;
mod text_kv_blocks;
mod text_sampling;
mod text_tokenizer;
mod top_tmux;
