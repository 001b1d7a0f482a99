"""Type stub for the native module tiertp._scheduler (Rust, PyO3).

Kept in agreement with the module by tests/test_stub_agreement.py.
"""

from collections.abc import Callable
from typing import Any

FAIR_MIN_REQUEST_SHARE: float
FAIR_MIN_GOODPUT_FRACTION: float
ROLES: list[str]
DISPATCH_CLASSES: list[str]
# Defaults written once, in Rust: the control window (s), the node size of a
# cluster given as a GPU count, and where the gateway listens.
DEFAULT_WINDOW_S: float
DEFAULT_GPUS_PER_NODE: int
# How long (s) a tier's past arrival rate keeps counting as demand in the
# control loop, so a tier gone quiet keeps its GPUs that long.
DEFAULT_DEMAND_MEMORY_S: float
# The request the control loop assumes for a tier it has not seen yet
# (prompt and output tokens): what a plan made at start-up is sized for.
PRIOR_PROMPT_TOKENS: float
PRIOR_OUTPUT_TOKENS: float
# The most GPUs (devices) one node, i.e. one agent, may have.
MAX_GPUS_PER_NODE: int
DEFAULT_GATEWAY_HOST: str
DEFAULT_GATEWAY_PORT: int
# Where `GatewayServer(sampling_defaults=...)` takes temperature and top_p
# for requests that omit them: "model" (the default) or "openai".
SAMPLING_DEFAULTS: list[str]

class ProfileError(ValueError):
    """A profile file or query is invalid."""

class TierConfigError(ValueError):
    """A tier configuration is invalid."""

class PlanError(ValueError):
    """Planner input (stats, cluster, config) is invalid."""

class DispatchError(ValueError):
    """A dispatch call was refused."""

class Profile:
    """A validated TP performance profile."""

    @staticmethod
    def load(path: str) -> Profile: ...
    @staticmethod
    def from_json(text: str, origin: str = "<string>") -> Profile: ...
    @staticmethod
    def synthetic() -> Profile: ...
    @property
    def name(self) -> str: ...
    @property
    def gpu(self) -> str: ...
    @property
    def model(self) -> str: ...
    @property
    def dtype(self) -> str: ...
    @property
    def kv_bytes_per_token(self) -> int | None: ...
    @property
    def tp_levels(self) -> list[int]: ...
    def prefill_ms(self, tp: int, batch_tokens: float, batch_size: float) -> float: ...
    def decode_ms(self, tp: int, batch_size: float, context_len: float) -> float: ...
    def kv_capacity_tokens(self, tp: int) -> int | None: ...
    def clamped_queries(self) -> int: ...
    def to_json(self) -> str: ...

class TierSet:
    """The SLO tiers of a deployment, in config order."""

    @staticmethod
    def load(path: str) -> TierSet: ...
    @staticmethod
    def from_toml(text: str, origin: str = "<string>") -> TierSet: ...
    @property
    def names(self) -> list[str]: ...
    def to_list(self) -> list[dict[str, Any]]: ...
    def id_of(self, name: str) -> int: ...
    def __len__(self) -> int: ...

class TierStats:
    """Observed load of one tier: arrival rate and mean lengths."""

    def __init__(self, arrival_rate: float, mean_prompt_tokens: float, mean_output_tokens: float) -> None: ...
    @property
    def arrival_rate(self) -> float: ...
    @property
    def mean_prompt_tokens(self) -> float: ...
    @property
    def mean_output_tokens(self) -> float: ...
    @property
    def resident_output_tokens(self) -> float: ...
    @property
    def prefilled_prompt_tokens(self) -> float | None: ...

class ArrivalObserver:
    """Sliding-horizon arrival statistics per tier."""

    def __init__(
        self, tiers: TierSet, horizon_s: float, prior: TierStats, memory_s: float | None = None, window_s: float | None = None
    ) -> None: ...
    def record(self, tier: str, time_s: float, prompt_tokens: int, output_tokens: int) -> None: ...
    def snapshot(self, now_s: float) -> list[tuple[str, TierStats]]: ...

class Plan:
    """An immutable plan: which GPUs serve which tier, role and TP level."""

    @property
    def num_gpus(self) -> int: ...
    @property
    def tier_capacity_rps(self) -> dict[str, float]: ...
    def groups(self) -> list[dict[str, Any]]: ...
    def to_dict(self) -> dict[str, Any]: ...
    def to_json(self) -> str: ...

class Planner:
    """The control loop's planner (estimate, weighted greedy, hysteresis diff)."""

    def __init__(
        self,
        profile: Profile,
        tiers: TierSet,
        gpus: int | None = None,
        nodes: list[int] | None = None,
        gpus_per_node: int | None = None,
        tp_levels: list[int] | None = None,
        hysteresis: float | None = None,
        fairness_weighting: bool | None = None,
        allow_colocated: bool | None = None,
        allow_disaggregated: bool | None = None,
        target_utilization: float | None = None,
    ) -> None: ...
    @property
    def num_gpus(self) -> int: ...
    @property
    def tp_levels(self) -> list[int]: ...
    def step(self, stats: dict[str, TierStats]) -> dict[str, Any]: ...
    def propose(self, stats: dict[str, TierStats]) -> Plan: ...
    def estimate(self, stats: dict[str, TierStats]) -> list[dict[str, Any]]: ...
    def current(self) -> Plan | None: ...
    def reset(self) -> None: ...

