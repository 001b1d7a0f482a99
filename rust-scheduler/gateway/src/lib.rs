//! tiertp gateway: the OpenAI-compatible front door (DESIGN.md §4). Requests
//! are mapped to SLO tiers, tokenized here, placed by the core dispatcher and
//! sent to node agents over the worker control protocol; the core planner
//! runs every control window and its plan changes go to the agents.

pub mod admission;
pub mod app;
pub mod bench;
pub mod config;
pub mod control;
pub mod error;
pub mod generate;
pub mod metrics;
pub mod mock_gateway;
pub mod openai;
pub mod openapi;
pub mod protocol;
pub mod sampling;
pub mod server;
pub mod stream;
pub mod tokenize;
pub mod worker;
