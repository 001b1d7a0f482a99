"""What `tiertp serve` and `tiertp gateway` print once the gateway is ready:
where it listens, the model and the devices it plans over, each tier's API
key and limits, and how to call it (curl, the openai SDK)."""

from __future__ import annotations

from pathlib import Path


def tiers_of(path: Path) -> list[dict]:
    """The tier file's tables (already validated by TierSet.load)."""
    import tomllib

    return tomllib.loads(Path(path).read_text()).get("tier", [])


def first_tier(path: Path) -> str:
    return tiers_of(path)[0]["name"]


def _describe(tier: dict) -> str:
    slo = ("background (no SLO)" if tier.get("background")
           else f"TTFT {tier['ttft_ms']:g} ms, TPOT {tier['tpot_ms']:g} ms")
    limits = [f"{tier['max_concurrent_requests']} concurrent" if "max_concurrent_requests" in tier else "",
              f"{tier['max_requests_per_minute']:g} requests/min" if "max_requests_per_minute" in tier else ""]
    limits = [x for x in limits if x]
    return f"{slo}; limits: {', '.join(limits) or 'none'}"


def banner(prog: str, address: str, model: str, devices: str, tp_levels: list[int], profile: str,
           tiers_path: Path) -> str:
    """The lines `prog` (e.g. "tiertp serve") prints once ready; `devices`
    says what the planner plans over (e.g. "2 CPU device(s)")."""
    host, _, port = address.rpartition(":")
    if host in ("0.0.0.0", "[::]"):  # listening everywhere: this machine can use loopback
        host = "127.0.0.1"
    base = f"http://{host}:{port}"
    tiers = tiers_of(tiers_path)
    lines = [f"{prog}: model {model!r} on {devices}, TP {tp_levels}, profile {profile}",
             f"{prog}: OpenAI API at {base}/v1"]
    width = max(len(t["name"]) for t in tiers)
    for t in tiers:
        keys = ", ".join(t.get("api_keys", [])) or "(no API key)"
        lines.append(f"{prog}:   tier {t['name']:<{width}}  key {keys}  ({_describe(t)})")
    key = next((t["api_keys"][0] for t in tiers if t.get("api_keys")), "KEY")
    body = ('{"model": "%s", "messages": [{"role": "user", "content": "Hello!"}], "max_tokens": 32}' % model)
    lines += [
        "",
        "Try it (any tier's key; the header x-tiertp-tier may ask for a lower tier):",
        f"  curl {base}/v1/chat/completions \\",
        f"    -H 'Authorization: Bearer {key}' -H 'Content-Type: application/json' \\",
        f"    -d '{body}'",
        "",
        "  from openai import OpenAI",
        f"  client = OpenAI(base_url=\"{base}/v1\", api_key=\"{key}\")",
        f"  r = client.chat.completions.create(model=\"{model}\", messages=[{{\"role\": \"user\", "
        f"\"content\": \"Hello!\"}}], max_tokens=32)",
        "  print(r.choices[0].message.content)",
        "",
        f"{prog}: plan {base}/v1/plan, metrics {base}/metrics, health {base}/health",
        f"{prog}: press Ctrl-C to stop",
    ]
    return "\n".join(lines)
