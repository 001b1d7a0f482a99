//! A gateway over mock node agents on loopback (`worker::mock`: they echo
//! the prompt's token ids), with the tiny tokenizer and one tier: what the
//! gateway bench and the API fuzz test (through the bindings) run, a live
//! gateway with no model behind it.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tiertp_scheduler::tiers::{Tier, TierSet};

use crate::config::{GatewayConfig, TokenizerSource, WorkerSpec};
use crate::server::{run_gateway_with, GatewayHandle};
use crate::worker::mock::{self, MockConfig, MockWorker};
use crate::worker::zmq::ZmqWorker;
use crate::worker::WorkerClient;

/// The API key of the one tier.
pub const API_KEY: &str = "sk-bench";
/// The model name requests must give.
pub const MODEL: &str = "mock";

fn tiers() -> TierSet {
    let mut t = Tier::slo_tier("bench", 1000.0, 100.0, 1.0);
    t.api_keys = vec![API_KEY.to_string()];
    TierSet::new(vec![t], "bench").expect("the bench tier is valid")
}

/// `workers` mock agents of one device each, configured by `agent`, and a
/// gateway over them on 127.0.0.1 (a free port); the handle holds the
/// agents, which stop with it.
pub async fn start(workers: usize, agent: MockConfig) -> Result<GatewayHandle, String> {
    let mut mocks = Vec::new();
    let mut clients: Vec<Arc<dyn WorkerClient>> = Vec::new();
    let mut specs = Vec::new();
    for _ in 0..workers.max(1) {
        let m = MockWorker::start(MockConfig { devices: 1, ..agent })
            .await
            .map_err(|e| e.to_string())?;
        let client = ZmqWorker::connect(m.endpoint(), mock::key(), Duration::from_secs(5))
            .await
            .map_err(|e| e.to_string())?;
        clients.push(Arc::new(client));
        specs.push(WorkerSpec {
            endpoint: m.endpoint().to_string(),
            gpus: 1,
        });
        mocks.push(m);
    }
    let mut config = GatewayConfig::new(MODEL, TokenizerSource::Tiny, tiers(), specs);
    config.bind = SocketAddr::from(([127, 0, 0, 1], 0));
    let mut gateway = run_gateway_with(config, clients).await.map_err(|e| e.to_string())?;
    gateway.hold(mocks);
    Ok(gateway)
}