class Dispatcher:
    """FCFS dispatcher with per-group SLO bandwidth accounting."""

    def __init__(self, tiers: TierSet, plan: Plan) -> None: ...
    def set_plan(self, plan: Plan) -> None: ...
    def dispatch(self, request_id: int, tier: str, prompt_tokens: int, prefill_groups: bool = True) -> tuple[int, int, str, int]: ...
    def prefill_done(self, request_id: int) -> bool: ...
    def dispatch_decode(self, request_id: int, colocated_too: bool = False) -> tuple[int, int, str, int] | None: ...
    def complete(self, request_id: int) -> int: ...
    def is_in_flight(self, request_id: int) -> bool: ...
    @property
    def in_flight(self) -> int: ...
    @property
    def total_load(self) -> tuple[int, int]: ...
    def load_of(self, first_gpu: int, tp: int) -> tuple[int, int]: ...

class NodeGroup:
    """A group a node runs, as the node sees it for one request (`fallback_group`)."""

    def __init__(self, first_gpu: int, tp: int, *, its_tier: bool, unplanned: bool, decode_only: bool,
                 load: int) -> None: ...

def fallback_group(groups: list[NodeGroup], over: tuple[int, int] | None = None) -> tuple[int, int] | None: ...

class BatchPolicy:
    """Per-GPU-group local batch policy, called by the worker every iteration."""

    def __init__(self, batch_cap: int, token_cap: int = 0) -> None: ...
    @property
    def batch_cap(self) -> int: ...
    @property
    def token_cap(self) -> int: ...
    def set_caps(self, batch_cap: int, token_cap: int = 0) -> None: ...
    def enqueue(self, request_id: int, cls: str, tokens: int) -> bool: ...
    def enqueue_with_deadline(self, request_id: int, cls: str, tokens: int, deadline: float) -> bool: ...
    def take_expired(self, now: float) -> list[int]: ...
    def remove(self, request_id: int) -> bool: ...
    def next_batch(self, running: int) -> list[int]: ...
    def next_batch_within(self, running: int, kv_budget: int, kv_needs: dict[int, int]) -> list[int]: ...
    def queue_lengths(self) -> list[tuple[str, int]]: ...
    def __len__(self) -> int: ...

def bench_scheduler(quick: bool = False) -> str: ...
def bench_gateway(
    requests: int | None = None,
    concurrency: int | None = None,
    workers: int | None = None,
    max_tokens: int | None = None,
    max_seconds: float | None = None,
    threads: int | None = None,
) -> str: ...

class GatewayServer:
    """The OpenAI gateway, running on its own runtime (`tiertp serve`).

    `workers`: (agent endpoint, devices) per node, each `tcp://HOST:PORT`;
    an agent not up at start (each is waited for up to `connect_timeout_s`)
    joins the plan when it comes up. `control_key`: the agents' 32-byte
    control-plane key (`tiertp keys`); every frame to and from them is
    sealed under it (another length: ValueError). `profile_path`: the
    planner's profile JSON (None: the synthetic one); `tp_levels`: TP levels
    the planner may use (give the levels the workers run; None: the
    planner's default); `window_s`: the control window (None: the gateway's
    default, DEFAULT_WINDOW_S; allowed 0.25-5 s). Other options left None
    take the gateway's defaults (DEFAULT_GATEWAY_HOST, DEFAULT_GATEWAY_PORT,
    its worker and connect timeouts). Tier limits come from the tiers file.
    `sampling_defaults`: temperature and top_p for requests that omit them,
    one of SAMPLING_DEFAULTS: "model" (None: `model_dir`'s
    generation_config.json, as SGLang and vLLM do; OpenAI's values where it
    has none) or "openai" (1.0, 1.0); another value: ValueError.
    """

    def __init__(
        self,
        tiers_path: str,
        model: str,
        model_dir: str,
        workers: list[tuple[str, int]],
        control_key: bytes,
        host: str | None = None,
        port: int | None = None,
        threads: int = 2,
        worker_timeout_s: float | None = None,
        connect_timeout_s: float | None = None,
        profile_path: str | None = None,
        tp_levels: list[int] | None = None,
        window_s: float | None = None,
        sampling_defaults: str | None = None,
    ) -> None: ...
    @property
    def address(self) -> str: ...
    @property
    def running(self) -> bool: ...
    def shutdown(self, timeout_s: float = 10.0) -> None: ...

class MockGateway:
    """The gateway over `workers` mock agents on loopback, for tests that
    need a live gateway but no model: the agents echo the prompt's token ids
    as the output, the tokenizer is a tiny word-level one, and the one tier's
    key is `api_key`. `max_model_len`: the context length the agents report
    (None: none, so the gateway checks no context length). Starting failures
    raise RuntimeError; `shutdown()` stops the gateway and its agents.
    """

    def __init__(self, workers: int = 1, max_model_len: int | None = None, threads: int = 2) -> None: ...
    @property
    def address(self) -> str: ...
    @property
    def api_key(self) -> str: ...
    @property
    def model(self) -> str: ...
    def shutdown(self, timeout_s: float = 10.0) -> None: ...

# The simulator's policies (the one list), and the settings each reads
# (keywords of `simulate`: what a sweep of its configurations varies).
SIM_POLICIES: list[str]
SIM_POLICY_SETTINGS: dict[str, list[str]]

def simulate(
    profile: Profile,
    tiers: TierSet,
    arrival_s: list[float],
    tier: list[int],
    prompt_tokens: list[int],
    output_tokens: list[int],
    gpus: int,
    policy: str,
    gpus_per_node: int | None = None,
    tp: int | None = None,
    prefill_share: float | None = None,
    window_s: float | None = None,
    switch_ms: float | None = None,
    kv_gbps: float | None = None,
    progress: Callable[[float], object] | None = None,
    engine_profile: Profile | None = None,
) -> dict[str, Any]: ...
