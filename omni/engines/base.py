"""The Engine contract: what every engine kind implements, with no sockets.

`engines/proc/` wraps any Engine in a process (one ZeroMQ DEALER, one main thread);
tests drive the same object in-process. An engine is single-threaded: the process
loop calls add/abort/step from one thread only.
"""

from __future__ import annotations

import abc
import math
import time
from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import torch


class EngineError(Exception):
    """A request-level failure the engine reports for one request (others keep running)."""


class EngineLoadError(Exception):
    """The engine cannot start (bad model directory, bad options); fails the launch."""


# stage options read for the engine's process, whatever the engine: its CPU priority
# (proc.py) and its payload arena (launcher.py)
PROCESS_OPTIONS = frozenset({"nice", "payload_arena_mb", "gc_freeze"})

# a model stage's option ``load_format`` (the kinds that take it: kinds.py): auto loads the
# weights on disk; dummy builds each model from its config with random weights, for
# benchmarking a release's shapes without its weights (omni/models/dummy_weights.py)
LOAD_FORMATS = ("auto", "dummy")


def check_options(kind: str, options: Mapping[str, Any] | None, known: Iterable[str]) -> None:
    """A stage's ``options`` must all be read by its engine (or its process): a typo is a
    load error that names the valid ones, never a setting silently ignored."""
    valid = frozenset(known) | PROCESS_OPTIONS
    unknown = sorted(set(options or {}) - valid)
    if unknown:
        raise EngineLoadError(f"unknown {kind} option(s) {', '.join(unknown)}; the options "
                              f"are {', '.join(sorted(valid))}")


def streamed_chunk_frames(first: int, growth: int, cap: int, index: int) -> int:
    """Frames in a streamed request's index-th chunk (0 = the first): `first`, growing by
    `growth` a chunk, at most `cap`. The generation engine cuts streams by it and vocoder
    runners warm the shapes it makes (omni/models/code2wav_shapes.py)."""
    return min(first * growth ** min(index, 16), cap)


def flag_option(options: Mapping[str, Any], name: str, default: bool) -> bool:
    """A true/false option, refused when it is anything else: bool("false") is True, so a
    quoted value would silently turn a feature on."""
    value = options.get(name, default)
    if not isinstance(value, bool):
        raise EngineLoadError(f"option {name} must be true or false, got {value!r}")
    return value


def number_option(options: Mapping[str, Any], name: str, default: Any, kind: type = float,
                  minimum: float | None = None) -> Any:
    """A number option (kind int: whole numbers only), finite, at least ``minimum``, as
    ``kind``; refused otherwise, booleans too (True would read as 1)."""
    value = options.get(name, default)
    ok = isinstance(value, int if kind is int else int | float) and not isinstance(value, bool)
    if not ok or not math.isfinite(value) or (minimum is not None and value < minimum):
        bound = "" if minimum is None else f" >= {minimum}"
        raise EngineLoadError(f"option {name} must be {'an integer' if kind is int else 'a number'}"
                              f"{bound}, got {value!r}")
    return kind(value)


def resolve_device(device: str) -> str:
    """'auto' -> 'cuda' when torch sees a GPU, else 'cpu'; anything else unchanged."""
    if device != "auto":
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


@dataclass
class EngineRequest:
    """One request as an engine sees it.

    inputs: for an entry stage, the client's inputs (e.g. {"prompt": "..."}); for a
        downstream stage, {producer_stage_name: [chunk, ...]} of every upstream stage on
        the request's route (full delivery: all chunks of a finished producer).
    params: the stage's default params merged with the request's per-stage params.
    """

    request_id: str
    inputs: dict[str, Any]
    params: dict[str, Any] = field(default_factory=dict)


