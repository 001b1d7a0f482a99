"""The node agent (`tiertp worker`, DESIGN.md §3, docs/worker-protocol.md).

One concept per module:
- protocol: wire names (message types, error codes, roles) and the msgpack codec;
- seal: sealed frames (ChaCha20-Poly1305 sessions under the control-plane key), the
  Rust gateway's twin; key_file: reading and writing that key (`tiertp keys`);
- gate: whom the agent hears (sealed frames only, new sessions only while fresh, no
  replays); refusals: its rate-limited warnings about the peers it refused;
- agent_client, stats_query: a Python client of an agent (tools, serve, tests);
- messages: client messages parsed and validated into typed values;
- groups: the aligned TP groups a node keeps warm (`TpGroup`, the explicit TP context, is tiertp.tp_group's);
- plan: per-device assignments and `apply_plan` validation;
- requests: the agent's table of in-flight requests (one terminal message each);
- config: `AgentConfig`, the agent's settings (each default written once);
- process: one execution process as seen by the agent (start, keep-alive, death);
- step_runner: `StepRunner` / `SwitchableStepRunner`, what the execution process needs of a
  model replica, one decoding iteration at a time;
- runners: the runners by name: instance_runner (a tiertp.execution TpInstance on SGLang's
  model runner) and engine_runner (the SGLang Engine path, the `--runner engine` fallback);
- batch_state: `BatchState`, the execution process's waiting, running and parked
  requests and its batch policy (the one place that changes them);
- executor: the execution process's main loop (Rust batch policy per iteration);
- instance_ops, switch_ops: the ops a switch sends an execution process, and their handler;
- remote_instance: the agent's proxy of an execution process's TP instance;
- agent: the agent loop (ROUTER socket, routing, restarts, shutdown).
"""
