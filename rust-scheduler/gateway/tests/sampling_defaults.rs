//! Sampling defaults end to end: a model directory's
//! `generation_config.json` gives the `temperature` and `top_p` a request
//! that omits them is submitted to its worker with (as SGLang and vLLM do);
//! a request's own values are kept; OpenAI's defaults when chosen.

mod common;

use std::path::PathBuf;

use common::{post, start_with};
use hyper::StatusCode;
use serde_json::json;
use tiertp_gateway::sampling::{SamplingDefaults, SamplingSource, GENERATION_CONFIG};
use tiertp_gateway::worker::mock::{MockConfig, MockWorker};

/// A model directory holding only a `generation_config.json` (the tokenizer
/// is the built-in tiny one), removed on drop.
struct ModelDir(PathBuf);

impl ModelDir {
    fn new(name: &str, generation_config: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("tiertp-sampling-it-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(GENERATION_CONFIG), generation_config).unwrap();
        Self(dir)
    }
}

impl Drop for ModelDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// SmolLM2's recommendation, as the embedded model's directory has it.
const SMOLLM2: &str = r#"{"bos_token_id": 1, "eos_token_id": 2, "do_sample": true, "temperature": 0.2, "top_p": 0.9}"#;

/// Posts each body to `path` and returns the (temperature, top_p) the worker
/// got for each, in order.
async fn submitted(source: SamplingSource, bodies: &[(&str, serde_json::Value)]) -> Vec<(f64, f64)> {
    let dir = ModelDir::new(source.name(), SMOLLM2);
    let defaults = SamplingDefaults::load(source, &dir.0).unwrap();
    let (gw, workers) = start_with(&[MockConfig::default()], |c| c.sampling = defaults).await;
    for (path, body) in bodies {
        let r = post(gw.addr, path, body.clone()).await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    }
    let w: &MockWorker = &workers[0];
    w.samplings().iter().map(|s| (s.temperature, s.top_p)).collect()
}

#[tokio::test]
async fn omitted_fields_take_the_models_defaults_and_given_ones_are_kept() {
    let got = submitted(
        SamplingSource::Model,
        &[
            ("/v1/completions", json!({"model": "tiny", "prompt": "hello", "max_tokens": 2})),
            (
                "/v1/chat/completions",
                json!({"model": "tiny", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 2}),
            ),
            (
                "/v1/completions",
                json!({"model": "tiny", "prompt": "hello", "max_tokens": 2, "temperature": 0.7}),
            ),
            (
                "/v1/completions",
                json!({"model": "tiny", "prompt": "hello", "max_tokens": 2, "temperature": 1.0, "top_p": 1.0}),
            ),
        ],
    )
    .await;
    assert_eq!(got, vec![(0.2, 0.9), (0.2, 0.9), (0.7, 0.9), (1.0, 1.0)]);
}

#[tokio::test]
async fn openai_defaults_ignore_the_models() {
    let got = submitted(
        SamplingSource::OpenAi,
        &[
            ("/v1/completions", json!({"model": "tiny", "prompt": "hello", "max_tokens": 2})),
            (
                "/v1/completions",
                json!({"model": "tiny", "prompt": "hello", "max_tokens": 2, "temperature": 0.0}),
            ),
        ],
    )
    .await;
    assert_eq!(got, vec![(1.0, 1.0), (0.0, 1.0)]);
}

#[test]
fn a_gateway_config_with_out_of_range_defaults_is_refused() {
    let mut config = tiertp_gateway::config::GatewayConfig::new(
        "tiny",
        tiertp_gateway::config::TokenizerSource::Tiny,
        tiertp_scheduler::tiers::TierSet::from_toml(common::TIERS, "tiers").unwrap(),
        vec![tiertp_gateway::config::WorkerSpec {
            endpoint: "tcp://127.0.0.1:1".into(),
            gpus: 1,
        }],
    );
    assert!(config.validate().is_ok());
    config.sampling.temperature = 2.5;
    let e = config.validate().unwrap_err().to_string();
    assert!(e.contains("temperature"), "{e}");
}
