"""The node agent (`tiertp worker`, DESIGN.md §3, docs/worker-protocol.md).

One concept per module:
- protocol: wire names (message types, error codes, roles) and the msgpack codec;
- messages: client messages parsed and validated into typed values;
- groups: `TpGroup`, the explicit TP context (aligned power-of-two device sets);
- plan: per-device assignments and `apply_plan` validation;
- requests: the agent's table of in-flight requests (one terminal message each);
- config: `AgentConfig`, the agent's settings (each default written once);
- process: one execution process as seen by the agent (start, keep-alive, death);
- runner: `StepRunner`, one decoding iteration for a batch (a tiertp.execution TpInstance
  on SGLang's model runner; the SGLang Engine path is the `--runner engine` fallback);
- executor: the execution process's main loop (Rust batch policy per iteration);
- agent: the agent loop (ROUTER socket, routing, restarts, shutdown);
- reference: greedy generation run directly on SGLang (what tests compare with).
"""