@dataclass
class StepOutput:
    """One request's new output from one engine step.

    data: a small msgpack-able dict (str/bytes/numbers/lists/dicts); heavy tensors go
        through a connector and ride here as PayloadRefs (Runtime core II).
    finished: the request is done at this stage (no more outputs will come).
    error: set when the request failed at this stage; implies finished.
    error_kind: whose fault the error is: ENGINE_FAULT (the API answers 500) or
        INPUT_FAULT (the request's input, which the client must fix: a 400).
    error_field: the input field at fault, named as the API's request names it (e.g.
        ``messages[0].content[1]``; the 400's ``param``), when one is (InputFieldError).
    """

    request_id: str
    data: dict[str, Any] | None = None
    finished: bool = False
    error: str | None = None
    error_kind: str = "engine"
    error_field: str | None = None


ENGINE_FAULT, INPUT_FAULT = "engine", "input"


class InputFieldError(ValueError):
    """A request's input refused for one field of it (a content part the model cannot
    use): ``field`` names it as the API's request does, ``messages[0].content[1]``, so the
    client's 400 says which (OpenAI's ``param``), as the API's own checks do."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


def input_error(field: str | None, message: str) -> ValueError:
    """The error refusing a request's input: an InputFieldError naming ``field`` when the
    input came in one the API knows (the 400's ``param``), else a plain ValueError (the
    input's fault all the same: a 400, with no param)."""
    return InputFieldError(field, message) if field else ValueError(message)


def naming_field(field: str, step: Callable[..., Any], *args: Any) -> Any:
    """step(*args), a ValueError it raises becoming an InputFieldError naming ``field``."""
    try:
        return step(*args)
    except InputFieldError:
        raise
    except ValueError as e:
        raise InputFieldError(field, str(e)) from None


def failed_output(request_id: str, exc: Exception) -> StepOutput:
    """The output of a request the engine could not take: a ValueError / TypeError while
    reading its inputs is the input's fault; any other exception is the engine's."""
    if isinstance(exc, InputFieldError):  # its message names the field: no class name
        return StepOutput(request_id, finished=True, error=str(exc), error_kind=INPUT_FAULT,
                          error_field=exc.field)
    kind = INPUT_FAULT if isinstance(exc, ValueError | TypeError) else ENGINE_FAULT
    return StepOutput(request_id, finished=True, error=f"{type(exc).__name__}: {exc}",
                      error_kind=kind)


class Engine(abc.ABC):
    """Continuous-batching compute for one stage replica."""

    @abc.abstractmethod
    def add(self, request: EngineRequest) -> None:
        """Admit a request; it joins the batch at the next step."""

    def append(self, request_id: str, producer: str, seq: int, data: dict[str, Any] | None,
               last: bool) -> None:
        """More input for a request fed by a ``stream`` edge from stage ``producer``.

        ``seq`` counts 0, 1, 2, ... per (request, producer); ``last`` marks the end of
        that producer's stream (``data`` may then be None). A request whose every stream
        producer has sent ``last`` has all of its input. An unknown ``request_id`` (one
        already aborted) is ignored; a gap or repeat in ``seq`` raises EngineError.
        Engines that take no stream input keep this default, which refuses it.
        """
        raise EngineError(f"this engine takes no stream input (from '{producer}')")

    def limit(self, limits: Mapping[str, int | None]) -> None:
        """Flow control from a ``stream`` edge with ``max_lead`` (omni/runtime/lead.py): request id
        -> the most outputs (tokens) it may have made so far, None lifting the limit. A
        request at its limit makes no more until raised; unknown ids are ignored. Advisory:
        an engine that cannot hold a request keeps this default and runs on."""
        return None

    @abc.abstractmethod
    def abort(self, request_ids: list[str]) -> None:
        """Drop requests now and free what they hold; unknown ids are ignored."""

    @abc.abstractmethod
    def has_work(self) -> bool:
        """True while any admitted request still needs a step."""

    @abc.abstractmethod
    def step(self) -> list[StepOutput]:
        """Advance every runnable request once; return their new outputs."""

    def largest_output_bytes(self) -> int:
        """The most tensor bytes one request's output may carry (0: small or unknown): the
        engine process sizes its payload arena to hold one (proc/main.py)."""
        return 0

    def gather_s(self) -> float:
        """While has_work(): seconds the next step may wait, the engine's only work a
        batch that gathers requests arriving together (the process loop waits on its
        socket meanwhile; a direct caller's step() runs the batch at once). Engines that
        never gather keep this default: step now."""
        return 0.0

    def end_session(self, session: str, op: str) -> bool:
        """Drop what the engine keeps for a session (requests name it in their ``session``
        param); op is why: close, reset or evict. False when it kept nothing. Engines that
        keep no per-session state keep this default."""
        return False

    def info(self) -> dict[str, Any]:
        """Capabilities and memory, sent to the orchestrator in READY."""
        return {}

    def stats(self) -> dict[str, Any]:
        """Queue length and state bytes, for /metrics and load balancing."""
        return {}

    def shutdown(self) -> None:
        """Release everything the engine holds. Called once, at exit."""
        return None


# -- what model adapters hand to engines (omni/models imports these, no engine module) --

@dataclass
class PromptLayout:
    """How a multimodal prompt differs from plain text (made by a model's media encoder)."""

    # (axes, prompt_len): rotary positions of the prompt tokens; float where the model
    # makes them fractional (e.g. a video's time axis), else any dtype
    rope: torch.Tensor
    rope_delta: float = 0  # after the prompt: rotary position = cache position + rope_delta
    visual_mask: torch.Tensor | None = None  # (prompt_len,) bool: tokens taking deepstack
    deepstack: list[torch.Tensor] | None = None  # per layer: (visual tokens, hidden)
    exports: dict[str, Any] = field(default_factory=dict)  # sent downstream with the prompt
    visual_before: list[int] = field(init=False, default_factory=list)

    def __post_init__(self) -> None:
        if self.visual_mask is not None:  # visual tokens before each prompt position
            import torch  # here: the contract module must not import torch for echo

            counts = torch.cumsum(self.visual_mask.long(), 0) - self.visual_mask.long()
            self.visual_before = counts.tolist()


@dataclass(eq=False)  # identity: jobs hold tensors, which do not compare to a bool
class DenoiseJob:
    """One request's denoising state. ``state`` is the denoiser's own (conditioning,
    image shapes, ...); the engine reads and writes only the fields named here."""

    request_id: str
    latents: torch.Tensor
    timesteps: torch.Tensor
    scheduler: Any  # a per-request copy: multistep schedulers keep history
    rows: int  # images or videos in this request (latents' batch dim)
    guided: bool  # classifier-free guidance: the model runs 2 * rows rows
    seed: int
    state: dict[str, Any] = field(default_factory=dict)
    step: int = 0
    arrival: float = field(default_factory=time.monotonic)
    started: float = 0.0
    # step cache
    last_output: torch.Tensor | None = None
    prev_latents: torch.Tensor | None = None
    change_since_run: float = 0.0
    skipped: int = 0
    preview_steps: tuple[int, ...] = ()
    cache_threshold: float = 0.0
    # more guidance rows per image in the same call (e.g. a perturbed-attention pass)
    extra_rows_per_image: int = 0

    @property
    def steps(self) -> int:
        return len(self.timesteps)

    @property
    def model_rows(self) -> int:
        return self.rows * ((2 if self.guided else 1) + self.extra_rows_per_image)

    def tensor_bytes(self) -> int:
        import torch

        held = [self.latents, self.last_output, self.prev_latents]
        held += [v for v in self.state.values() if isinstance(v, torch.Tensor)]
        return sum(t.numel() * t.element_size() for t in held if t is not None)


class Denoiser(Protocol):
    """What a model adapter provides to the diffusion engine."""

    output: str  # the modality it produces: "image" or "video"

    def plan(self, inputs: Mapping[str, Any], params: Mapping[str, Any]) -> Any:
        """Validate a request; ValueError says what is wrong. Cheap: no model calls."""

    def start(self, request_id: str, plan: Any) -> DenoiseJob:
        """Encode conditioning, draw the latents, set up the scheduler."""

    def group_key(self, job: DenoiseJob) -> Hashable:
        """Jobs with equal keys can share one transformer call."""

    def predict(self, jobs: list[DenoiseJob]) -> list[torch.Tensor]:
        """The guided model output for each job at its current timestep, ONE call."""

    def decode(self, jobs: list[DenoiseJob]) -> list[dict[str, Any]]:
        """Finished jobs' output fields (pixels as uint8 tensors), in one VAE call; the
        jobs' latents have equal shapes past the batch dim."""

    def info(self) -> dict[str, Any]:
        """Capabilities and limits for READY (tasks, sizes, steps)."""

    # optional: preview(job) -> dict, the current estimate of the final output's fields


@dataclass(eq=False)
class PolicyJob:
    """One observation's action chunk in the making (the policy engine's unit).

    The adapter fills ``inputs`` (its model inputs, until the prefix pass), ``state`` (the
    robot state as the model takes it) and ``actions`` (the noise x_1 drawn from the
    seed); its prefix pass sets ``prefix`` (whatever its per-step forward reads: a KV
    cache) and drops ``inputs``. The engine integrates ``actions`` from t = 1 to 0.
    """

    request_id: str
    inputs: dict[str, Any]
    state: torch.Tensor
    actions: torch.Tensor  # x_t, (1, horizon, width), the model's dtype
    steps: int
    seed: int
    prefix_key: Hashable  # jobs with equal keys share a prefix pass
    step_key: Hashable = None  # jobs with equal keys share a step (set by the prefix pass)
    prefix: Any = None
    session: str | None = None
    step: int = 0
    arrival: float = field(default_factory=time.monotonic)
    started: float = 0.0
    prepare_ms: float = 0.0  # the adapter's preprocessing (set by the engine)
    extra: dict[str, Any] = field(default_factory=dict)  # the adapter's own (action width)

    def tensor_bytes(self) -> int:
        import torch

        held = [self.state, self.actions, *self.inputs.values()]
        if isinstance(self.prefix, dict):
            held += list(self.prefix.values())
        total = 0
        for item in held:
            for t in item if isinstance(item, list | tuple) else (item,):
                if isinstance(t, torch.Tensor):
                    total += t.numel() * t.element_size()
        return total


class Policy(Protocol):
    """What a model adapter provides to the policy engine (engines/policy/engine.py):
    flow matching split so the engine runs the steps and batches them across robots."""

    def prepare(self, request_id: str, observation: Mapping[str, Any], seed: int,
                steps: int | None) -> PolicyJob:
        """Validate and preprocess one observation (ValueError says what is wrong); draw
        its noise from ``seed``. No model call."""

    def prefix(self, jobs: list[PolicyJob]) -> None:
        """ONE prefix pass (images + prompt + state -> what each step reads) for jobs of
        equal ``prefix_key``; sets each job's ``prefix`` and ``step_key``."""

    def velocity(self, jobs: list[PolicyJob], actions: torch.Tensor,
                 timesteps: torch.Tensor) -> torch.Tensor:
        """ONE forward(state, noise, timestep, cache) for jobs of equal ``step_key``:
        the flow's velocity at each job's own timestep, shaped like ``actions``."""

    def finish(self, job: PolicyJob) -> dict[str, Any]:
        """The finished chunk in robot units: {"actions": float32 (horizon, width)}."""

    # optional: timestep(job) -> float and advance(job, velocity) -> the next actions, for
    # a family whose schedule or integrator is not flow matching's Euler from t = 1 to 0;
    # idle(), called when no robot is stepping, frees what it keeps across steps

    def info(self) -> dict[str, Any]:
        """Capabilities for READY (horizon, action width, cameras, steps)."""
