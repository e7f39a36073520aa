"""What the simulated fleet is made of: accelerator traits and the models they serve.

Figures are round public numbers (board power limits, HBM sizes) or plausible
orders of magnitude (decode throughput, load bandwidth); the simulator needs
them to be different per type and consistent, not exact.

Decode capacity of a device for a model, in generated tokens per second::

    capacity_tokens_per_s = decode_tokens_per_s * speed[model] / model.cost

Load time of a model on a device, in seconds::

    load_time_s = startup_s + model.weights_bytes / load_bytes_per_s
"""

from __future__ import annotations

from dataclasses import dataclass, field

from schemas.base import AcceleratorType

GIB = 1024**3
MAX_PLACED_TPOT_S = 0.08  # initial placement skips pairings slower than this per token


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """A served model: how heavy it is and what a request looks like."""

    name: str
    weights_bytes: int
    cost: float  # compute per generated token, relative to a 70B dense model
    prompt_tokens: int  # mean per request
    generated_tokens: int  # mean per request


@dataclass(frozen=True, slots=True)
class AcceleratorSpec:
    """Static traits of one accelerator type."""

    kind: AcceleratorType
    power_limit_watts: float  # board default
    min_power_limit_watts: float  # lowest cap the driver accepts
    idle_watts: float
    hbm_bytes: int | None
    sm_clock_mhz: float
    mem_clock_mhz: float | None
    decode_tokens_per_s: float  # at cost 1.0, full clocks
    prefill_tokens_per_s: float
    load_bytes_per_s: float  # weights from local NVMe/host memory into HBM
    startup_s: float  # runtime start, graph capture, warm-up
    thermal_resistance_c_per_watt: float
    thermal_time_constant_s: float
    slowdown_celsius: float  # hardware slows clocks above this
    shutdown_celsius: float  # the device falls off the bus above this
    speed: dict[str, float] = field(default_factory=dict)  # per-model factor, default 1
    reports_ecc: bool = True
    reports_xid: bool = True
    reports_nvlink: bool = True
    reports_memory_temp: bool = True

    def capacity_tokens_per_s(self, model: ModelSpec) -> float:
        return self.decode_tokens_per_s * self.speed.get(model.name, 1.0) / model.cost

    def tpot_base_s(self, model: ModelSpec) -> float:
        """Time per output token of one sequence at full clocks (batch of one)."""
        return 0.006 + 0.016 * model.cost * 2400.0 / (
            self.decode_tokens_per_s * self.speed.get(model.name, 1.0)
        )

    def serves_well(self, model: ModelSpec) -> bool:
        """Fits, and decodes fast enough that placing the model here makes sense."""
        return self.fits(model) and self.tpot_base_s(model) <= MAX_PLACED_TPOT_S

    def load_time_s(self, model: ModelSpec) -> float:
        return self.startup_s + model.weights_bytes / self.load_bytes_per_s

    def fits(self, model: ModelSpec) -> bool:
        return self.hbm_bytes is None or model.weights_bytes <= 0.8 * self.hbm_bytes


MODELS: dict[str, ModelSpec] = {
    m.name: m
    for m in (
        ModelSpec(
            "llama-70b", weights_bytes=40 * GIB, cost=1.0, prompt_tokens=900, generated_tokens=180
        ),
        ModelSpec(
            "mixtral-8x7b",
            weights_bytes=26 * GIB,
            cost=0.45,
            prompt_tokens=700,
            generated_tokens=220,
        ),
        ModelSpec(
            "qwen-7b", weights_bytes=8 * GIB, cost=0.12, prompt_tokens=400, generated_tokens=120
        ),
        ModelSpec(
            "gemma-27b", weights_bytes=16 * GIB, cost=0.38, prompt_tokens=600, generated_tokens=150
        ),
    )
}
SERVED_AT_START = ("llama-70b", "mixtral-8x7b", "qwen-7b")
"""Models placed at start; the others are cold until a warmer loads them."""

ACCELERATORS: dict[AcceleratorType, AcceleratorSpec] = {
    AcceleratorType.H100: AcceleratorSpec(
        AcceleratorType.H100,
        700,
        200,
        90,
        80 * GIB,
        1980,
        2619,
        decode_tokens_per_s=2400,
        prefill_tokens_per_s=40_000,
        load_bytes_per_s=6 * GIB,
        startup_s=20,
        thermal_resistance_c_per_watt=0.075,
        thermal_time_constant_s=40,
        slowdown_celsius=87,
        shutdown_celsius=95,
    ),
    AcceleratorType.B200: AcceleratorSpec(
        AcceleratorType.B200,
        1000,
        400,
        140,
        192 * GIB,
        1965,
        3996,
        decode_tokens_per_s=5200,
        prefill_tokens_per_s=90_000,
        load_bytes_per_s=10 * GIB,
        startup_s=25,
        thermal_resistance_c_per_watt=0.052,
        thermal_time_constant_s=45,
        slowdown_celsius=87,
        shutdown_celsius=95,
    ),
    AcceleratorType.A100: AcceleratorSpec(
        AcceleratorType.A100,
        400,
        150,
        55,
        80 * GIB,
        1410,
        1593,
        decode_tokens_per_s=1200,
        prefill_tokens_per_s=18_000,
        load_bytes_per_s=4 * GIB,
        startup_s=20,
        thermal_resistance_c_per_watt=0.13,
        thermal_time_constant_s=35,
        slowdown_celsius=85,
        shutdown_celsius=92,
    ),
    AcceleratorType.MI300X: AcceleratorSpec(
        AcceleratorType.MI300X,
        750,
        300,
        110,
        192 * GIB,
        2100,
        1300,
        decode_tokens_per_s=2600,
        prefill_tokens_per_s=42_000,
        load_bytes_per_s=6 * GIB,
        startup_s=30,
        thermal_resistance_c_per_watt=0.07,
        thermal_time_constant_s=45,
        slowdown_celsius=90,
        shutdown_celsius=100,
        speed={"mixtral-8x7b": 0.85},
        reports_xid=False,
        reports_nvlink=False,
    ),
    AcceleratorType.MTIA: AcceleratorSpec(
        AcceleratorType.MTIA,
        90,
        45,
        20,
        64 * GIB,
        1350,
        None,
        decode_tokens_per_s=420,
        prefill_tokens_per_s=9_000,
        load_bytes_per_s=3 * GIB,
        startup_s=15,
        thermal_resistance_c_per_watt=0.5,
        thermal_time_constant_s=25,
        slowdown_celsius=90,
        shutdown_celsius=100,
        speed={"qwen-7b": 1.8, "llama-70b": 0.6},
        reports_xid=False,
        reports_nvlink=False,
        reports_memory_temp=False,
    ),
}
REGIONS = ("us-east", "eu-west")
TYPE_MIX = (
    AcceleratorType.H100,
    AcceleratorType.B200,
    AcceleratorType.A100,
    AcceleratorType.MI300X,
    AcceleratorType.MTIA,
)


def node_type(index: int, mix: tuple[AcceleratorType, ...] | None = None) -> AcceleratorType:
    """Accelerator type of the node at ``index``: types cycle through ``mix`` (by default
    ``TYPE_MIX``; a type named twice is twice as common)."""
    mix = mix or TYPE_MIX
    return mix[index % len(mix)]


CLOCK_LOW_FACTOR = 0.7  # clock ratio in low-clock mode
